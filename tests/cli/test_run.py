"""`skyward run NAME script.py [-- ARGS]` and `@sky.main`, against real named Local pools."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .conftest import CLI

TOML = """
[pools.runner]
provider = "local"
nodes = 2
ttl = 120
"""


def _script(cli: CLI, name: str, source: str) -> Path:
    path = cli.cwd / name
    path.write_text(textwrap.dedent(source))
    return path


def test_run_dispatches_with_the_pool_active_and_passes_args_and_exit_code(cli: CLI) -> None:
    cli.toml(TOML)
    assert cli("up", "runner").code == 0
    _script(cli, "job.py", """
        import sys
        import skyward as sky

        @sky.function
        def where(x):
            return sky.instance_info().node, x * 10

        print("argv", sys.argv[1:])
        print("one", where(4) >> sky)
        print("all", sorted(where(1) @ sky))
        sys.exit(int(sys.argv[-1]))
    """)
    r = cli("run", "runner", "job.py", "--", "--flag", "3")
    assert r.code == 3, r
    assert "argv ['--flag', '3']" in r.out
    assert "one (" in r.out and ", 40)" in r.out
    assert "all [(0, 10), (1, 10)]" in r.out
    # Attached, not owned: the pool still runs, and the trail says who used it.
    assert cli.record("runner")["state"] == "running"
    trail = cli("history", "runner", "--json").json()
    assert [e["event"] for e in trail][-2:] == ["attached", "detached"]


def test_a_sky_main_function_is_the_entry_point(cli: CLI) -> None:
    cli.toml(TOML)
    assert cli("up", "runner").code == 0
    _script(cli, "entry.py", """
        import skyward as sky

        @sky.function
        def double(x):
            return 2 * x

        @sky.main
        def main():
            print("mapped", sky.Compute and (double(21) >> sky))
            return 0

        print("top level ran first")
    """)
    r = cli("run", "runner", "entry.py")
    assert r.code == 0, r
    assert r.out.index("top level ran first") < r.out.index("mapped 42")
    _script(cli, "called.py", """
        import skyward as sky

        @sky.function
        def one():
            return 1

        @sky.main()
        def entry():
            return 5 if (one() >> sky) == 1 else 6
    """)
    assert cli("run", "runner", "called.py").code == 5  # an int the entry point returns is the exit code


def test_run_starts_a_pool_that_does_not_run_and_stops_it_after(cli: CLI) -> None:
    cli.toml(TOML)
    _script(cli, "boom.py", """
        import skyward as sky

        @sky.function
        def fail():
            raise ValueError("from the node")

        fail() >> sky
    """)
    r = cli("run", "runner", "boom.py")
    assert r.code == 1, r
    assert "ValueError: from the node" in r.err and "runscript.py" not in r.err
    assert not (cli.home / "registry" / "runner.json").exists()  # provisioned for the run, then destroyed
    events = [e["event"] for e in cli("history", "runner", "--json").json()]
    assert events[0] == "provisioned" and events[-1] == "destroyed"
    assert not [p for p in cli.processes()]


def test_run_explains_bad_input(cli: CLI) -> None:
    cli.toml(TOML)
    r = cli("run", "runner", "missing.py")
    assert r.code == 2 and "missing.py" in r.err and "not a file" in r.err
    r = cli("run", "Bad Name", "x.py")
    assert r.code == 2 and "not valid" in r.err
    _script(cli, "two.py", """
        import skyward as sky

        @sky.main
        def a(): ...

        @sky.main
        def b(): ...
    """)
    r = cli("run", "runner", "two.py")
    assert r.code == 2 and "one entry point" in r.err
