"""torch, jax, keras, huggingface and accelerate.

Rank, on every framework plugin: each worker process is one rank, and the world is the node's
group (skyward.core.group: in a pool of one group, the pool), so ``f() @ pool["train"]`` trains
over the train group's nodes alone. With the thread executor
a node has one worker process, so rank = group rank and world = the group's nodes; with the process executor
each of a node's ``concurrency`` processes is a rank: rank = ``info.group_worker_index``,
world = ``info.group_workers``, local rank = ``info.worker``. Rendezvous hooks run when each
worker starts, so every rank joins even if only one node ever gets a task. The rendezvous
ports are the group's ``head_port`` (torch) and ``head_port + 1`` (jax) on the group's first node,
and they listen on that node's private address only: left to themselves, torch's TCPStore and
JAX's coordinator listen on every interface, a public one included, and admit whoever connects.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from skyward.errors import ConfigError, PluginError

from .plugin import AccelerateConfig, LaunchCommand, LaunchContext, Plugin

_RENDEZVOUS_TIMEOUT = 300  # seconds every rank has to join


def _pip(image: Any, *packages: str) -> Any:
    have = {p.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for p in image.pip}
    return replace(image, pip=(*image.pip, *(p for p in packages if p.split("[")[0].split("=")[0].lower() not in have)))


def _env(image: Any, **values: str) -> Any:
    return replace(image, env={**image.env, **values})


def _has_gpu(cluster: Any) -> bool:
    """An NVIDIA GPU pool (CUDA wheels); TPUs, Trainium, Gaudi or AMD cards take other builds."""
    return _accelerator_maker(cluster) == "NVIDIA"


def _accelerator_maker(cluster: Any) -> str | None:
    """Who makes the pool's accelerator ("NVIDIA", "Google" for TPUs...), None without one."""
    spec = getattr(cluster, "spec", None)
    acc = getattr(spec, "accelerator", None)
    return getattr(acc, "manufacturer", None) if acc is not None else None


def _threads_per_rank(info: Any) -> int:
    """Cores per rank among the ranks sharing this host (Local: every node shares it)."""
    me = info.group_peers[info.group_rank].private_ip if info.group_rank < len(info.group_peers) else None
    nodes_here = sum(1 for p in info.group_peers if p.private_ip == me) or 1
    return max(1, (os.cpu_count() or 1) // (nodes_here * info.workers_per_node))


def _rank_env(info: Any) -> dict[str, str]:
    return {
        "WORLD_SIZE": str(info.group_workers),
        "RANK": str(info.group_worker_index),
        "LOCAL_RANK": str(info.worker),
        "LOCAL_WORLD_SIZE": str(info.workers_per_node),
        "NODE_RANK": str(info.group_rank),
    }


def bind_worker_gpus(info: Any) -> tuple[str, ...]:
    """Give this worker process its share of the node's GPUs, before CUDA starts in it.

    The node's GPUs are what its CUDA_VISIBLE_DEVICES names (a Local node's own, see
    ``sky.Local``), or every GPU ``nvidia-smi -L`` lists where it is not set. With one worker per
    node (the thread executor) the worker keeps them all. With several (the process executor),
    each worker gets ``gpus // workers`` of them, worker 0 the first ones, through its own
    CUDA_VISIBLE_DEVICES; with more workers than GPUs, worker ``w`` shares GPU ``w % gpus``.
    Returns this worker's GPUs (empty where the node has none, or where CUDA already started in
    this process and can no longer be told)."""
    node = os.environ.get("SKYWARD_NODE_GPUS")  # (a worker that binds again starts from the node's)
    if node is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        node = visible if visible is not None else ",".join(_listed_gpus()) if info.workers_per_node > 1 else ""
        os.environ["SKYWARD_NODE_GPUS"] = node
    devices = [d for d in (d.strip() for d in node.split(",")) if d]
    if not devices or info.workers_per_node <= 1:
        return tuple(devices)
    per = len(devices) // info.workers_per_node
    mine = devices[info.worker * per:(info.worker + 1) * per] if per else [devices[info.worker % len(devices)]]
    if _cuda_started():
        return ()
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return tuple(mine)


def _listed_gpus() -> list[str]:
    """The UUIDs (else indices) of the GPUs nvidia-smi lists; [] without it."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = re.findall(r"^GPU (\d+):.*?(?:\(UUID: (GPU-[^)]+)\))?\s*$", out, flags=re.M)
    return [uuid or index for index, uuid in found]


def _cuda_started() -> bool:
    """CUDA already runs in this process (torch's), so CUDA_VISIBLE_DEVICES would be read too late."""
    import sys

    torch_cuda = sys.modules.get("torch.cuda")
    try:
        return bool(torch_cuda is not None and torch_cuda.is_initialized())
    except Exception:
        return False


def _worker_device(info: Any, count: int) -> int:
    """The CUDA device this worker uses among those it sees: its first when it was given GPUs
    of its own (bind_worker_gpus), else ``worker % count`` of the node's (workers share them)."""
    if info.workers_per_node > 1 and os.environ.get("SKYWARD_NODE_GPUS") and \
            os.environ.get("CUDA_VISIBLE_DEVICES") != os.environ.get("SKYWARD_NODE_GPUS"):
        return 0
    return info.worker % max(1, count)


def _gpu_shared(info: Any, mine: tuple[str, ...]) -> bool:
    """Does this worker share its GPU with another rank? (A Local node with a fractional count,
    or more worker processes than the node has GPUs.) NCCL refuses two ranks on one GPU."""
    node = [d for d in os.environ.get("SKYWARD_NODE_GPUS", "").split(",") if d.strip()]
    return bool(os.environ.get("SKYWARD_GPU_SHARE")) or (
        bool(mine) and info.workers_per_node > 1 and len(node) < info.workers_per_node)


def _jax_memory_share(info: Any) -> None:
    """JAX takes 75% of each GPU's memory when it starts: where processes share a GPU (a Local
    node's fractional count, or more worker processes than the node's GPUs), each takes its share
    of that instead (XLA_PYTHON_CLIENT_MEM_FRACTION), unless it is set already."""
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:
        return
    share = 1.0
    with contextlib.suppress(ValueError):
        share = float(os.environ.get("SKYWARD_GPU_SHARE") or 1)
    node = [d for d in os.environ.get("SKYWARD_NODE_GPUS", "").split(",") if d.strip()]
    if node and info.workers_per_node > len(node):
        share /= -(-info.workers_per_node // len(node))  # worker processes per GPU
    if share < 1:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.75 * share:.3f}"


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(framework: str, host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``, the head node's private address: the rendezvous is
    for the pool's own network, never every interface of the node."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=256)
    except OSError as exc:
        raise PluginError(
            f"{framework}: the rendezvous cannot listen on {_hostport(host, port)}, the head node's "
            f"private address ({exc.strerror or exc}). It listens there only, never on every "
            f"interface. If {host} is not an address of the head node itself (an address behind NAT), "
            f"give the node's own address as SSHHost(private_ip=...); if the port is taken, stop "
            f"what holds it or open the pool again (another port is picked)."
        ) from None


# -- torch -------------------------------------------------------------------------------------
def torch(*, backend: str | None = None, cuda: str | None = "cu128", version: str = "latest",
          vision: bool | str | None = None, audio: bool | str | None = None) -> Plugin:
    """PyTorch with a process group per pool.

    Installs ``torch`` (``version``: "latest" or a pin such as "2.4.1"; ``vision``/``audio``:
    True or a version for torchvision/torchaudio) from PyTorch's ``cuda`` wheel index on GPU
    pools (the CPU index otherwise). On every worker: its GPUs (the node's own; with the process
    executor, its share of them: ``bind_worker_gpus``) and ``cuda.set_device``, MASTER_ADDR/PORT,
    WORLD_SIZE, RANK, LOCAL_RANK, OMP_NUM_THREADS, then ``init_process_group`` once
    (``backend``: nccl with GPUs, gloo without, and gloo where ranks share a GPU, as Local nodes
    with a fractional count do: NCCL refuses two ranks on one device). Your own
    ``init_process_group``/``destroy_process_group`` calls become no-ops while the plugin holds
    the group; it is destroyed when the worker stops.
    """
    if backend not in (None, "nccl", "gloo", "mpi", "ucc"):
        raise ConfigError(f"torch(backend={backend!r}) is not valid: use 'nccl', 'gloo', or None (automatic).")

    def pin(name: str, value: bool | str | None) -> str | None:
        if value is None or value is False:
            return None
        return name if value is True or value == "latest" else f"{name}=={value}"

    def transform(image: Any, cluster: Any) -> Any:
        from skyward.spec import PipIndex

        packages = [p for p in (pin("torch", version), pin("torchvision", vision), pin("torchaudio", audio)) if p]
        names = tuple(p.split("=")[0] for p in packages)
        index = f"https://download.pytorch.org/whl/{cuda}" if _has_gpu(cluster) and cuda else "https://download.pytorch.org/whl/cpu"
        image = _pip(image, *packages)
        return replace(image, pip_indexes=(*image.pip_indexes, PipIndex(url=index, packages=names)))

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        threads = _threads_per_rank(info)
        os.environ.update(_rank_env(info), MASTER_ADDR=info.group_head_addr, MASTER_PORT=str(info.group_head_port))
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        mine = bind_worker_gpus(info)  # before CUDA starts in this process
        import torch as _torch
        import torch.distributed as dist

        _torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        has_cuda = _torch.cuda.is_available()
        chosen = backend or ("nccl" if has_cuda and not _gpu_shared(info, mine) else "gloo")
        if has_cuda:  # this rank's device (with gloo too: a shared GPU's tensors live on it)
            _torch.cuda.set_device(_worker_device(info, _torch.cuda.device_count()))
        owned = False
        if not dist.is_initialized():
            dist.init_process_group(chosen, store=_torch_store(info), world_size=info.group_workers,
                                    rank=info.group_worker_index, timeout=timedelta(seconds=_RENDEZVOUS_TIMEOUT))
            owned = True
        restore = _guard_process_group(dist) if owned else None
        try:
            yield
        finally:
            if restore is not None:
                restore()
            if owned and dist.is_initialized():
                with contextlib.suppress(Exception):
                    if chosen == "gloo":
                        dist.monitored_barrier(timeout=timedelta(seconds=1.5))
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()

    return Plugin.create("torch").with_image_transform(transform).with_around_app(around_app)


def _torch_store(info: Any) -> Any:
    """The process group's TCPStore, what ``init_method="env://"`` would make from MASTER_ADDR and
    MASTER_PORT, except that rank 0's server listens on the head node's private address: torch's
    own server would listen on every interface. It takes our socket instead (and closes it)."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=_RENDEZVOUS_TIMEOUT)
    if info.group_worker_index != 0:
        return TCPStore(info.group_head_addr, info.group_head_port, info.group_workers, False, timeout)
    fd = _listen("torch", info.group_head_addr, info.group_head_port).detach()
    return TCPStore(info.group_head_addr, info.group_head_port, info.group_workers, True, timeout, master_listen_fd=fd)


def _guard_process_group(dist: Any) -> Any:
    """While the plugin owns the group, the user's init/destroy calls do nothing (reference
    examples call ``init_process_group`` themselves; a second call would raise)."""
    import torch.distributed.distributed_c10d as c10d

    originals = (dist.init_process_group, dist.destroy_process_group)

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            originals[0](*args, **kwargs)

    def destroy_process_group(group: Any = None) -> None:
        if group is not None and group is not c10d.GroupMember.WORLD:
            originals[1](group)

    modules: tuple[Any, ...] = (dist, c10d)
    for module in modules:
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group

    def restore() -> None:
        for module in modules:
            module.init_process_group, module.destroy_process_group = originals

    return restore


# -- jax ---------------------------------------------------------------------------------------
def jax(*, cuda: str | None = "cu124") -> Plugin:
    """JAX with ``jax.distributed`` initialised on every worker (before any other JAX call).

    Installs ``jax[tpu]`` on Cloud TPU pools, ``jax[cuda12]`` on NVIDIA GPU pools (``cuda``),
    ``jax`` otherwise; gives each worker its GPUs (the node's own; with the process executor, its
    share of them: ``bind_worker_gpus``), so that its local devices are those, and where processes
    share a GPU (a fractional count on Local) its share of JAX's preallocated memory
    (XLA_PYTHON_CLIENT_MEM_FRACTION, unless set); sets
    JAX_COORDINATOR_ADDRESS (head node, ``head_port + 1``; JAX_COORDINATOR_BIND_ADDRESS, the
    same: the coordinator listens there only), JAX_NUM_PROCESSES, JAX_PROCESS_ID,
    and on CPU uses gloo for cross-process collectives. Timeouts are always passed: a peer
    that never comes makes the hook fail instead of hanging.
    """

    def transform(image: Any, cluster: Any) -> Any:
        maker = _accelerator_maker(cluster)
        if maker == "Google":  # libtpu comes with the extra
            return _pip(image, "jax[tpu]")
        if maker == "NVIDIA" and cuda:
            return _pip(image, f"jax[cuda{cuda[2:4]}]")
        return _pip(image, "jax")

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        address = _hostport(info.group_head_addr, info.group_head_port + 1)
        os.environ.update(
            JAX_COORDINATOR_ADDRESS=address,
            JAX_NUM_PROCESSES=str(info.group_workers),
            JAX_PROCESS_ID=str(info.group_worker_index),
        )
        os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_rank(info)))
        bind_worker_gpus(info)  # before JAX starts its backends
        _jax_memory_share(info)
        import jax as _jax

        # Only affects CPU collectives; must be set before initialize, like everything else.
        _jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _jax_coordinator_binds_private(info)
        _jax.distributed.initialize(
            coordinator_address=address, num_processes=info.group_workers,
            process_id=info.group_worker_index, initialization_timeout=_RENDEZVOUS_TIMEOUT,
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                _jax.distributed.shutdown()

    return Plugin.create("jax").with_image_transform(transform).with_around_app(around_app)


# -- keras -------------------------------------------------------------------------------------
def _jax_coordinator_binds_private(info: Any) -> None:
    """Make ``jax.distributed.initialize`` bind its coordinator (process 0's service) to the head
    node's private address: by default it binds ``[::]``, every interface. Through JAX's own
    variable, so that keras.distribution.initialize, which passes no bind address, binds the same."""
    os.environ["JAX_COORDINATOR_BIND_ADDRESS"] = _hostport(info.group_head_addr, info.group_head_port + 1)
    if info.group_worker_index == 0:  # a clear error now, rather than the service failing to start
        _listen("jax", info.group_head_addr, info.group_head_port + 1).close()


def keras(*, backend: str = "jax") -> Plugin:
    """Keras 3 on ``backend`` ("jax", "torch" or "tensorflow"): installs keras and sets
    KERAS_BACKEND on the nodes before anything imports it. With the jax backend on more
    than one worker, data parallelism over every process's devices is set up
    (``DataParallel``, shared seed); list ``jax()`` before ``keras()`` so that JAX's
    distributed runtime exists first (without it, keras initialises it itself). Each worker
    sees only its GPUs (the node's own, shared among its worker processes: ``bind_worker_gpus``)."""
    if backend not in ("jax", "torch", "tensorflow"):
        raise ConfigError(f"keras(backend={backend!r}) is not valid: use 'jax', 'torch' or 'tensorflow'.")

    def transform(image: Any, cluster: Any) -> Any:
        extra = {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}[backend]
        return _env(_pip(image, "keras", extra), KERAS_BACKEND=backend)

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        os.environ["KERAS_BACKEND"] = backend
        bind_worker_gpus(info)  # the node's own GPUs, a share of them per worker process
        if backend == "jax":
            _jax_memory_share(info)
        if backend == "jax" and info.group_workers > 1:
            import jax as _jax

            if not _jax.distributed.is_initialized():
                import keras as _keras

                _jax_coordinator_binds_private(info)
                _keras.distribution.initialize(
                    _hostport(info.group_head_addr, info.group_head_port + 1), info.group_workers, info.group_worker_index)
            import keras as _keras

            _keras.distribution.set_distribution(
                _keras.distribution.DataParallel(devices=_jax.devices(), auto_shard_dataset=False))
        yield

    return Plugin.create("keras").with_image_transform(transform).with_around_app(around_app)


# -- huggingface -------------------------------------------------------------------------------
def huggingface(token: str | None = None, *,
                models: Sequence[str] = (),
                packages: tuple[str, ...] = ("transformers", "datasets", "tokenizers")) -> Plugin:
    """HuggingFace: installs ``packages`` and huggingface_hub; with a ``token`` (or HF_TOKEN in
    your environment) sets HF_TOKEN on the nodes and logs them in during bootstrap. ``models``:
    hub repo ids (``"org/name"``) downloaded into the nodes' HF cache during bootstrap, before
    any task runs, so ``from_pretrained`` reads them from disk. The token is a secret: it is
    redacted from logs and events, and the bootstrap ops only name $HF_TOKEN."""
    from skyward.observe import secrets

    if isinstance(models, str):
        raise ConfigError(f"huggingface(models={models!r}): models is a list of repo ids; write models=[{models!r}].")
    repos = tuple(models)
    for repo in repos:
        if not isinstance(repo, str) or not _REPO_ID.fullmatch(repo):
            raise ConfigError(
                f"huggingface(models=[..., {repo!r}]): not a hub repo id; write it as on the hub, "
                f"e.g. 'meta-llama/Llama-3.1-8B' or 'gpt2'."
            )
    value = token if token is not None else os.environ.get("HF_TOKEN")
    if value:
        secrets.register(value)

    def transform(image: Any, cluster: Any) -> Any:
        image = _pip(image, *packages, "huggingface_hub")
        return _env(image, HF_TOKEN=value) if value else image

    def bootstrap(cluster: Any) -> tuple[str, ...]:
        ops: list[str] = []
        if value:
            ops.append('python -c "import os, huggingface_hub; '
                       "huggingface_hub.login(token=os.environ['HF_TOKEN'], add_to_git_credential=False)\"")
        if repos:
            # The ids pass as argv (checked above), never pasted into the Python source.
            ops.append("python -c 'import sys, huggingface_hub; "
                       "[huggingface_hub.snapshot_download(r) for r in sys.argv[1:]]' "
                       + " ".join(shlex.quote(r) for r in repos))
        return tuple(ops)

    return Plugin.create("huggingface").with_image_transform(transform).with_bootstrap(bootstrap)


# A hub repo id: "name" or "owner/name" (letters, digits, "-", "_", ".").
_REPO_ID = re.compile(r"(?:[\w.-]+/)?[\w.-]+")


# -- accelerate --------------------------------------------------------------------------------
_FLAGS = ("mixed_precision", "num_cpu_threads_per_process", "gpu_ids", "rdzv_backend")
_SWITCHES = ("same_network", "debug", "downcast_bf16")


def accelerate(config: AccelerateConfig | None = None) -> Plugin:
    """Accelerate: installs accelerate and starts each node's workers with
    ``accelerate launch``, topology filled in (num_machines, machine_rank, main_process_ip,
    main_process_port; ``num_processes`` is the total over the pool, default one per node).
    ``config`` mirrors the ``accelerate config`` YAML; distributed_type is FSDP or DEEPSPEED
    when those sections are given, MULTI_GPU otherwise."""
    cfg: dict[str, Any] = dict(config or {})
    unknown = set(cfg) - set(AccelerateConfig.__annotations__)
    if unknown:
        raise ConfigError(
            f"accelerate(config=...) has unknown key(s) {sorted(unknown)}; known keys: "
            f"{', '.join(sorted(AccelerateConfig.__annotations__))}."
        )

    def launcher(cmd: LaunchCommand, ctx: LaunchContext) -> LaunchCommand:
        total = int(cfg.get("num_processes", ctx.num_nodes))
        if total % ctx.num_nodes:
            raise ConfigError(
                f"accelerate(num_processes={total}) is not a multiple of the {ctx.num_nodes} nodes; "
                f"each node runs the same number of processes."
            )
        kind = cfg.get("distributed_type") or ("FSDP" if "fsdp" in cfg else "DEEPSPEED" if "deepspeed" in cfg else "MULTI_GPU")
        parts = [f"{ctx.python_bin} -m accelerate.commands.launch",
                 f"--num_machines {ctx.num_nodes}", f"--machine_rank {ctx.node_id}",
                 f"--main_process_ip {ctx.head_addr}", f"--main_process_port {ctx.casty_port}",
                 f"--num_processes {total}"]
        parts.append({"FSDP": "--use_fsdp", "DEEPSPEED": "--use_deepspeed", "MULTI_CPU": "--cpu --multi_gpu",
                      "NO": "", "XLA": "--tpu"}.get(kind, "--multi_gpu"))
        parts += [f"--{k} {cfg[k]}" for k in _FLAGS if k in cfg]
        parts += [f"--{k}" for k in _SWITCHES if cfg.get(k)]
        for section, prefix in (("fsdp", "fsdp_"), ("deepspeed", "")):
            for key, val in (cfg.get(section) or {}).items():
                flag = key if key.startswith(prefix) else prefix + key
                parts.append(f"--{flag} {str(val).lower() if isinstance(val, bool) else val}")
        module = cmd.entrypoint.split(" -m ", 1)[1] if " -m " in cmd.entrypoint else None
        entry = f"-m {module}" if module else cmd.entrypoint
        return replace(cmd, launcher=" ".join(p for p in parts if p), entrypoint=entry)

    def transform(image: Any, cluster: Any) -> Any:
        return _env(_pip(image, "accelerate"), ACCELERATE_MIXED_PRECISION=str(cfg.get("mixed_precision", "no")))

    return Plugin.create("accelerate").with_image_transform(transform).with_launcher(launcher)
