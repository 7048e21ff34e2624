"""Experiment trackers: MLflow and Weights & Biases, one run per node.

Both plugins work the same way. On the client, before the nodes start (``transform``), the
plugin decides where the runs go and hands that to the nodes through the image's environment,
the tracker's credentials as secrets (masked in logs, records and stacks). On each worker
(``around_app``) a run is opened for the node and made the one that ``mlflow.log_*`` or
``wandb.log`` inside tasks write to; it is closed when the worker stops, or earlier, as the
pool's block ends (``around_client``), when the client must bring back what the nodes wrote
before they go (W&B's offline runs; MLflow child runs for a store on the client that remote
nodes cannot reach), with the copy of ``skyward cp``. The trackers are imported only where a
hook runs: ``import skyward`` never loads them.

* ``mlflow``: the client opens the pool's parent run (tags: pool id, name, provider, nodes)
  and logs the pool's spec and lock (from its record, secret-free) as artifacts; each node a
  child run tagged with its rank, host and accelerator. The parent ends FINISHED, or FAILED
  when the pool's block raised.
* ``wandb``: a run per node in ``group`` (the pool by default), ``job_type="node"``, its config
  the pool's spec; ``mode="offline"`` writes each run to disk and needs no network, where W&B
  would on the client (``<dir or WANDB_DIR or .>/wandb``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError, PluginError
from skyward.observe.secrets import secret

from .plugin import Plugin

if TYPE_CHECKING:
    from skyward.core.pool import Pool
    from skyward.providers.base import Cluster
    from skyward.runtime.info import InstanceInfo
    from skyward.spec import Image

# Credentials each tracker reads from the environment: forwarded to the nodes, as secrets.
MLFLOW_SECRETS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                  "DATABRICKS_TOKEN", "DATABRICKS_HOST", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
WANDB_SECRETS = ("WANDB_API_KEY",)
WANDB_MODES = ("online", "offline", "disabled", "shared")


def _with(image: Image, pip: str, env: dict[str, str], forward: tuple[str, ...]) -> Image:
    """``image`` with ``pip`` (unless listed) and ``env``, plus the credentials set here."""
    have = {p.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for p in image.pip}
    base = pip.split("[")[0].split(">")[0].lower()
    extra = {name: secret(os.environ[name]) for name in forward if os.environ.get(name) and name not in image.env}
    return replace(image, pip=image.pip if base in have else (*image.pip, pip), env={**image.env, **env, **extra})


def _rank(info: InstanceInfo) -> int:
    return info.global_worker_index


def _run_name(info: InstanceInfo) -> str:
    """``node 1``, or ``node 1 worker 2`` where a node runs several worker processes."""
    return f"node {info.node}" if info.workers_per_node == 1 else f"node {info.node} worker {info.worker}"


def _spec_config(cluster: Cluster) -> dict[str, Any]:
    """The pool's spec as a tracker's config: what it runs on and with (no secret: env by name)."""
    spec = getattr(cluster, "spec", None)
    if spec is None:
        return {}
    image = spec.image
    return {
        "provider": getattr(spec.provider, "kind", type(spec.provider).__name__),
        "nodes": spec.node_spec.desired,
        "accelerator": None if spec.accelerator is None else str(spec.accelerator),
        "python": getattr(image, "python", None),
        "pip": list(image.pip),
        "env": sorted(image.env),
    }


# -- MLflow ----------------------------------------------------------------------------------------
def _local_store(uri: str) -> str | None:
    """A tracking URI naming a store on this machine (a folder, as ``file:`` or a bare path; a
    ``sqlite:`` file), made absolute: a relative one would be read by each node from its own
    folder, removed with the pool. None: a server (or any other store), left as it is."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    if uri.startswith("databricks"):  # MLflow's word for a Databricks workspace, not a folder
        return None
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path.startswith("/") or path.startswith(":memory:"):
            return uri
        return "sqlite:///" + os.path.abspath(os.path.expanduser(path))
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(os.path.abspath(os.path.expanduser(unquote(parsed.path)))).as_uri()
    if parsed.scheme == "":
        return Path(os.path.abspath(os.path.expanduser(uri))).as_uri()
    return None


def _mlflow_here(cluster: Cluster) -> bool:
    """Whether the nodes run on this machine (and so can write to a store on it)."""
    provider = getattr(getattr(cluster, "spec", None), "provider", None)
    return getattr(provider, "kind", "") == "local"


# This worker process's open child run (around_app), until it is finished: (client, run id).
_mlflow_open: list[tuple[Any, str]] = []


def _mlflow_opened(mc: Any, run_id: str) -> None:
    _mlflow_open.append((mc, run_id))


def _mlflow_finish(failed: bool) -> None:
    while _mlflow_open:
        mc, run_id = _mlflow_open.pop()
        with contextlib.suppress(Exception):
            import mlflow as _mlflow

            _mlflow.flush_async_logging()
        mc.set_terminated(run_id, "FAILED" if failed else "FINISHED")
        os.environ.pop("MLFLOW_RUN_ID", None)


def _all_arrived(tracker: str, processes: int) -> None:
    """With several worker processes on a node (``Worker(executor="process")``), the client
    sends one closing task per process at once: each waits here (at most 10 s) until all have
    arrived, so that every process takes one (and finishes its own run)."""
    if processes <= 1:
        return
    import time

    arrived = os.path.join(os.getcwd(), f".skyward-{tracker}-closing")
    os.makedirs(arrived, exist_ok=True)
    with open(os.path.join(arrived, str(os.getpid())), "w"):
        pass
    deadline = time.monotonic() + 10
    while len(os.listdir(arrived)) < processes and time.monotonic() < deadline:
        time.sleep(0.05)


def mlflow_close(failed: bool, processes: int = 1) -> dict[str, Any]:
    """On each node as the pool's block ends (the client sends it, where the nodes keep their
    runs in a store of their own): finish the node's child run; where that store is.
    ``processes``: see ``_all_arrived``."""
    import socket

    from skyward.runtime.info import instance_info

    _mlflow_finish(failed)
    _all_arrived("mlflow", processes)
    return {"node": instance_info().node, "host": socket.gethostname(),
            "store": os.environ.get("SKYWARD_MLFLOW_STORE")}


@contextlib.contextmanager
def _file_store_allowed() -> Iterator[None]:
    """MLflow 3 opens a file store only when asked to (``MLFLOW_ALLOW_FILE_STORE``)."""
    saved = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = saved


def _import_runs(mc: Any, experiment_id: str, store: str) -> list[str]:
    """Copy every run of the file store at ``store`` (a node's, brought back) into ``mc``'s
    store, in ``experiment_id``: tags, params, every metric's history, artifacts, status and
    times. Its new run ids."""
    from pathlib import Path

    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    made = []
    with _file_store_allowed():
        src = MlflowClient(tracking_uri=Path(store).as_uri())
        for run in src.search_runs(["0"]):
            old = run.info.run_id
            tags = {k: v for k, v in run.data.tags.items()
                    if not k.startswith("mlflow.") or k in ("mlflow.parentRunId", "mlflow.note.content")}
            new = mc.create_run(experiment_id, start_time=run.info.start_time, tags=tags,
                                run_name=run.info.run_name).info.run_id
            metrics = [Metric(m.key, m.value, m.timestamp, m.step)
                       for key in run.data.metrics for m in src.get_metric_history(old, key)]
            params = [Param(k, v) for k, v in run.data.params.items()]
            for start in range(0, max(len(metrics), 1), 1000):  # MLflow's limit per batch
                mc.log_batch(new, metrics=metrics[start:start + 1000], params=params if start == 0 else [],
                             tags=[RunTag("skyward.imported_from", old)] if start == 0 else [])
            # Read from the copy: the run's artifact_uri names the folder on the node.
            artifacts = Path(store) / run.info.experiment_id / old / "artifacts"
            if artifacts.is_dir() and any(artifacts.iterdir()):
                mc.log_artifacts(new, str(artifacts))
            mc.set_terminated(new, run.info.status, end_time=run.info.end_time)
            made.append(new)
    return made


def _mlflow_hand_back(pool: Pool, mc: Any, experiment_id: str, failed: bool) -> None:
    """As the pool's block ends, where the nodes kept their child runs in stores of their own
    (the pool's store is on this machine and they are not): each node finishes its run, its
    store comes back (the copy of ``skyward cp``) and its runs are copied into the pool's
    store. Never raises; what could not be done is said."""
    import sys
    import tempfile
    from pathlib import Path

    from skyward.core.function import function
    from skyward.named.copy import download
    from skyward.named.nodeaccess import pool_nodes

    def say(text: str) -> None:
        sys.stderr.write(f"skyward: MLflow: {text}\n")
        sys.stderr.flush()

    try:
        answers = _each_process(pool, function(mlflow_close, timeout=120), failed)
    except Exception as exc:
        say(f"the nodes' runs could not be finished and brought back before the pool closed "
            f"({type(exc).__name__}: {exc}); they are lost with the nodes.")
        return
    count, lost = 0, []
    for answer in answers:
        if not answer["store"]:
            continue
        label = f"node {answer['node']} ({answer['host']})"
        try:
            (node,) = pool_nodes(pool, [answer["node"]])
            with tempfile.TemporaryDirectory(prefix="skyward-mlflow-") as tmp:
                download(answer["store"], Path(tmp) / "store", [node], per_node=False, trailing_slash=False,
                         show=False)
                count += len(_import_runs(mc, experiment_id, str(Path(tmp) / "store")))
        except Exception as exc:
            lost.append(str(exc) if str(exc).startswith(label) else f"{label}: {exc}")
    if count:
        say(f"the {count} child run(s) the nodes kept were brought back into {mc.tracking_uri}.")
    if lost:
        say("these nodes' child runs could not be brought back and are lost with them: " + "; ".join(lost))


def mlflow(experiment: str | None = None, tracking_uri: str | None = None, run_name: str | None = None,
           tags: dict[str, str] | None = None) -> Plugin:
    """One MLflow parent run for the pool and a child run per node (``mlflow.log_*`` in tasks
    lands in the node's run). ``tracking_uri``: default ``MLFLOW_TRACKING_URI`` (MLflow's own
    default: ``./mlruns``); ``experiment``: its name (created if missing; default MLflow's
    default experiment); ``run_name``: the parent's (default the pool's).

    A server must be reachable from the client and from the nodes. A store on this machine (a
    folder, ``file:``, or ``sqlite:``; a relative path is taken from the working directory
    here) is written to by Local nodes directly; other nodes keep their runs in a store of their
    own, brought back and copied into it as the pool's block ends."""
    if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()):
        raise ConfigError(f"sky.plugins.mlflow(experiment={experiment!r}) is not valid: give a name, or leave it out.")
    state: dict[str, Any] = {}

    def client(uri: str | None) -> Any:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise PluginError("sky.plugins.mlflow needs MLflow on this machine: pip install 'skyward[mlflow]' "
                              "(or mlflow-skinny).") from None
        return MlflowClient(tracking_uri=uri)

    def transform(image: Image, cluster: Cluster) -> Image:
        mc = client(tracking_uri)
        local = _local_store(mc.tracking_uri)
        uri = local or mc.tracking_uri
        mc = client(uri)
        if experiment is None:
            experiment_id = "0"
        else:
            found = mc.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else mc.create_experiment(experiment)
        parent = mc.create_run(experiment_id, run_name=run_name or "pool",  # named for the pool once known
                               tags={"skyward.role": "pool", **(tags or {})})
        away = local is not None and not _mlflow_here(cluster)  # a store here, nodes elsewhere
        state.clear()
        state.update(run=parent.info.run_id, experiment=experiment_id, uri=uri, away=away)
        env = {"SKYWARD_MLFLOW_PARENT": parent.info.run_id, "SKYWARD_MLFLOW_EXPERIMENT": experiment_id}
        if away:
            env["SKYWARD_MLFLOW_AWAY"] = "1"
        else:
            env["MLFLOW_TRACKING_URI"] = secret(uri) if "@" in uri else uri
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE") and "MLFLOW_ALLOW_FILE_STORE" not in image.env:
            env["MLFLOW_ALLOW_FILE_STORE"] = os.environ["MLFLOW_ALLOW_FILE_STORE"]
        return _with(image, "mlflow-skinny", env, () if away else MLFLOW_SECRETS)

    @contextlib.contextmanager
    def around_client(pool: Pool, cluster: Cluster) -> Iterator[None]:
        mine = dict(state)
        state.clear()
        run = mine.get("run")
        if run is None:  # an attached pool: its nodes were configured by the program that made it
            yield
            return
        mc = client(mine["uri"])
        provider = getattr(pool.spec.provider, "kind", "")
        if run_name is None:  # the pool's id is known now, not when its nodes were requested
            mc.set_tag(run, "mlflow.runName", f"pool {pool.name or pool.id}")
        for key, value in {"skyward.pool.id": pool.id, "skyward.pool.name": pool.name or "",
                           "skyward.provider": provider, "skyward.nodes": str(pool.current_nodes())}.items():
            mc.set_tag(run, key, value)
        record = getattr(pool, "record", None) or {}
        for part in ("spec", "lock"):
            if record.get(part) is not None:
                mc.log_text(run, json.dumps(record[part], indent=1, sort_keys=True, default=str),
                            f"skyward/{part}.json")
        status = "FAILED"
        try:
            yield
            status = "FINISHED"
        finally:
            try:
                if mine["away"]:
                    _mlflow_hand_back(pool, mc, mine["experiment"], status == "FAILED")
            finally:
                mc.set_terminated(run, status)

    @contextlib.contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        parent = os.environ.get("SKYWARD_MLFLOW_PARENT")
        if not parent:
            yield
            return
        from mlflow.tracking import MlflowClient

        experiment_id = os.environ["SKYWARD_MLFLOW_EXPERIMENT"]
        if os.environ.get("SKYWARD_MLFLOW_AWAY"):
            # The pool's store is on the client: this node keeps its run in a file store of its
            # own, in its folder (MLflow's default experiment), which the client brings back.
            from pathlib import Path

            store = os.path.join(os.getcwd(), "mlruns")
            os.environ.update(MLFLOW_TRACKING_URI=Path(store).as_uri(), MLFLOW_ALLOW_FILE_STORE="true",
                              SKYWARD_MLFLOW_STORE=store)
            experiment_id = "0"
        mc = MlflowClient()  # MLFLOW_TRACKING_URI and the credentials came with the image
        acc = info.accelerator
        child = mc.create_run(experiment_id, run_name=_run_name(info), tags={
            "mlflow.parentRunId": parent, "skyward.role": "node", "skyward.rank": str(_rank(info)),
            "skyward.node": str(info.node), "skyward.host": info.hostname,
            "skyward.accelerator": "" if acc is None else f"{acc.count:g}x {acc.type}"})
        # mlflow.log_* in a task (any thread of this worker) resumes this run: MLflow's fluent API
        # starts the run MLFLOW_RUN_ID names when its thread has none active.
        os.environ["MLFLOW_RUN_ID"] = child.info.run_id
        _mlflow_opened(mc, child.info.run_id)
        failed = True
        try:
            yield
            failed = False
        finally:
            _mlflow_finish(failed)  # unless the client finished it as the pool's block ended

    return (Plugin.create("mlflow").with_image_transform(transform).with_around_client(around_client)
            .with_around_app(around_app))


# -- Weights & Biases ----------------------------------------------------------------------------------
# W&B variables set on the client that the nodes get too. Not: the key (a secret, forwarded as
# one), paths of this machine (``*_DIR``, ``*_PATH``: WANDB_DIR is where runs come back to), and
# what names one run (every node would share it), or W&B's own internals (``WANDB__*``).
_WANDB_KEPT_HERE = ("WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_NAME", "WANDB_RUN_GROUP",
                    "WANDB_JOB_TYPE", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH", "WANDB_NOTEBOOK_NAME",
                    "WANDB_SERVICE")


def _wandb_env(image: Image) -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.startswith("WANDB_") and not k.startswith("WANDB__") and k not in _WANDB_KEPT_HERE
            and not k.endswith(("_DIR", "_PATH")) and k not in image.env}


def _wandb_places(cluster: Cluster, dir: str | None) -> dict[str, Any]:
    """Where the nodes write their runs (``node_dir``: the ``dir`` of ``wandb.init``; None: the
    node's own folder) and where offline runs are brought back to (``back_to``; None: they stay
    where they are written). W&B puts a run in ``<dir>/wandb/<run folder>``.

    * Local nodes run on this machine: they write where W&B would here (``dir``, else
      ``WANDB_DIR``, else the program's working directory), resolved now.
    * Other nodes: an absolute ``dir`` (or ``~/...``) is a path on the nodes (a volume's mount
      path): the runs stay there. Otherwise each node writes in its own folder, removed with the
      pool, and the offline runs come back here to ``dir``/``WANDB_DIR``/the working directory
      before the nodes go."""
    provider = getattr(getattr(cluster, "spec", None), "provider", None)
    chosen = dir or os.environ.get("WANDB_DIR") or "."
    if getattr(provider, "kind", "") == "local":
        return {"node_dir": os.path.abspath(os.path.expanduser(chosen)), "back_to": None}
    if dir is not None and (os.path.isabs(dir) or dir == "~" or dir.startswith("~/")):
        return {"node_dir": dir, "back_to": None}
    return {"node_dir": None, "back_to": os.path.abspath(os.path.expanduser(chosen))}


# This worker process's open W&B run (around_app), until it is finished, and where W&B keeps
# runs for it (``<dir>/wandb``).
_wandb_open: list[Any] = []
_wandb_home: list[str] = []


def _wandb_opened(run: Any) -> None:
    """Keep ``run`` as this process's. (The hooks reach this module's state through module
    functions: a hook travels to the nodes pickled by value, with copies of the globals it
    names.)"""
    _wandb_open.append(run)
    _wandb_home[:] = [os.path.dirname(str(run.sync_dir))]


def _wandb_finish(failed: bool) -> list[str]:
    """Finish this process's W&B run, once: the folder of an offline run (``wandb sync`` takes
    it), or nothing."""
    folders = []
    while _wandb_open:
        run = _wandb_open.pop()
        offline = bool(getattr(run, "offline", False))
        folder = str(run.sync_dir) if offline else None
        try:
            run.finish(exit_code=1 if failed else 0)
        finally:
            with contextlib.suppress(Exception):
                import wandb as _wandb

                _wandb.teardown()  # its service process ends with the run, not with the worker
        if folder:
            folders.append(folder)
    return folders


def _wandb_staging_removed() -> None:
    """Remove the two staging folders W&B makes in the temporary folder when it is imported
    (``tmp*wandb-media``, ``tmp*wandb-artifacts``). It removes them at interpreter exit, which a
    worker never reaches (it ends with os._exit), so each worker process that used W&B left two
    in /tmp. Called as the worker's app ends (its last use of W&B)."""
    import sys

    for module, names in (("wandb.sdk.data_types._private", ("MEDIA_TMP",)),
                          ("wandb.sdk.artifacts.artifact", ("Artifact", "_TMP_DIR"))):
        folder: Any = sys.modules.get(module)
        for name in names:
            folder = getattr(folder, name, None)
        with contextlib.suppress(Exception):  # (another W&B version: its own way, or none)
            folder.cleanup()


def wandb_close(failed: bool, processes: int = 1) -> dict[str, Any]:
    """On each node as the pool's block ends (the client sends it): finish the node's run, and
    name the node's offline run folders. Where runs are written in the node's own folder, that
    is every offline run there (the pool's, from each worker process of the node).

    ``processes``: see ``_all_arrived``."""
    import glob
    import socket

    from skyward.runtime.info import instance_info

    folders = _wandb_finish(failed)
    _all_arrived("wandb", processes)
    settings = json.loads(os.environ.get("SKYWARD_WANDB") or "{}")
    if settings.get("node_dir") is None and _wandb_home:
        folders = sorted({*folders, *glob.glob(os.path.join(_wandb_home[0], "offline-run-*"))})
        for folder in folders:
            _links_made_files(folder)
    return {"node": instance_info().node, "host": socket.gethostname(), "runs": folders}


def _links_made_files(folder: str) -> None:
    """Links in a run folder that point outside it (W&B links ``logs/debug-core.log`` to a log
    in ``~/.cache/wandb``) become copies of what they point to: the folder is copied to the
    client, where they would point nowhere (and ``skyward cp`` copies no such link)."""
    import shutil

    root = os.path.realpath(folder)
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            if os.path.commonpath([root, target]) == root:
                continue
            os.unlink(path)
            with contextlib.suppress(OSError):
                shutil.copyfile(target, path)


def _each_process(pool: Pool, close: Any, failed: bool) -> list[dict[str, Any]]:
    """``close(failed, processes)`` in every worker process of every node (one per node with
    the thread executor): one answer per node, the run folders of its processes together."""
    worker = getattr(pool, "worker", None)
    processes = worker.concurrency if worker is not None and worker.resolved_executor == "process" else 1
    if processes == 1:
        return list(pool.broadcast(close(failed, 1)))
    futures = [pool.run_async(close(failed, processes), target=rank)
               for rank in range(pool.current_nodes()) for _ in range(processes)]
    merged: dict[int, dict[str, Any]] = {}
    for future in futures:
        answer = future.result()
        into = merged.setdefault(answer["node"], dict(answer))
        if "runs" in answer:  # W&B's: the processes' run folders together
            into["runs"] = sorted({*into["runs"], *answer["runs"]})
    return [merged[n] for n in sorted(merged)]


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it is inside it (a shorter command)."""
    rel = os.path.relpath(path)
    return path if rel == ".." or rel.startswith("../") else rel


def _wandb_hand_back(pool: Pool, places: dict[str, Any], failed: bool) -> None:
    """As the pool's block ends: every node finishes its run; offline runs written in the
    nodes' own folders are brought back here; one line says where they are and how to upload
    them. Never raises (the pool closes anyway); what could not be done is said."""
    import shlex
    import sys

    from skyward.core.function import function

    def say(text: str) -> None:
        sys.stderr.write(f"skyward: W&B: {text}\n")
        sys.stderr.flush()

    try:
        answers = _each_process(pool, function(wandb_close, timeout=120), failed)
    except Exception as exc:
        say(f"the nodes' runs could not be finished before the pool closed ({type(exc).__name__}: {exc}); "
            + ("their offline runs are lost with the nodes." if places["back_to"] else
               "they are finished as the nodes stop."))
        return
    offline = [a for a in answers if a["runs"]]
    if not offline:
        return
    count = sum(len(a["runs"]) for a in offline)
    if places["back_to"] is None and places["node_dir"] is not None and not _local(pool):
        where = "; ".join(f"node {a['node']} ({a['host']}): {', '.join(a['runs'])}" for a in offline)
        say(f"the pool's {count} offline run(s) stay on its nodes ({where}); upload them from there "
            f"with `wandb sync FOLDER`.")
        return
    if places["back_to"] is None:
        folders = sorted(r for a in offline for r in a["runs"])
        home = os.path.dirname(folders[0])
        say(f"the pool's {count} offline run(s) are in {_shown(home)}; upload them with: wandb sync "
            + " ".join(shlex.quote(_shown(f)) for f in folders))
        return
    from pathlib import Path

    from skyward.named.copy import download
    from skyward.named.nodeaccess import pool_nodes

    home = os.path.join(places["back_to"], "wandb")
    brought, lost = [], []
    for answer in offline:
        try:
            (node,) = pool_nodes(pool, [answer["node"]])
            for folder in answer["runs"]:
                download(folder, Path(home), [node], per_node=False, trailing_slash=True, show=False)
                brought.append(os.path.join(home, os.path.basename(folder)))
        except Exception as exc:
            label = f"node {answer['node']} ({answer['host']})"
            lost.append(str(exc) if str(exc).startswith(label) else f"{label}: {exc}")
    if brought:
        say(f"the pool's {len(brought)} offline run(s) were brought back from its nodes to {_shown(home)}; "
            "upload them with: wandb sync " + " ".join(shlex.quote(_shown(f)) for f in sorted(brought)))
    if lost:
        say("these offline runs could not be brought back and are lost with the nodes: " + "; ".join(lost))


def _local(pool: Pool) -> bool:
    return getattr(pool.spec.provider, "kind", "") == "local"


def wandb(project: str, group: str | None = None, mode: str | None = None, entity: str | None = None,
          dir: str | None = None, tags: tuple[str, ...] = ()) -> Plugin:
    """A W&B run per node, grouped by pool (``group``, default ``skyward-<pool>``), its config
    the pool's spec. ``mode``: ``"online"``, ``"offline"`` (runs written to disk, no network;
    ``wandb sync`` uploads them later) or ``"disabled"``; default W&B's own (``WANDB_MODE``).
    W&B's variables set here (``WANDB_MODE``, ``WANDB_ENTITY``, ``WANDB_BASE_URL``...) reach
    the nodes; ``WANDB_API_KEY`` as a secret.

    Where runs go, as W&B does it (``<dir>/wandb/``): ``dir``, else ``WANDB_DIR``, else the
    program's working directory. Local nodes write there. Other nodes write in their own
    folder, and their offline runs are brought back there before the nodes go; an absolute
    ``dir`` on such nodes (a volume's mount path) keeps them on the nodes instead. As the
    pool's block ends a line says where the offline runs are and the ``wandb sync`` command."""
    if not isinstance(project, str) or not project.strip():
        raise ConfigError(f"sky.plugins.wandb(project={project!r}) is not valid: give the W&B project's name.")
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"sky.plugins.wandb(mode={mode!r}) is not valid: use one of {', '.join(WANDB_MODES)}, "
                          f"or leave it out for W&B's default.")
    state: dict[str, Any] = {}

    def transform(image: Image, cluster: Cluster) -> Image:
        places = _wandb_places(cluster, dir)
        state.clear()
        state.update(places)
        env = {"SKYWARD_WANDB": json.dumps({
            "project": project, "group": group, "mode": mode, "entity": entity,
            "node_dir": places["node_dir"], "tags": list(tags), "config": _spec_config(cluster)})}
        return _with(image, "wandb", {**_wandb_env(image), **env}, WANDB_SECRETS)

    @contextlib.contextmanager
    def around_client(pool: Pool, cluster: Cluster) -> Iterator[None]:
        places = dict(state)
        state.clear()
        if not places:  # an attached pool: its nodes were configured by the program that made it
            yield
            return
        failed = True
        try:
            yield
            failed = False
        finally:
            _wandb_hand_back(pool, places, failed)

    @contextlib.contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        settings = json.loads(os.environ.get("SKYWARD_WANDB") or "{}")
        if not settings:
            yield
            return
        import wandb as _wandb

        where = settings.get("node_dir") or os.getcwd()
        os.makedirs(os.path.expanduser(where), exist_ok=True)
        acc = info.accelerator
        config = {**settings["config"], "rank": _rank(info), "node": info.node, "host": info.hostname,
                  "accelerator": None if acc is None else f"{acc.count:g}x {acc.type}"}
        group_name = settings["group"] or f"skyward-{info.job_id}"  # job_id: the pool's id
        run = _wandb.init(project=settings["project"], entity=settings["entity"], group=group_name,
                          job_type="node", name=_run_name(info), mode=settings["mode"],
                          dir=os.path.expanduser(where), config=config, tags=settings["tags"] or None)
        _wandb_opened(run)
        failed = True
        try:
            yield
            failed = False
        finally:
            try:
                _wandb_finish(failed)  # unless the client finished it as the pool's block ended
            finally:
                _wandb_staging_removed()

    return (Plugin.create("wandb").with_image_transform(transform).with_around_client(around_client)
            .with_around_app(around_app))
