"""Remote exceptions keep their type; what cannot be pickled is named."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import helpers
import pytest

import skyward as sky


@sky.function
def raise_builtin() -> None:
    raise KeyError("missing-key")


@sky.function
def raise_custom() -> None:
    raise helpers.CustomError("custom failure", code=7)


@sky.function
def return_lock() -> object:
    return threading.Lock()


@sky.function
def identity(x: object) -> object:
    return x


class Unrebuildable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickles, but cannot be rebuilt from args
        super().__init__(f"{a}-{b}")


@sky.function
def raise_unrebuildable() -> None:
    raise Unrebuildable(1, 2)


def test_builtin_exception_type_and_remote_traceback(pool: sky.Pool) -> None:
    with pytest.raises(KeyError, match="missing-key") as info:
        raise_builtin() >> pool
    assert isinstance(info.value.__cause__, sky.errors.RemoteTraceback)
    assert "raise_builtin" in info.value.__cause__.text


def test_user_defined_exception_type(pool: sky.Pool) -> None:
    with pytest.raises(helpers.CustomError) as info:
        raise_custom() >> pool
    assert info.value.code == 7


def test_exception_that_cannot_be_rebuilt_becomes_remote_error(pool: sky.Pool) -> None:
    with pytest.raises(sky.RemoteError, match="Unrebuildable: 1-2"):
        raise_unrebuildable() >> pool


def test_unpicklable_argument_is_named(pool: sky.Pool) -> None:
    with pytest.raises(sky.SerializationError, match=r"positional argument 0 .*lock"):
        identity(threading.Lock()) >> pool
    with pytest.raises(sky.SerializationError, match="keyword argument 'x'"):
        identity(x=threading.Lock()) >> pool
    assert identity(5) >> pool == 5  # the pool is fine


def test_unpicklable_return_value(pool: sky.Pool) -> None:
    with pytest.raises(sky.SerializationError, match="returned a lock"):
        return_lock() >> pool
    assert identity(1) >> pool == 1


def test_exception_defined_in_main_keeps_its_type(tmp_path) -> None:
    script = tmp_path / "main_exc.py"
    script.write_text(textwrap.dedent("""
        import skyward as sky

        class MainError(Exception):
            pass

        @sky.function
        def boom():
            raise MainError("from main")

        with sky.Compute(nodes=1) as pool:
            try:
                boom() >> pool
            except MainError as exc:
                print("caught", type(exc).__module__, exc)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "caught __main__ from main" in out.stdout
