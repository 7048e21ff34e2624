"""sky.plugins.mlflow against a real ``mlflow server`` (file store, loopback), and
sky.plugins.wandb in offline mode. Real Local pools; the trackers' own clients read
back what the nodes wrote."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port

import skyward as sky


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """``mlflow server`` with a file store on loopback; stopped and waited for whatever happens."""
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    if mlflow_bin is None:
        pytest.skip("the mlflow server is not installed (pip install mlflow)")
    port = free_port()
    log = (folder / "server.log").open("w")
    # One worker: the server's default forks several, a lot for a 2-core machine.
    proc = subprocess.Popen(
        [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"file://{folder / 'store'}", "--default-artifact-root", str(folder / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"})  # MLflow 3 asks for this to keep a file store
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("mlflow server did not start:\n" + (folder / "server.log").read_text()[-3000:])
            time.sleep(0.3)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)  # the server and the workers it forked
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@sky.function
def train(steps: int) -> int:
    import mlflow

    node = sky.instance_info().node
    for step in range(steps):
        mlflow.log_metric("loss", 1.0 / (step + 1 + node), step=step)
    return node


def test_mlflow_parent_run_child_run_per_node_and_metrics_from_tasks(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlf-secret-token-1234")
    with mlflow_server(tmp_path) as url:
        plugin = sky.plugins.mlflow(experiment="skyward-test", tracking_uri=url)
        with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
            assert sorted(train(3) @ pool) == [0, 1]
        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("skyward-test")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        (parent,) = [r for r in runs if r.data.tags.get("skyward.role") == "pool"]
        children = [r for r in runs if r.data.tags.get("skyward.role") == "node"]
        assert parent.info.status == "FINISHED" and parent.data.tags["skyward.pool.id"] == pool.id
        assert parent.data.tags["mlflow.runName"] == f"pool {pool.id}"
        assert parent.data.tags["skyward.provider"] == "local" and parent.data.tags["skyward.nodes"] == "2"
        assert len(children) == 2
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
        assert sorted(c.data.tags["skyward.rank"] for c in children) == ["0", "1"]
        assert all(c.data.tags["skyward.host"] and c.info.status == "FINISHED" for c in children)
        assert all("skyward.accelerator" in c.data.tags for c in children)
        # The metric each task logged is in its node's run, every step of it.
        for child in children:
            node = int(child.data.tags["skyward.node"])
            history = client.get_metric_history(child.info.run_id, "loss")
            assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
                (s, 1.0 / (s + 1 + node)) for s in range(3)]
        # The pool's spec and lock are artifacts of the parent run; the token is in neither.
        names = {a.path for a in client.list_artifacts(parent.info.run_id, "skyward")}
        assert names == {"skyward/spec.json", "skyward/lock.json"}
        local = client.download_artifacts(parent.info.run_id, "skyward", str(tmp_path / "got"))
        spec = (Path(local) / "spec.json").read_text()
        assert json.loads(spec) and "mlf-secret-token-1234" not in spec
        assert "mlf-secret-token-1234" not in (Path(local) / "lock.json").read_text()



@sky.function
def train_and_note(steps: int) -> int:
    import mlflow

    for step in range(steps):
        mlflow.log_metric("loss", 1.0 / (step + 1 + sky.instance_info().node), step=step)
    mlflow.log_text(f"node {sky.instance_info().node}", "notes/node.txt")
    return sky.instance_info().node


def _check_store(uri: str, exit_status: str = "FINISHED") -> list[Any]:
    """The pool's parent run and its two children in the store at ``uri``, every metric step
    and the note each task logged there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("skyward-test")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("skyward.role") == "pool"]
    children = [r for r in runs if r.data.tags.get("skyward.role") == "node"]
    assert parent.info.status == exit_status and len(children) == 2, runs
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    for child in children:
        node = int(child.data.tags["skyward.node"])
        assert child.info.status == exit_status and child.info.run_name == f"node {node}"
        history = client.get_metric_history(child.info.run_id, "loss")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
            (st, 1.0 / (st + 1 + node)) for st in range(2)]
        with tempfile.TemporaryDirectory() as into:  # (without a folder, MLflow makes one in /tmp)
            got = client.download_artifacts(child.info.run_id, "notes/node.txt", into)
            assert Path(got).read_text() == f"node {node}"
    return children


def test_mlflow_relative_file_store_is_the_clients_and_outlives_the_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLFLOW_TRACKING_URI=file:./mlruns is resolved here: the Local nodes' child
    runs land in this directory's mlruns, not in their own folders (removed with the pool)."""
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    plugin = sky.plugins.mlflow(experiment="skyward-test")
    with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(train_and_note(2) @ pool) == [0, 1]
        nodes_root = Path(pool.cluster.describe()["root"])
    assert not nodes_root.exists()
    _check_store((tmp_path / "mlruns").as_uri())


def test_mlflow_runs_of_nodes_away_from_a_store_here_come_back_into_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Nodes that are not this machine cannot write to a store on it: each keeps its
    child run in a file store in its own folder, which comes back as the block ends (the copy
    of `skyward cp`, here from Local nodes made to act as remote ones) and is copied into the
    pool's store: metrics, the note, status FAILED when the block raised."""
    pytest.importorskip("mlflow")
    from skyward.plugins import trackers

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setattr(trackers, "_mlflow_here", lambda cluster: False)
    plugin = sky.plugins.mlflow(experiment="skyward-test")
    with pytest.raises(RuntimeError, match="the block failed"), \
            sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(train_and_note(2) @ pool) == [0, 1]
        nodes_root = Path(pool.cluster.describe()["root"])
        assert len(list(nodes_root.glob("node-*/mlruns/0/*/meta.yaml"))) == 2  # kept on the nodes
        raise RuntimeError("the block failed")
    assert not nodes_root.exists()
    children = _check_store((tmp_path / "mlruns").as_uri(), exit_status="FAILED")
    assert all(str(nodes_root) not in str(c.info.artifact_uri) for c in children)
    assert "2 child run(s) the nodes kept were brought back" in capfd.readouterr().err



def test_mlflow_stores_on_this_machine_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a node would read from its own folder is resolved here; servers and
    Databricks are left alone."""
    from skyward.plugins.trackers import _local_store

    monkeypatch.chdir(tmp_path)
    here = (tmp_path / "mlruns").as_uri()
    assert [_local_store(u) for u in ("mlruns", "./mlruns", "file:./mlruns", "file:mlruns")] == [here] * 4
    assert _local_store("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    for kept in ("file:///data/mlruns", "sqlite:////data/mlflow.db"):
        assert _local_store(kept) == kept
    for server in ("http://mlflow:5000", "https://x/y", "databricks", "databricks://profile", "postgresql://h/db"):
        assert _local_store(server) is None


def test_mlflow_credentials_travel_as_secrets() -> None:
    from skyward.observe.secrets import Secret
    from skyward.plugins.trackers import _with

    os.environ["MLFLOW_TRACKING_PASSWORD"] = "pw-not-to-show"
    try:
        image = _with(sky.Image(), "mlflow-skinny", {"A": "b"}, ("MLFLOW_TRACKING_PASSWORD",))
    finally:
        del os.environ["MLFLOW_TRACKING_PASSWORD"]
    assert isinstance(image.env["MLFLOW_TRACKING_PASSWORD"], Secret) and "mlflow-skinny" in image.pip
    assert "pw-not-to-show" not in repr(image)


@sky.function
def fit(steps: int) -> int:
    import wandb

    for step in range(steps):
        wandb.log({"loss": 1.0 / (step + 1)}, step=step)
    return sky.instance_info().node


def test_wandb_offline_writes_a_run_per_node_in_the_pools_group(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    plugin = sky.plugins.wandb(project="skyward-test", mode="offline", dir=str(tmp_path / "runs"))
    staging = set(Path(tempfile.gettempdir()).glob("tmp*wandb-*"))  # (this process's own are there)
    with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(fit(3) @ pool) == [0, 1]
        pool_id = pool.id
    # The workers' W&B staging folders went with them (W&B removes them only at interpreter exit,
    # which a worker does not reach).
    deadline = time.monotonic() + 10
    while (left := set(Path(tempfile.gettempdir()).glob("tmp*wandb-*")) - staging) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, sorted(left)
    # Both nodes' runs where W&B puts them for dir= (<dir>/wandb/), no node-N folders.
    found = sorted((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    assert len(found) == 2, found
    runs = {}
    for folder in found:
        (data,) = folder.glob("run-*.wandb")
        meta = _read_run(data)
        runs[int(meta["config"]["rank"])] = folder  # type: ignore[index]
    assert sorted(runs) == [0, 1]
    for node, folder in runs.items():
        (data,) = folder.glob("run-*.wandb")
        assert data.stat().st_size > 0
        meta = _read_run(data)
        assert meta["exit"] == 0  # finished before the pool closed
        config = meta["config"]
        assert isinstance(config, dict)
        assert config["rank"] == node and config["provider"] == "local" and config["nodes"] == 2
        assert meta["group"] == f"skyward-{pool_id}" and meta["job_type"] == "node"
        assert meta["name"] == f"node {node}" and meta["losses"] == [1.0, 0.5, 1.0 / 3]
        assert "0123456789abcdef0123456789abcdef01234567" not in data.read_bytes().decode("latin-1")



def _offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own variable, set here: the nodes honour it
    for name in ("WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def _finished_runs(home: Path, exit_code: int = 0) -> list[Path]:
    """The two nodes' offline runs in ``home``, each finished with ``exit_code`` and holding
    what its task logged."""
    found = sorted(home.glob("offline-run-*"))
    assert len(found) == 2, found
    ranks = []
    for folder in found:
        (data,) = folder.glob("run-*.wandb")
        meta = _read_run(data)
        assert meta["exit"] == exit_code and meta["losses"] == [1.0, 0.5], meta
        ranks.append(meta["config"]["rank"])  # type: ignore[index]
    assert sorted(ranks) == [0, 1]
    return found


def _sync_line(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.startswith("skyward: W&B:")]
    return line


def test_wandb_offline_runs_of_local_nodes_outlive_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    """No dir=, WANDB_DIR set here: the runs are in $WANDB_DIR/wandb once the pool
    has closed (they were in the nodes' folders, removed with the pool); without WANDB_DIR in
    ./wandb, as W&B itself does. A line names them and gives the `wandb sync` command."""
    _offline_wandb(monkeypatch)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wd"))
    plugin = sky.plugins.wandb(project="skyward-test")
    with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(fit(2) @ pool) == [0, 1]
        nodes_root = Path(pool.cluster.describe()["root"])
    assert not nodes_root.exists()
    found = _finished_runs(tmp_path / "wd" / "wandb")
    line = _sync_line(capfd.readouterr().err)
    assert "wandb sync " + " ".join(str(f) for f in found) in line, line

    monkeypatch.delenv("WANDB_DIR")
    monkeypatch.chdir(tmp_path)
    with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(fit(2) @ pool) == [0, 1]
    found = _finished_runs(tmp_path / "wandb")
    assert "wandb sync " + " ".join(f"wandb/{f.name}" for f in found) in _sync_line(capfd.readouterr().err)


def test_wandb_offline_runs_written_on_the_nodes_come_back_before_they_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Nodes that are not this machine write their runs in their own folder, removed
    with the pool; the offline runs come back here first (the copy of `skyward cp`, here from
    Local nodes made to act as remote ones), finished, with exit code 1 when the block raised."""
    from skyward.plugins import trackers

    _offline_wandb(monkeypatch)
    monkeypatch.setattr(trackers, "_wandb_places",
                        lambda cluster, dir: {"node_dir": None, "back_to": str(tmp_path / "back")})
    plugin = sky.plugins.wandb(project="skyward-test")
    with pytest.raises(RuntimeError, match="the block failed"), \
            sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(fit(2) @ pool) == [0, 1]
        nodes_root = Path(pool.cluster.describe()["root"])
        assert len(list(nodes_root.glob("node-*/wandb/offline-run-*"))) == 2  # written on the nodes
        raise RuntimeError("the block failed")
    assert not nodes_root.exists()
    found = _finished_runs(tmp_path / "back" / "wandb", exit_code=1)
    line = _sync_line(capfd.readouterr().err)
    assert "brought back from its nodes" in line and "wandb sync " + " ".join(str(f) for f in found) in line, line



def test_wandb_every_worker_process_finishes_its_run_before_the_pool_closes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """With the process executor each worker process has a run ("node 0 worker W"): each is
    finished as the block ends (one closing task per process), and the line names them all."""
    _offline_wandb(monkeypatch)
    plugin = sky.plugins.wandb(project="skyward-test", dir=str(tmp_path))
    with sky.Compute(nodes=1, plugins=[plugin], worker=sky.Worker(executor="process", concurrency=2),
                     options=sky.Options(console="silent")) as pool:
        assert pool.map(fit, [2, 2, 2, 2]) == [0, 0, 0, 0]
    found = sorted((tmp_path / "wandb").glob("offline-run-*"))
    names = []
    for folder in found:
        (data,) = folder.glob("run-*.wandb")
        meta = _read_run(data)
        assert meta["exit"] == 0, meta
        names.append(meta["name"])
    line = _sync_line(capfd.readouterr().err)
    assert "wandb sync " + " ".join(str(f) for f in found) in line, line
    assert sorted(names) == ["node 0 worker 0", "node 0 worker 1"], names  # each opened as it started


def _records(data: Path) -> Iterator[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header (":W&B", magic, version), then LevelDB's
    log format (32 KiB blocks; chunks of crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    import struct

    raw = data.read_bytes()
    assert raw[:4] == b":W&B", raw[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", raw, pos)
        chunk = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def _read_run(data: Path) -> dict[str, object]:
    """The run's group, job type, name, config and logged losses, read with wandb's own protobuf."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, object] = {"losses": [], "exit": None}
    for raw in _records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.update(group=record.run.run_group, job_type=record.run.job_type, name=record.run.display_name,
                       config={i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "exit":
            out["exit"] = record.exit.exit_code
        elif kind == "history":
            for item in record.history.item:
                if item.key == "loss" or list(item.nested_key) == ["loss"]:
                    losses = out["losses"]
                    assert isinstance(losses, list)
                    losses.append(json.loads(item.value_json))
    return out
