"""Experiment trackers: MLflow and Weights & Biases, one run per node.

Both plugins work the same way. On the client, before the nodes start (``transform``), the
plugin decides where the runs go and hands that to the nodes through the image's environment,
the tracker's credentials as secrets (masked in logs, records and stacks). On each worker
(``around_app``) a run is opened for the node and made the one that ``mlflow.log_*`` or
``wandb.log`` inside tasks write to; it is closed when the worker stops. The trackers are
imported only where a hook runs: ``import skyward`` never loads them.

* ``mlflow``: the client opens the pool's parent run (tags: pool id, name, provider, nodes)
  and logs the pool's spec and lock (from its record, secret-free) as artifacts; each node a
  child run tagged with its rank, host and accelerator. The parent ends FINISHED, or FAILED
  when the pool's block raised.
* ``wandb``: a run per node in ``group`` (the pool by default), ``job_type="node"``, its config
  the pool's spec; ``mode="offline"`` writes each run to disk and needs no network.
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
def mlflow(experiment: str | None = None, tracking_uri: str | None = None, run_name: str | None = None,
           tags: dict[str, str] | None = None) -> Plugin:
    """One MLflow parent run for the pool and a child run per node (``mlflow.log_*`` in tasks
    lands in the node's run). ``tracking_uri``: the server (default ``MLFLOW_TRACKING_URI``; it
    must be reachable from the client and from the nodes); ``experiment``: its name (created if
    missing; default MLflow's default experiment); ``run_name``: the parent's (default the pool's)."""
    if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()):
        raise ConfigError(f"sky.plugins.mlflow(experiment={experiment!r}) is not valid: give a name, or leave it out.")
    state: dict[str, Any] = {}

    def client() -> Any:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise PluginError("sky.plugins.mlflow needs MLflow on this machine: pip install 'skyward[mlflow]' "
                              "(or mlflow-skinny).") from None
        return MlflowClient(tracking_uri=tracking_uri)

    def transform(image: Image, cluster: Cluster) -> Image:
        mc = client()
        uri = mc.tracking_uri
        if experiment is None:
            experiment_id = "0"
        else:
            found = mc.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else mc.create_experiment(experiment)
        parent = mc.create_run(experiment_id, run_name=run_name or "pool",  # named for the pool once known
                               tags={"skyward.role": "pool", **(tags or {})})
        state.update(run=parent.info.run_id, experiment=experiment_id, uri=uri)
        env = {"MLFLOW_TRACKING_URI": secret(uri) if "@" in uri else uri,
               "SKYWARD_MLFLOW_PARENT": parent.info.run_id, "SKYWARD_MLFLOW_EXPERIMENT": experiment_id}
        return _with(image, "mlflow-skinny", env, MLFLOW_SECRETS)

    @contextlib.contextmanager
    def around_client(pool: Pool, cluster: Cluster) -> Iterator[None]:
        mc, run = client(), state.get("run")
        if run is None:  # an attached pool: its nodes were configured by the program that made it
            yield
            return
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
            mc.set_terminated(run, status)

    @contextlib.contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        parent = os.environ.get("SKYWARD_MLFLOW_PARENT")
        if not parent:
            yield
            return
        from mlflow.tracking import MlflowClient

        mc = MlflowClient()  # MLFLOW_TRACKING_URI and the credentials came with the image
        acc = info.accelerator
        child = mc.create_run(os.environ["SKYWARD_MLFLOW_EXPERIMENT"], run_name=_run_name(info), tags={
            "mlflow.parentRunId": parent, "skyward.role": "node", "skyward.rank": str(_rank(info)),
            "skyward.node": str(info.node), "skyward.host": info.hostname,
            "skyward.accelerator": "" if acc is None else f"{acc.count:g}x {acc.type}"})
        # mlflow.log_* in a task (any thread of this worker) resumes this run: MLflow's fluent API
        # starts the run MLFLOW_RUN_ID names when its thread has none active.
        os.environ["MLFLOW_RUN_ID"] = child.info.run_id
        status = "FAILED"
        try:
            yield
            status = "FINISHED"
        finally:
            import mlflow as _mlflow

            with contextlib.suppress(Exception):
                _mlflow.flush_async_logging()
            mc.set_terminated(child.info.run_id, status)
            os.environ.pop("MLFLOW_RUN_ID", None)

    return (Plugin.create("mlflow").with_image_transform(transform).with_around_client(around_client)
            .with_around_app(around_app))


# -- Weights & Biases ----------------------------------------------------------------------------------
def wandb(project: str, group: str | None = None, mode: str | None = None, entity: str | None = None,
          dir: str | None = None, tags: tuple[str, ...] = ()) -> Plugin:
    """A W&B run per node, grouped by pool (``group``, default ``skyward-<pool>``), its config
    the pool's spec. ``mode``: ``"online"``, ``"offline"`` (runs written under ``dir``, no
    network; ``wandb sync`` uploads them later) or ``"disabled"``; default W&B's own
    (``WANDB_MODE``). ``dir``: where each node keeps its run (a ``node-N`` folder in it;
    default the worker's folder). ``WANDB_API_KEY`` travels to the nodes as a secret."""
    if not isinstance(project, str) or not project.strip():
        raise ConfigError(f"sky.plugins.wandb(project={project!r}) is not valid: give the W&B project's name.")
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"sky.plugins.wandb(mode={mode!r}) is not valid: use one of {', '.join(WANDB_MODES)}, "
                          f"or leave it out for W&B's default.")

    def transform(image: Image, cluster: Cluster) -> Image:
        env = {"SKYWARD_WANDB": json.dumps({
            "project": project, "group": group, "mode": mode, "entity": entity,
            "dir": dir, "tags": list(tags), "config": _spec_config(cluster)})}
        return _with(image, "wandb", env, WANDB_SECRETS)

    @contextlib.contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        settings = json.loads(os.environ.get("SKYWARD_WANDB") or "{}")
        if not settings:
            yield
            return
        import wandb as _wandb

        where = os.path.join(settings["dir"] or os.getcwd(), f"node-{_rank(info)}")
        os.makedirs(where, exist_ok=True)
        acc = info.accelerator
        config = {**settings["config"], "rank": _rank(info), "node": info.node, "host": info.hostname,
                  "accelerator": None if acc is None else f"{acc.count:g}x {acc.type}"}
        group_name = settings["group"] or f"skyward-{info.job_id}"  # job_id: the pool's id
        run = _wandb.init(project=settings["project"], entity=settings["entity"], group=group_name,
                          job_type="node", name=_run_name(info), mode=settings["mode"], dir=where,
                          config=config, tags=settings["tags"] or None)
        failed = True
        try:
            yield
            failed = False
        finally:
            run.finish(exit_code=1 if failed else 0)
            with contextlib.suppress(Exception):
                _wandb.teardown()  # its service process ends with the run, not with the worker

    return Plugin.create("wandb").with_image_transform(transform).with_around_app(around_app)
