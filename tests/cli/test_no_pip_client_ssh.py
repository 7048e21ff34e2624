"""SSH pools from a client environment with no pip in it, on real sshd hosts with no
route out: the nodes get their packages as wheels this machine fetches. The client is a venv made
with ``uv venv`` and ``uv pip install -e`` (tests/uvclient.py), as uv users make theirs; every
program and ``skyward`` command here runs with its python.

One program pool with ``Image(pip=[...])``, a named pool that ``skyward install`` adds a package
to and ``skyward reproduce`` starts again; and a private index configured only in uv's settings
(a project ``uv.toml``), whose package reaches the nodes."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvclient
from sshhosts import SSHHosts

from .conftest import CLI, Result, _reap
from .ssh_helpers import netns_hosts

sys.path.insert(0, str(Path(__file__).parents[1] / "record"))
from pkgindex import NAME, Index

pytestmark = pytest.mark.timeout(480)


class UvCLI(CLI):
    """``skyward`` and client programs run with the uv-made venv's python."""

    def __init__(self, root: Path, python: Path) -> None:
        super().__init__(root)
        self.uv_python = python
        self.env = uvclient.clean_env(SKYWARD_HOME=str(self.home), PYTHONUNBUFFERED="1")

    def __call__(self, *args: str, timeout: float = 90) -> Result:
        return self._run([str(self.uv_python), "-m", "skyward", *args], timeout)

    def python(self, source: str, timeout: float = 90) -> Result:
        return self._run([str(self.uv_python), "-c", textwrap.dedent(source)], timeout)


@pytest.fixture(scope="module")
def uv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uvclient.make(tmp_path_factory.mktemp("uv-client"))


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    with netns_hosts(2) as made:
        yield made


@pytest.fixture
def cli(tmp_path: Path, uv_python: Path) -> Iterator[UvCLI]:
    helper = UvCLI(tmp_path, uv_python)
    yield helper
    helper("down", "--all", "--force", timeout=180)
    left = helper.wait_no_processes(10)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    helper.seen.update(left)
    time.sleep(0.1)
    _reap(helper.seen)
    assert not left, f"processes left running after the test: {left}"


def ssh_provider(hosts: SSHHosts) -> str:
    targets = ", ".join(f"sky.SSHHost(address={h.address!r}, port={h.port}, user={h.user!r}, "
                        f"key={str(h.key_path)!r})" for h in hosts)
    return f"sky.SSH(hosts=[{targets}])"


def test_an_ssh_pool_install_and_reproduce_from_a_uv_environment_without_pip(cli: UvCLI, hosts: SSHHosts) -> None:
    # A program's pool: Image(pip=...) reaches both hosts from this pip-less client.
    ran = cli.python(f"""
        import json
        import skyward as sky

        @sky.function
        def six_version():
            import socket, six
            return [socket.gethostname(), six.__version__]

        with sky.Compute(provider={ssh_provider(hosts)}, nodes=2, image=sky.Image(pip=["six==1.16.0"]),
                         options=sky.Options(console="silent")) as pool:
            print(json.dumps(six_version() @ pool))
    """, timeout=300)
    assert ran.code == 0, ran
    assert json.loads(ran.out.strip().splitlines()[-1]) == [[h.name, "1.16.0"] for h in hosts]

    # A named pool, and a package added to it while it runs.
    targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
    cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 2\nttl = 300\n\n[pools.lab.image]\npip = ["six==1.16.0"]\n\n'
             f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n')
    up = cli("up", "lab", timeout=240)
    assert up.code == 0, up
    pool_id = cli.record("lab")["id"]
    done = cli("install", "lab", "tabulate", timeout=240)
    assert done.code == 0, done
    assert "tabulate==" in done.out, done
    probe = """
        import json
        import skyward as sky

        @sky.function
        def versions():
            import socket, six, tabulate
            return [socket.gethostname(), six.__version__, tabulate.__version__]

        with sky.Compute(name="{name}", options=sky.Options(console="silent")) as pool:
            print(json.dumps(versions() @ pool))
    """
    seen = cli.python(probe.format(name="lab"), timeout=120)
    assert seen.code == 0, seen
    installed = json.loads(seen.out.strip().splitlines()[-1])
    assert [s[:2] for s in installed] == [[h.name, "1.16.0"] for h in hosts]
    tabulate = installed[0][2]
    assert all(s[2] == tabulate for s in installed), installed
    assert cli("down", "lab", timeout=180).code == 0

    # Started again from its record: the same packages, the installed one included.
    again = cli("reproduce", pool_id, "--name", "copy", timeout=300)
    assert again.code == 0, again
    seen = cli.python(probe.format(name="copy"), timeout=120)
    assert seen.code == 0, seen
    assert [s[1:] for s in json.loads(seen.out.strip().splitlines()[-1])] == [["1.16.0", tabulate]] * 2
    assert cli("down", "copy", timeout=180).code == 0


def test_a_private_index_set_only_in_uv_settings_reaches_the_nodes(cli: UvCLI, hosts: SSHHosts,
                                                                  tmp_path: Path) -> None:
    index = Index(tmp_path / "index")
    index.publish("1.0")
    index.publish("2.0")
    url = index.serve("127.0.0.1")  # the client fetches: the hosts never reach it
    try:
        # Only uv knows of it: the project's uv.toml (pip's settings here do not name it).
        (cli.cwd / "uv.toml").write_text(f'[[index]]\nname = "private"\nurl = "{url}"\n')
        ran = cli.python(f"""
            import json
            import skyward as sky

            @sky.function
            def probe():
                import socket, {NAME}
                return [socket.gethostname(), {NAME}.VERSION]

            with sky.Compute(provider={ssh_provider(hosts)}, nodes=2, image=sky.Image(pip=["{NAME}"]),
                             options=sky.Options(console="silent")) as pool:
                print(json.dumps(probe() @ pool))
        """, timeout=300)
    finally:
        index.close()
    assert ran.code == 0, ran
    assert json.loads(ran.out.strip().splitlines()[-1]) == [[h.name, "2.0"] for h in hosts]
