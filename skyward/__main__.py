from skyward.named.cli import main

raise SystemExit(main())
