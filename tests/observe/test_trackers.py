"""sky.plugins.mlflow against a real ``mlflow server`` (file store, loopback), and
sky.plugins.wandb in offline mode (issue 37). Real Local pools; the trackers' own clients read
back what the nodes wrote."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """``mlflow server`` with a file store on loopback; stopped and waited for whatever happens."""
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    if mlflow_bin is None:
        pytest.skip("the mlflow server is not installed (pip install mlflow)")
    port = _free_port()
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
    with sky.Compute(nodes=2, plugins=[plugin], options=sky.Options(console="silent")) as pool:
        assert sorted(fit(3) @ pool) == [0, 1]
        pool_id = pool.id
    runs = {}
    for node in (0, 1):
        found = list((tmp_path / "runs" / f"node-{node}" / "wandb").glob("offline-run-*"))
        assert len(found) == 1, found
        runs[node] = found[0]
    for node, folder in runs.items():
        (data,) = folder.glob("run-*.wandb")
        assert data.stat().st_size > 0
        meta = _read_run(data)
        config = meta["config"]
        assert isinstance(config, dict)
        assert config["rank"] == node and config["provider"] == "local" and config["nodes"] == 2
        assert meta["group"] == f"skyward-{pool_id}" and meta["job_type"] == "node"
        assert meta["name"] == f"node {node}" and meta["losses"] == [1.0, 0.5, 1.0 / 3]
        assert "0123456789abcdef0123456789abcdef01234567" not in data.read_bytes().decode("latin-1")


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

    out: dict[str, object] = {"losses": []}
    for raw in _records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.update(group=record.run.run_group, job_type=record.run.job_type, name=record.run.display_name,
                       config={i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            for item in record.history.item:
                if item.key == "loss" or list(item.nested_key) == ["loss"]:
                    losses = out["losses"]
                    assert isinstance(losses, list)
                    losses.append(json.loads(item.value_json))
    return out
