from skyward.cli import main

raise SystemExit(main())
