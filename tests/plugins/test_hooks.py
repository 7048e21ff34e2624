"""Every hook's timing and order, on real Local pools."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import skyward as sky
from skyward.plugins import LaunchCommand, Plugin

QUIET = sky.Options(console="silent")


def _log(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def recorder(name: str, path: Path, client: list[str]) -> Plugin:
    def transform(image, cluster):
        order = image.env.get("ORDER", "")
        return replace(image, env={**image.env, "ORDER": f"{order},{name}".strip(",")})

    def bootstrap(cluster):
        return (f"echo op-{name} >> {path}",)

    @contextlib.contextmanager
    def around_client(pool, cluster):
        client.append(f"enter-{name}-{threading.get_ident()}")
        yield
        client.append(f"exit-{name}")

    @contextlib.contextmanager
    def around_app(info):
        _log(path, f"app-enter-{name}-{info.node}-{os.getpid()}")
        yield
        _log(path, f"app-exit-{name}-{info.node}-{os.getpid()}")

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            trace = kwargs.setdefault("trace", [])
            trace.append(f"{name}-in")
            out = fn(*args, **kwargs)
            trace.append(f"{name}-out")
            return out
        return wrapper

    return (Plugin.create(name).with_image_transform(transform).with_bootstrap(bootstrap)
            .with_around_client(around_client).with_around_app(around_app).with_decorator(decorate))


@sky.function
def traced(trace=None):
    trace.append("fn")
    return os.environ["ORDER"], trace, os.getpid()


def mapped(_item, trace=None):
    return traced.fn(trace=trace)


def test_hook_timing_and_order(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    client: list[str] = []
    plugins = [recorder("a", path, client), recorder("b", path, client)]
    with sky.Compute(nodes=2, plugins=plugins, options=QUIET) as pool:
        me = threading.get_ident()
        assert client == [f"enter-a-{me}", f"enter-b-{me}"]  # in order, in this thread
        assert path.read_text().split() == ["op-a", "op-b"]  # ops in order, before the nodes
        # around_app runs on EVERY node as its worker starts, not on its first task
        # (rendezvous hooks need every rank): node 1 gets no task and still enters.
        pool.run(traced(), target=0)
        deadline = time.monotonic() + 10
        while len(path.read_text().split()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = path.read_text().split()
        assert sorted(line.rsplit("-", 1)[0] for line in lines[2:]) == [
            "app-enter-a-0", "app-enter-a-1", "app-enter-b-0", "app-enter-b-1"]
        results = [traced() >> pool for _ in range(12)] + pool.map(mapped, range(8))
        order, trace, _ = results[0]
        assert order == "a,b"  # transforms chained in plugin order
        assert trace == ["a-in", "b-in", "fn", "b-out", "a-out"]  # the first plugin is outermost
        assert len({pid for _, _, pid in results}) == 2
        assert len(path.read_text().split()) == 6  # around_app once per worker, not per task
    assert client[2:] == ["exit-b", "exit-a"]  # around_client exits in reverse
    exits = [line for line in path.read_text().split() if "exit" in line]
    for node in ("0", "1"):
        mine = [e.rsplit("-", 2)[0] for e in exits if e.rsplit("-", 2)[1] == node]
        assert mine == ["app-exit-b", "app-exit-a"]  # around_app exits in reverse


def test_around_process_once_per_process_on_first_task(tmp_path: Path) -> None:
    path = tmp_path / "proc.txt"

    @contextlib.contextmanager
    def around_process(info):
        _log(path, f"proc-{info.worker}-{os.getpid()}")
        yield

    plugin = sky.plugins.around_process("p", around_process)
    worker = sky.Worker(concurrency=2, executor="process")
    with sky.Compute(nodes=1, worker=worker, plugins=[plugin], options=QUIET) as pool:
        assert not path.exists()  # lazy: nothing before the first task
        pids = set(pool.map(lambda _: os.getpid(), range(40), chunksize=1))
    lines = path.read_text().split()
    assert len(lines) == len(pids) == len(set(lines))
    assert {int(line.rsplit("-", 1)[1]) for line in lines} == pids


def test_failing_around_app_fails_tasks_with_plugin_error() -> None:
    @contextlib.contextmanager
    def broken(info):
        raise RuntimeError("no framework here")
        yield

    plugins = [sky.plugins.around_app("broken", broken)]
    with sky.Compute(nodes=1, plugins=plugins, options=QUIET) as pool, pytest.raises(
            sky.PluginError, match=r"'broken'.*around_app.*no framework here"):
        traced() >> pool


def test_failing_around_client_closes_the_pool() -> None:
    def broken(pool, cluster):
        raise RuntimeError("cannot register")

    with pytest.raises(sky.PluginError, match="around_client"), sky.Compute(
            nodes=1, plugins=[sky.plugins.around_client("x", broken)], options=QUIET):
        pass


def test_launcher_wraps_the_worker_command() -> None:
    seen = []

    def launcher(cmd: LaunchCommand, ctx) -> LaunchCommand:
        seen.append(ctx)  # runs on the node: this list stays empty here
        return replace(cmd, launcher=f"env SKYWARD_LAUNCHED={ctx.node_id}/{ctx.num_nodes}")

    @sky.function
    def launched():
        return os.environ.get("SKYWARD_LAUNCHED")

    plugin = Plugin.create("wrap").with_launcher(launcher)
    with sky.Compute(nodes=2, plugins=[plugin], options=QUIET) as pool:
        assert sorted(launched() @ pool) == ["0/2", "1/2"]
        assert pool.map(lambda x: x * 2, range(10)) == [x * 2 for x in range(10)]
    assert seen == []


def test_a_launcher_leaves_no_socket_folder_behind() -> None:
    @sky.function
    def launch_folders() -> list[str]:
        import glob
        import tempfile

        # This node's own folders (named by its agent's pid), not every skyward-launch-* of the
        # machine: another run's pools may have theirs open right now.
        agent = os.environ["SKYWARD_AGENT_PID"]
        return glob.glob(os.path.join(tempfile.gettempdir(), f"skyward-launch-{agent}-*"))

    plugin = Plugin.create("wrap").with_launcher(lambda cmd, ctx: replace(cmd, launcher="env"))
    with sky.Compute(nodes=2, plugins=[plugin], options=QUIET) as pool:
        seen = launch_folders() @ pool
    folders = {f for node in seen for f in node}
    assert len(folders) == 2 and all("skyward-launch-" in f for f in folders)  # one per node
    assert [f for f in folders if Path(f).exists()] == []


def test_launch_command_render() -> None:
    cmd = LaunchCommand(launcher="accelerate launch --num_machines 2", entrypoint="-m pkg.mod",
                        args=("--name", "a b"))
    assert cmd.render() == "accelerate launch --num_machines 2 -m pkg.mod --name 'a b'"
    assert LaunchCommand(entrypoint="python x.py").render() == "python x.py"


def test_plugins_must_be_plugins() -> None:
    with pytest.raises(sky.ConfigError, match=r"sky\.plugins\.torch\(\)"):
        sky.Compute(plugins=["torch"]).open()
    with pytest.raises(sky.ConfigError, match="Call the factory"):
        sky.Compute(plugins=[sky.plugins.torch]).open()
    with pytest.raises(sky.ConfigError, match="not callable"):
        Plugin("x", decorate=3)  # type: ignore[arg-type]
