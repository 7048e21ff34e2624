"""The Local provider: environment, includes, overlay installs, working directories."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.providers.local_env import unsatisfied


@sky.function
def read_env(name: str) -> str | None:
    return os.environ.get(name)


@sky.function
def use_included() -> str:
    import shipped_mod  # type: ignore[import-not-found]

    return shipped_mod.VALUE


@sky.function
def import_version(module: str, dist: str) -> str:
    import importlib
    import importlib.metadata

    importlib.import_module(module)
    return importlib.metadata.version(dist)


def test_image_env_and_shell_vars() -> None:
    image = sky.Image(env={"GREETING": "hi"}, shell_vars={"COMPUTED": "echo $((6 * 7))"})
    with sky.Compute(nodes=2, image=image) as pool:
        assert read_env("GREETING") @ pool == ["hi", "hi"]
        assert read_env("COMPUTED") >> pool == "42"


def test_includes_are_importable_and_excludes_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    (src / "shipped_mod").mkdir(parents=True)
    (src / "shipped_mod" / "__init__.py").write_text("VALUE = 'shipped'\n")
    (src / "shipped_mod" / "secret.key").write_text("do not ship")
    monkeypatch.chdir(tmp_path)

    @sky.function
    def listing() -> list[str]:
        import shipped_mod  # type: ignore[import-not-found]

        return sorted(os.listdir(os.path.dirname(shipped_mod.__file__)))

    image = sky.Image(includes=["src/shipped_mod"], excludes=["*.key"])
    with sky.Compute(nodes=1, image=image) as pool:
        assert use_included() >> pool == "shipped"
        assert "secret.key" not in listing() >> pool


def test_missing_include_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sky.ConfigError, match="does not exist"), sky.Compute(image=sky.Image(includes=["nope"])):
        pass


def test_unsatisfied_requirements() -> None:
    assert unsatisfied(("cloudpickle", "lz4>=1")) == []
    assert unsatisfied(("cloudpickle<1",)) == ["cloudpickle<1"]
    assert unsatisfied(("surely-not-installed-pkg-xyz",)) == ["surely-not-installed-pkg-xyz"]
    with pytest.raises(sky.ConfigError, match="not a valid requirement"):
        unsatisfied(("numpy>>>1",))


@pytest.mark.network
def test_pip_overlay_installs_missing_package_once(skyward_home: Path) -> None:
    image = sky.Image(pip=["tomli-w==1.0.0"])
    with sky.Compute(nodes=2, image=image) as pool:
        assert import_version("tomli_w", "tomli-w") @ pool == ["1.0.0", "1.0.0"]
    overlays = list((skyward_home / "cache" / "local-overlays").glob("*/.complete"))
    assert len(overlays) == 1
    stamp = overlays[0].stat().st_mtime
    with sky.Compute(nodes=1, image=image) as pool:  # cached: not rebuilt
        assert import_version("tomli_w", "tomli-w") >> pool == "1.0.0"
    assert overlays[0].stat().st_mtime == stamp


@pytest.mark.network
def test_bad_requirement_fails_with_uv_output() -> None:
    image = sky.Image(pip=["surely-not-a-real-package-skyward-xyz==9.9"])
    with pytest.raises(sky.ProviderError, match="uv exit code"), sky.Compute(image=image):
        pass


def test_nodes_share_the_client_interpreter(pool: sky.Pool) -> None:
    exe = sky.function(lambda: sys.executable)
    assert exe() @ pool == [sys.executable, sys.executable]


def test_session_manages_several_pools() -> None:
    with sky.Session() as session:
        a = session.compute(nodes=1)
        b = session.compute(nodes=2)
        assert read_env("SKYWARD_HOME") >> a == os.environ["SKYWARD_HOME"]
        assert b.current_nodes() == 2
    with pytest.raises(sky.PoolClosedError):
        read_env("X") >> a


def test_multi_spec_selection_first_viable() -> None:
    impossible = sky.Spec(accelerator=sky.accelerators.H100(count=8))
    fine = sky.Spec(nodes=1)
    with sky.Compute(impossible, fine, options=sky.Options(selection="first")) as pool:
        assert pool.current_nodes() == 1
    with sky.Compute(impossible, fine) as pool:  # cheapest viable
        assert pool.current_nodes() == 1


def test_failed_start_leaves_no_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import pool_dirs

    before = pool_dirs()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sky.ConfigError), sky.Compute(image=sky.Image(includes=["missing"])):
        pass
    assert pool_dirs() == before


def test_agents_start_before_the_pool_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """sky.Compute starts a plain Local pool's agents first (provider.launch), and the pool
    connects to those very processes instead of starting others."""
    from skyward.providers.local import LocalCluster

    launched: list[int] = []
    original = LocalCluster.launch

    def spy(self: LocalCluster, count: int) -> None:
        original(self, count)
        launched.extend(proc.pid for _, proc in self._launched)

    monkeypatch.setattr(LocalCluster, "launch", spy)
    with sky.Compute(nodes=2) as pool:
        assert sorted(read_env("SKYWARD_AGENT_PID") @ pool) == sorted(map(str, launched))
        assert len(launched) == 2
    # Not for what has steps of its own (they report in the pool's order) or a pool born asleep.
    local = sky.Local()
    for spec in (sky.Spec(provider=local, nodes=(0, 2)), sky.Spec(provider=local, image=sky.Image(pip=["six"])),
                 sky.Spec(provider=local, plugins=[sky.plugins.joblib()])):
        assert local.launch(spec, "nolaunch") is None


def test_a_pool_that_fails_before_taking_its_launched_agents_stops_them(tmp_path: Path) -> None:
    from conftest import alive

    started: list[int] = []
    made: list[Path] = []  # this pool's folders (other pools' may come and go meanwhile)
    from skyward.providers.local import LocalCluster

    original = LocalCluster.launch

    def spy(self: LocalCluster, count: int) -> None:
        original(self, count)
        started.extend(proc.pid for _, proc in self._launched)
        made.extend(p for p in (self._root, self.spill_dir) if p is not None)

    blocked = tmp_path / "file"
    blocked.write_text("")  # a log file under a file: the pool refuses it before taking its nodes
    bad_log = sky.LogConfig(file=str(blocked / "skyward.log"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(LocalCluster, "launch", spy)
        with pytest.raises(sky.ConfigError), sky.Compute(nodes=2, options=sky.Options(logging=bad_log)):
            pass
    assert len(started) == 2
    assert not [pid for pid in started if alive(pid)]
    assert made and not [p for p in made if p.exists()], made


@sky.function
def serve_upper() -> dict[str, object]:
    """A server on the node's loopback and on a Unix socket there, in the worker (its threads
    outlive the task): each connection gets what it sent, upper-cased."""
    import os
    import socket
    import tempfile
    import threading

    def serve(listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                conn.sendall(data.upper())

    tcp = socket.create_server(("127.0.0.1", 0))
    path = os.path.join(tempfile.mkdtemp(), "upper.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    unix.listen()
    for listener in (tcp, unix):
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    return {"port": tcp.getsockname()[1], "socket": path, "node": sky.instance_info().node}


def _ask(stream: Any, data: bytes) -> bytes:
    try:
        stream.sendall(data)
        stream.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := stream.recv(65536):
            answer += chunk
        return answer
    finally:
        stream.close()


def test_a_local_node_is_reached_here_a_stream_to_its_port_or_socket_and_a_shell() -> None:
    from skyward.providers.base import HereShell

    with sky.Compute(nodes=1) as pool:
        where = serve_upper() >> pool
        try:
            assert _ask(pool.cluster.open_stream(0, int(where["port"])), b"to the port") == b"TO THE PORT"  # type: ignore[call-overload]
            assert _ask(pool.cluster.open_stream(0, str(where["socket"])), b"to the socket") == b"TO THE SOCKET"
            assert isinstance(pool.cluster.shell(0), HereShell)
        finally:  # (the node made the socket's folder on this machine)
            shutil.rmtree(os.path.dirname(str(where["socket"])), ignore_errors=True)
