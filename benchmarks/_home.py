"""A SKYWARD_HOME of its own for a benchmark run (its records, trails and logs stay apart from
the user's), removed when the run ends; a SKYWARD_HOME already set is used as it is."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any


def scratch_home() -> None:
    if os.environ.get("SKYWARD_HOME"):
        return
    home = tempfile.mkdtemp(prefix="skyward-bench-home-")
    os.environ["SKYWARD_HOME"] = home
    atexit.register(shutil.rmtree, home, True)


def bytecode_env(prefix: str) -> dict[str, str]:
    """This environment for the interpreters a benchmark starts, with compiled bytecode as an
    installed package has it: a .pyc cache folder of the run's (PYTHONPYCACHEPREFIX, written even
    where PYTHONDONTWRITEBYTECODE is set here), removed when the run ends. The first interpreter
    of each program fills it; run one untimed."""
    cache = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, cache, True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def count_packets() -> list[int]:
    """[SSH packets the client has sent and read since]: each one costs the client's interpreter
    its encryption or decryption and handling (paramiko's Packetizer, counted from here on)."""
    from paramiko.packet import Packetizer

    counter = [0]
    send, read = Packetizer.send_message, Packetizer.read_message

    def sent(self: Any, *args: Any) -> Any:
        counter[0] += 1
        return send(self, *args)

    def got(self: Any) -> Any:
        counter[0] += 1
        return read(self)

    Packetizer.send_message, Packetizer.read_message = sent, got
    return counter
