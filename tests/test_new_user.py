"""What a new user hits first: the hidden task time limit, a @sky.function called
where it cannot dispatch, an undecorated function pushed at a pool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import skyward as sky

QUIET = sky.Options(console="silent")


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with sky.Compute(nodes=1, options=QUIET) as p:
        yield p


@sky.function
def double(x: int) -> int:
    return 2 * x


@sky.function
def double_plus_one(x: int) -> int:
    return double(x) + 1  # a @sky.function called inside a task: it runs, here on the node


def plain(x: int) -> int:
    return x


# -- item 5: no hidden limit ----------------------------------------------------------------------
def test_tasks_have_no_time_limit_unless_asked() -> None:
    # A long training step without timeout= is a function call that takes long, not an error.
    assert sky.Options().default_compute_timeout is None
    assert double(1).timeout is None
    assert sky.function(timeout=5)(plain)(1).timeout == 5.0


# -- item 6: a pending call used where a value was meant ------------------------------------------
def test_a_function_called_inside_a_task_runs_there(pool: sky.Pool) -> None:
    assert double_plus_one(3) >> pool == 7
    assert pool.map(double_plus_one, [1, 2]) == [3, 5]


@pytest.mark.parametrize("use", [
    lambda p: p + 1,
    lambda p: 1 + p,
    lambda p: p * 2,
    lambda p: p[0],
    lambda p: list(p),
    lambda p: len(p),
    lambda p: int(p),
    lambda p: float(p),
])
def test_a_pending_call_used_as_a_value_says_how_to_run_it(use: Any) -> None:
    with pytest.raises(TypeError, match=r">> pool") as info:
        use(double(3))
    assert isinstance(info.value, sky.DispatchError)
    assert "double.local(" in str(info.value) and "not run" in str(info.value)


def test_an_attribute_of_a_pending_call_says_how_to_run_it() -> None:
    with pytest.raises(AttributeError, match=r">> pool") as info:
        double(3).shape  # noqa: B018
    assert "double.local(" in str(info.value)
    assert not hasattr(double(3), "__array_interface__")  # probes still get a plain "no"


def test_local_runs_here() -> None:
    assert double.local(4) == 8
    assert "double.local(" in repr(double(4)) and ">> pool" in repr(double(4))


@pytest.mark.parametrize("op", [">>", "@", ">"])
def test_an_undecorated_function_pushed_at_a_pool_hints_at_sky_function(pool: sky.Pool, op: str) -> None:
    dispatch = {">>": lambda v, t: v >> t, "@": lambda v, t: v @ t, ">": lambda v, t: v > t}[op]
    with pytest.raises(sky.DispatchError, match=r"@sky\.function") as info:
        dispatch(plain(1), pool)
    assert "int" in str(info.value) and op in str(info.value)
    with pytest.raises(sky.DispatchError, match=r"@sky\.function"):
        dispatch(plain(1), sky)  # `>> sky` too


# -- item 10: the console's lines of a batch come before the call returns -------------------------
def test_batch_lines_are_printed_before_map_and_gather_return(tmp_path: Any) -> None:
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import skyward as sky

        def slow_subscriber(event):  # delays every view of the event stream a little
            if isinstance(event, sky.BatchFinished):
                time.sleep(0.3)

        sky.subscribe(slow_subscriber)
        square = sky.function(lambda x: x * x)
        with sky.Compute(nodes=1, options=sky.Options(console="log")) as pool:
            pool.map(square, range(4))
            print("MAP RETURNED", file=sys.stderr, flush=True)
            sky.gather(square(1), square(2)) >> pool
            print("GATHER RETURNED", file=sys.stderr, flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    at = {key: next(i for i, line in enumerate(lines) if key in line)
          for key in ("map <lambda>: done", "MAP RETURNED", "gather <lambda>: done", "GATHER RETURNED")}
    assert at["map <lambda>: done"] < at["MAP RETURNED"] < at["gather <lambda>: done"] < at["GATHER RETURNED"], lines


# -- item 7: a package version that differs between this machine and the nodes --------------------
def test_a_package_whose_version_differs_on_the_nodes_is_named_at_start(tmp_path: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    import logging
    from importlib.metadata import version

    # The node's environment gets a cloudpickle 0.0.1 in front of the real one (as a pinned
    # Image(pip=[...]) would install it): its metadata is what a node reports.
    fake = tmp_path / "cloudpickle-0.0.1.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: cloudpickle\nVersion: 0.0.1\n")
    options = sky.Options(console="silent", logging=False)
    with caplog.at_level(logging.WARNING, logger="skyward"), \
            sky.Compute(nodes=1, image=sky.Image(includes=[str(fake)]), options=options) as pool:
        assert double(2) >> pool == 4  # it may still work; the warning says where to look
    said = [r.getMessage() for r in caplog.records if "cloudpickle" in r.getMessage()]
    assert len(said) == 1, said
    assert "0.0.1" in said[0] and version("cloudpickle") in said[0] and "node 0" in said[0], said


def test_no_version_warning_when_the_nodes_match(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.WARNING, logger="skyward"), \
            sky.Compute(nodes=1, options=sky.Options(console="silent", logging=False)) as pool:
        assert double(2) >> pool == 4
    assert not [r for r in caplog.records if "version" in r.getMessage()], caplog.records
