"""What a pool is made of: Spec, Nodes, Image, PipIndex, Worker and Options.

All frozen dataclasses, validated on construction so that a bad value fails at the line that
wrote it, with the value, the rule and the next step in the message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict

from . import defaults
from .errors import ConfigError, NoOfferError

if TYPE_CHECKING:
    from .accelerators import Accelerator

Allocation = Literal["spot-if-available", "spot", "on-demand", "cheapest"]
Selection = Literal["cheapest", "first"]
ConsoleMode = Literal["rich", "minimal", "log", "silent"]
Executor = Literal["auto", "thread", "process"]
# The reference API's names for these (exported as sky.AllocationStrategy, ...).
AllocationStrategy: TypeAlias = Allocation
SelectionStrategy: TypeAlias = Selection
WorkerExecutor: TypeAlias = Executor
Architecture = Literal["x86_64", "arm64"]

_ALLOCATIONS = ("spot-if-available", "spot", "on-demand", "cheapest")
_ARCHITECTURES = ("x86_64", "arm64")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} is not valid: it must be an integer >= {minimum}.")
    return value


@dataclass(frozen=True, slots=True)
class Nodes:
    """How many nodes: ``desired`` to run, ``min`` needed before work starts, ``max`` to grow to."""

    desired: int
    max: int | None = None
    min: int | None = None

    def __post_init__(self) -> None:
        _positive_int("Nodes.desired", self.desired, minimum=0)
        if self.desired == 0 and (isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1):
            # Scale to zero: a pool that provisions on its first task and sleeps when idle.
            raise ConfigError(
                f"Nodes(desired=0, max={self.max!r}) is not valid: a pool that starts with no node "
                f"wakes on its first task and grows up to max, so max must be an int >= 1, "
                f"e.g. sky.Nodes(desired=0, max=4) or nodes=(0, 4)."
            )
        if self.min is not None:
            # min=0: work may start before any node is ready (they join as they come).
            _positive_int("Nodes.min", self.min, minimum=0)
            if self.min > self.desired:
                raise ConfigError(
                    f"Nodes(min={self.min}, desired={self.desired}) is not valid: min is how many "
                    f"nodes must be ready before work starts, so it cannot exceed desired."
                )
        if self.max is not None:
            _positive_int("Nodes.max", self.max)
            if self.max < self.desired:
                raise ConfigError(
                    f"Nodes(desired={self.desired}, max={self.max}) is not valid: max is the "
                    f"ceiling, so it must be >= desired."
                )

    @classmethod
    def of(cls, value: NodeSpec) -> Nodes:
        if isinstance(value, Nodes):
            return value
        if isinstance(value, tuple) and len(value) == 2:
            return cls(desired=value[0], max=value[1])
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"nodes={value!r} is not valid: use an int (nodes=4), a (start, max) tuple "
                f"(nodes=(2, 8)) or sky.Nodes(desired=..., min=..., max=...)."
            )
        if value < 1:
            raise ConfigError(
                f"nodes={value} is not valid: a pool needs at least 1 node. Use nodes=1 or more."
            )
        return cls(desired=value)

    @property
    def floor(self) -> int:
        """The fewest nodes an elastic pool (one with a ``max``) shrinks to when idle: ``min``
        when given (``min=0``: it reaps to zero, head included, and its next task wakes it),
        else ``desired``."""
        return self.desired if self.min is None else self.min

    @property
    def elastic(self) -> bool:
        """Whether the size can move between ``floor`` and ``max`` (the autoscaler runs):
        ``Nodes(desired=5, min=0, max=5)`` does (5 to 0)."""
        return self.max is not None and self.max > self.floor


# How many nodes: a count, a (start, max) elastic range, or sky.Nodes(...).
NodeSpec: TypeAlias = int | tuple[int, int] | Nodes


@dataclass(frozen=True, slots=True)
class PipIndex:
    """An extra package index, used only for the packages listed."""

    url: str
    packages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", tuple(self.packages))
        if not self.url.startswith(("http://", "https://", "file://")):
            raise ConfigError(f"PipIndex(url={self.url!r}) is not valid: the url must start with https://, http:// or file://.")


@dataclass(frozen=True, slots=True)
class Image:
    """The environment on every node."""

    python: str = "auto"
    pip: tuple[str, ...] = ()
    pip_indexes: tuple[PipIndex, ...] = ()
    apt: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    shell_vars: Mapping[str, str] = field(default_factory=dict)
    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    skyward_source: str = "auto"
    # What the agents sample and stream as Metric events: sky.metrics.Default() unless
    # given; None turns collection off.
    metrics: Any = field(default_factory=lambda: _default_metrics())
    bootstrap_timeout: int = 300

    def __post_init__(self) -> None:
        for name in ("pip", "pip_indexes", "apt", "includes", "excludes"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(
                    f"Image({name}={value!r}) is not valid: {name} is a list of strings. "
                    f"Write {name}=[{value!r}]."
                )
            object.__setattr__(self, name, tuple(value))
        for name in ("env", "shell_vars"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ConfigError(f"Image({name}=...) must map strings to strings, got {value!r}.")
            object.__setattr__(self, name, dict(value))
        for name in ("env", "shell_vars"):
            for key in getattr(self, name):
                _check_shell_name(name, key)
        for key, value in self.env.items():
            if "\0" in value:
                raise ConfigError(
                    f"Image(env={{{key!r}: ...}}) is not valid: its value (not shown: it may be a secret) "
                    f"holds a NUL byte, which an environment variable cannot hold. "
                    f"Remove it (or encode the value, e.g. base64)."
                )
        for entry in self.apt:
            _check_apt(entry)
        from .metrics import normalize

        object.__setattr__(self, "metrics", normalize(self.metrics))
        if self.python != "auto" and not _is_version(self.python):
            raise ConfigError(f"Image(python={self.python!r}) is not valid: use 'auto' or a version such as '3.12'.")
        if self.python != "auto" and _version_tuple(self.python)[:2] < MIN_PYTHON:
            raise ConfigError(
                f"Image(python={self.python!r}) is not valid: the nodes run skyward's agent, which needs "
                f"Python {'.'.join(map(str, MIN_PYTHON))} or newer. Use 'auto' (this machine's version) "
                f"or e.g. '3.12'."
            )

    def __hash__(self) -> int:
        return hash((self.python, self.pip, self.apt, tuple(sorted(self.env.items())), self.includes))


# A name bash can export: the nodes source Image.env and shell_vars as `export NAME=...` lines.
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What apt-get install takes as a package, as Debian names them (policy 5.6.1, 5.6.12): a name
# ([a-z0-9][a-z0-9+.-]+), an optional :architecture, an optional =version. Nothing that starts
# with "-" (apt-get options such as -o APT::Update::Pre-Invoke::=..., which run commands as root)
# and no "/" (apt-get installs a path to a .deb as it is).
_APT_ENTRY = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?(?:=[0-9][A-Za-z0-9.+~:_-]*)?")


def _check_shell_name(field_name: str, key: str) -> None:
    if not _SHELL_NAME.fullmatch(key):
        raise ConfigError(
            f"Image({field_name}={{{key!r}: ...}}) is not valid: {field_name} names must be shell variable "
            f"names, [A-Za-z_][A-Za-z0-9_]* (letters, digits and '_', not starting with a digit). Rename it, "
            f"e.g. {re.sub(r'[^A-Za-z0-9_]', '_', key).lstrip('0123456789') or 'MY_VAR'!r}."
        )


def _check_apt(entry: str) -> None:
    if not isinstance(entry, str) or not _APT_ENTRY.fullmatch(entry):
        raise ConfigError(
            f"Image(apt=[{entry!r}]) is not valid: each entry is one Debian package name, optionally "
            f"with :architecture and =version (lowercase letters, digits, '+', '-', '.'; e.g. 'git', "
            f"'libc6:amd64', 'git=1:2.39.2-1'), never an apt-get option or a path. Write one package per "
            f"entry; install a local .deb on the hosts yourself, or through a plugin's bootstrap op."
        )


def _default_metrics() -> Any:
    from .metrics import Default

    return Default()


# The Image of a pool that names none: the client's Python, skyward itself, nothing else.
DEFAULT_IMAGE = Image()


# The oldest Python the agent runs on (the package's requires-python).
MIN_PYTHON = (3, 11)


def _version_tuple(value: str) -> tuple[int, ...]:
    return tuple(int(p) for p in value.split("."))


def _is_version(value: str) -> bool:
    parts = value.split(".")
    return 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


@dataclass(frozen=True, slots=True)
class Worker:
    """How a node runs tasks: ``concurrency`` slots, ``buffer`` prefetched tasks, the executor."""

    concurrency: int = 1
    buffer: int = 0
    executor: WorkerExecutor = "auto"
    reuse_processes: bool = True

    def __post_init__(self) -> None:
        _positive_int("Worker.concurrency", self.concurrency)
        _positive_int("Worker.buffer", self.buffer, minimum=0)
        if self.executor not in ("auto", "thread", "process"):
            raise ConfigError(
                f"Worker(executor={self.executor!r}) is not valid: use 'thread' (default), "
                f"'process' (CPU-bound Python, hard timeouts) or 'auto'."
            )

    @property
    def resolved_executor(self) -> Literal["thread", "process"]:
        return "process" if self.executor == "process" else "thread"

    def agent_settings(self) -> dict[str, Any]:
        """What the agent needs to start this node's worker processes."""
        if self.resolved_executor == "process":
            return {"processes": self.concurrency, "threads": 1, "capacity": 1,
                    "exclusive": True, "reuse": self.reuse_processes}
        return {"processes": 1, "threads": self.concurrency,
                "capacity": self.concurrency + self.buffer, "exclusive": False, "reuse": True}

    @property
    def slots(self) -> int:
        return self.concurrency + self.buffer


@dataclass(frozen=True, slots=True)
class Options:
    """Operational settings of a pool."""

    selection: SelectionStrategy = "cheapest"
    worker: Worker | None = None
    provision_timeout: int | None = None
    ssh_timeout: int | None = None
    bootstrap_timeout: int | None = None
    provision_retry_delay: float | None = None
    max_provision_attempts: int | None = None
    ssh_retry_interval: int | None = None
    # None: a task runs as long as it takes, like a function call (set it, or timeout= per
    # function, to have long tasks cancelled on the node).
    default_compute_timeout: float | None = None
    autoscale_cooldown: float = 30.0
    autoscale_idle_timeout: float = 60.0
    reconcile_tick_interval: float = 15.0
    shutdown_timeout: float = 120.0
    console: bool | ConsoleMode = True
    logging: Any = True
    cluster: bool | None = None
    retry_on_interruption: int = 3
    health_checker: Any = None
    # Serve the pool's Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port),
    # or at "HOST:PORT" (an address other machines reach: anyone there can read them).
    metrics_port: int | str | None = None
    # Where CUDA tensors this program receives (results, streamed items, collection values)
    # land: "auto", on its GPU where it has CUDA, else on the CPU (said once); "cpu", on the
    # CPU always (results to be saved, not computed on), while this pool is open.
    tensor_device: Literal["auto", "cpu"] = "auto"

    def __post_init__(self) -> None:
        if self.selection not in ("cheapest", "first"):
            raise ConfigError(f"Options(selection={self.selection!r}) is not valid: use 'cheapest' or 'first'.")
        if self.worker is not None and not isinstance(self.worker, Worker):
            raise ConfigError(f"Options(worker={self.worker!r}) is not valid: pass sky.Worker(...).")
        if self.health_checker is not None:
            from .health import HealthChecker

            if not isinstance(self.health_checker, HealthChecker):
                raise ConfigError(
                    f"Options(health_checker={self.health_checker!r}) is not valid: pass "
                    f"sky.HealthChecker(fn, interval=..., ...) with fn(info) returning True when healthy."
                )
        if self.max_provision_attempts is not None:
            _positive_int("Options.max_provision_attempts", self.max_provision_attempts)
        if self.default_compute_timeout is not None and self.default_compute_timeout <= 0:
            raise ConfigError(
                f"Options(default_compute_timeout={self.default_compute_timeout!r}) is not valid: "
                f"use a positive number of seconds, or None for no limit."
            )
        if self.metrics_port is not None:
            _metrics_port(self.metrics_port)
        if self.tensor_device not in ("auto", "cpu"):
            raise ConfigError(
                f"Options(tensor_device={self.tensor_device!r}) is not valid: use 'auto' (CUDA tensors on "
                f"this machine's GPU where it has CUDA, else on the CPU) or 'cpu' (on the CPU always)."
            )
        for name in SESSION_OPTIONS:
            check_session_option("Options", name, getattr(self, name))


def _metrics_port(value: int | str) -> None:
    port: Any = value
    if isinstance(value, str):
        port = value.rpartition(":")[2]
        port = int(port) if port.isdigit() and ":" in value else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            f"Options(metrics_port={value!r}) is not valid: give a port from 0 to 65535 (served on "
            f"127.0.0.1; 0 picks a free one) or 'HOST:PORT' to listen elsewhere."
        )


# The options that concern a whole session rather than one pool: sky.Session takes them as
# keywords too, as the reference project's Session does.
SESSION_OPTIONS = ("console", "logging", "shutdown_timeout")


def check_session_option(where: str, name: str, value: Any) -> None:
    """Refuse a bad value of one of SESSION_OPTIONS, naming it as the caller wrote it
    (``where`` is "Options" or "sky.Session")."""
    if name == "console" and value not in (True, False, "rich", "minimal", "log", "silent"):
        raise ConfigError(
            f"{where}(console={value!r}) is not valid: use 'rich', 'minimal', 'log', 'silent', True or "
            f"False (False or 'silent' for no console)."
        )
    if name == "logging" and not isinstance(value, bool):
        from .observe.logs import LogConfig

        if not isinstance(value, LogConfig):
            raise ConfigError(
                f"{where}(logging={value!r}) is not valid: use True (defaults), False (leave logging "
                f"to your application) or sky.LogConfig(level=..., ...)."
            )
    if name == "shutdown_timeout" and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
        raise ConfigError(
            f"{where}(shutdown_timeout={value!r}) is not valid: a positive number of seconds to wait "
            f"for the pool's nodes to stop (default 120)."
        )


# The longest lease an agent takes (skyward.bootstrap.handshake.LEASE_MAX; the agent's side
# does not import this package).
TTL_MAX = 366 * 86400


@dataclass(frozen=True, slots=True)
class Spec:
    """What to provision: a provider and the shape of its nodes."""

    provider: Any = None
    accelerator: Accelerator | str | None = None
    nodes: NodeSpec = 1
    vcpus: float | None = None
    memory_gb: float | None = None
    disk_gb: int | None = None
    architecture: Architecture | None = None
    allocation: AllocationStrategy = "spot-if-available"
    image: Image = field(default_factory=Image)
    region: str | None = None
    max_hourly_cost: float | None = None
    ttl: int = 600
    volumes: tuple[Any, ...] = ()
    plugins: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.provider is None:
            factory = defaults.provider  # sky.Local(), set by the package (skyward/defaults.py)
            if factory is None:
                raise ConfigError(
                    "Spec() without provider= before skyward finished importing: pass a provider, "
                    "e.g. provider=sky.Local()."
                )
            object.__setattr__(self, "provider", factory())
        elif not getattr(self.provider, "is_skyward_provider", False):
            raise ConfigError(
                f"provider={self.provider!r} is not a provider: use sky.Local(), sky.SSH(...), "
                f"sky.AWS(...) or sky.GCP(...) (note the parentheses)."
            )
        if self.accelerator is not None:
            from .accelerators import parse

            object.__setattr__(self, "accelerator", parse(self.accelerator))
        object.__setattr__(self, "nodes", Nodes.of(self.nodes))
        for name in ("vcpus", "memory_gb", "disk_gb", "max_hourly_cost"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"{name}={value!r} is not valid: it must be a positive number.")
        if self.architecture is not None and self.architecture not in _ARCHITECTURES:
            raise ConfigError(f"architecture={self.architecture!r} is not valid: use 'x86_64' or 'arm64'.")
        if self.allocation not in _ALLOCATIONS:
            raise ConfigError(
                f"allocation={self.allocation!r} is not valid: use one of {', '.join(map(repr, _ALLOCATIONS))}."
            )
        if not isinstance(self.image, Image):
            raise ConfigError(f"image={self.image!r} is not valid: pass sky.Image(...).")
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or not 0 <= self.ttl <= TTL_MAX:
            raise ConfigError(f"ttl={self.ttl!r} is not valid: seconds as an int from 0 to {TTL_MAX} "
                              f"(366 days; 0 disables the watchdog).")
        object.__setattr__(self, "volumes", _volumes(self.volumes))
        object.__setattr__(self, "plugins", tuple(self.plugins))

    @property
    def node_spec(self) -> Nodes:
        assert isinstance(self.nodes, Nodes)
        return self.nodes


def select_spec(specs: tuple[Spec, ...], options: Options) -> Spec:
    """The spec to provision: the first viable one, or the one whose pool costs least per hour
    (node price x desired nodes; unknown prices rank last). A provider's ``check`` says why it
    cannot serve a spec (cloud providers: no catalogue offer fits, listing the closest)."""
    viable: list[tuple[float, int, Spec]] = []
    reasons = []
    for order, spec in enumerate(specs):
        why = spec.provider.check(spec)
        cost = spec.provider.hourly_cost(spec) if why is None else None
        cap = spec.max_hourly_cost
        if why is None and cost is not None and cap is not None and cost > cap:
            why = f"${cost:.4g}/h per node is over max_hourly_cost=${cap:g}; raise it or pick smaller nodes"
        if why is not None:
            reasons.append(f"  - {type(spec.provider).__name__}: {why}")
            continue
        if options.selection == "first":
            return spec
        viable.append((float("inf") if cost is None else cost * spec.node_spec.desired, order, spec))
    if not viable:
        raise NoOfferError("no spec can be provisioned:\n" + "\n".join(reasons))
    return min(viable, key=lambda v: (v[0], v[1]))[2]


_A_VOLUME = ("a volume is sky.Volume(bucket, mount) or sky.Disk(size_gb, mount=...), "
             "e.g. volumes=[sky.Disk(100, mount='/data')]")


def _volumes(volumes: Any) -> tuple[Any, ...]:
    """Refuse what is not a list of volumes here, not at provisioning (where a path reads as an
    unsupported sky.Disk)."""
    if not isinstance(volumes, list | tuple):
        raise ConfigError(f"volumes={volumes!r} is not valid: a list of volumes; {_A_VOLUME}.")
    if not volumes:
        return ()  # (skyward.volumes loads only for a spec that has some: 1.5 ms of every start)
    from .volumes import Disk, Volume

    for v in volumes:
        if not isinstance(v, Disk | Volume):
            raise ConfigError(f"volumes={list(volumes)!r} is not valid: {v!r} is not a volume; {_A_VOLUME}.")
    return tuple(volumes)


SPEC_FIELDS = tuple(f.name for f in fields(Spec))
# What a pool is opened from (pool.spec): one Spec, with its provider chosen.
PoolSpec: TypeAlias = Spec


class SpecKwargs(TypedDict, total=False):
    """Spec's fields as keywords: ``sky.Compute(**kwargs)`` and ``Session.compute(**kwargs)``."""

    provider: Any
    accelerator: Accelerator | str | None
    nodes: NodeSpec
    vcpus: float | None
    memory_gb: float | None
    disk_gb: int | None
    architecture: Architecture | None
    allocation: AllocationStrategy
    image: Image
    region: str | None
    max_hourly_cost: float | None
    ttl: int
    volumes: tuple[Any, ...] | list[Any]
    plugins: tuple[Any, ...] | list[Any]


def unknown_field_error(name: str, where: str = "sky.Compute") -> ConfigError:
    import difflib  # only for this message: every client imports this module at start

    close = difflib.get_close_matches(name, [*SPEC_FIELDS, "options", "worker", "name"], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"{where}() got an unexpected keyword {name!r}.{hint} Spec fields are: "
        f"{', '.join(SPEC_FIELDS)}; pool settings go in options=sky.Options(...)."
    )
