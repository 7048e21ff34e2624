"""``skyward.toml`` (``[pools.NAME]``) and ``~/.skyward/defaults.toml``, validated with pydantic.

A pool's settings come from three layers, later ones winning: ``defaults.toml`` (the keys of a
pool table, at top level), the ``[pools.NAME]`` table of the project's ``skyward.toml`` (found in
the current directory or a parent), and command-line flags. Every layer is checked on its
own, so an error names the file, the key, the value and the rule it broke.

This module imports pydantic: the CLI and ``sky.Compute(name=...)`` load it when they read
files, never ``import skyward``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from ..paths import skyward_home
from ..providers import PROVIDERS, provider_class
from .registry import check_name

PROJECT_FILE = "skyward.toml"


class _Table(BaseModel):
    # TOML values are typed already: no "2" -> 2 coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PipIndexTable(_Table):
    url: str
    packages: list[str] = []


class ImageTable(_Table):
    python: str = "auto"
    pip: list[str] = []
    pip_indexes: list[PipIndexTable] = []
    apt: list[str] = []
    env: dict[str, str] = {}
    shell_vars: dict[str, str] = {}
    includes: list[str] = []
    excludes: list[str] = []
    metrics: bool = True  # false turns node metrics off


class WorkerTable(_Table):
    concurrency: int = Field(default=1, ge=1)
    buffer: int = Field(default=0, ge=0)
    executor: Literal["auto", "thread", "process"] = "auto"
    reuse_processes: bool = True


class NodesTable(_Table):
    desired: int = Field(ge=0)  # 0: the pool sleeps with no node and wakes on its first task
    min: int | None = Field(None, ge=1)
    max: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _range(self) -> NodesTable:
        if self.desired == 0 and self.max is None:
            raise ValueError(NODES_RULE)
        if self.max is not None and self.max < self.desired:
            raise ValueError(f"max ({self.max}) is the ceiling, so it must be >= desired ({self.desired})")
        return self


class ServeTable(_Table):
    """``[pools.NAME.serve]``: what ``skyward serve NAME`` serves when the command names no app."""

    app: str | None = None  # 'module:attribute'
    factory: bool = False  # the attribute is a function that returns the app
    host: str | None = None
    port: int | None = Field(default=None, ge=0, le=65535)
    replicas_per_node: int | None = Field(default=None, ge=1)
    ready: str | None = None  # a path that answers 200 once a replica is ready ('/health')
    timeout: float | None = Field(default=None, gt=0)
    idle_timeout: float | None = Field(default=None, gt=0)  # an elastic pool shrinks (or sleeps) after
    on: Literal["client", "head"] | None = None  # where the router runs (pool.serve(on=...))
    allow_from: list[str] | None = None  # CIDRs the head's port is opened to (on = "head", a fixed port)


class _SpecTable(_Table):
    """What one kind of node is made of: a ``[pools.NAME]`` table, or one of its groups."""

    provider: Literal["local", "ssh", "slurm", "container", "aws", "gcp"] = "local"
    nodes: Any = 1
    accelerator: str | None = None
    vcpus: float | None = Field(None, gt=0)
    memory_gb: float | None = Field(None, gt=0)
    disk_gb: int | None = Field(None, gt=0)
    architecture: Literal["x86_64", "arm64"] | None = None
    allocation: Literal["spot-if-available", "spot", "on-demand", "cheapest"] = "spot-if-available"
    region: str | None = None
    max_hourly_cost: float | None = Field(None, gt=0)
    ttl: int = Field(600, ge=0)
    image: ImageTable = ImageTable()
    worker: WorkerTable = WorkerTable()
    # Provider settings, in a sub-table named after the provider: [pools.NAME.ssh] hosts = [...]
    local: dict[str, Any] = {}
    ssh: dict[str, Any] = {}
    slurm: dict[str, Any] = {}  # [pools.NAME.slurm] login = "me@login.hpc.example.edu"
    container: dict[str, Any] = {}  # [pools.NAME.container] image = "localhost/my-image:1"
    aws: dict[str, Any] = {}
    gcp: dict[str, Any] = {}

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        if _count(value, 1):
            return value
        if (isinstance(value, list) and len(value) == 2 and _count(value[0], 0) and _count(value[1], 1)
                and value[0] <= value[1]):
            return value
        if isinstance(value, dict):
            return NodesTable.model_validate(value).model_dump(exclude_none=True)
        raise ValueError(NODES_RULE)

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, value: str | None) -> str | None:
        if value is not None:
            from ..accelerators import parse

            parse(value)  # AcceleratorError is a ValueError: pydantic reports it with the key
        return value


class GroupTable(_SpecTable):
    """``[pools.NAME.groups.GROUP]``: one group of a pool, with what a pool of one spec takes."""


class PoolTable(_SpecTable):
    """One ``[pools.NAME]`` table (or the whole of defaults.toml)."""

    serve: ServeTable = ServeTable()
    # A pool of several groups: [pools.NAME.groups.prep], [pools.NAME.groups.train]; the keys at
    # [pools.NAME] are then what every group has unless its own table says otherwise.
    groups: dict[str, GroupTable] = {}
    head: str | None = None  # the group whose first node holds the collections (the first by default)

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: dict[str, GroupTable]) -> dict[str, GroupTable]:
        for name in value:
            if not GROUP_NAME.fullmatch(name):
                raise ValueError(
                    f"group name {name!r} is not valid: a name starts with a letter and has up to 32 "
                    f"letters, digits, '-' or '_' (e.g. 'prep', 'train-a100')"
                )
        return value

    @model_validator(mode="after")
    def _head(self) -> PoolTable:
        if self.head is not None and self.head not in self.groups:
            groups = ", ".join(map(repr, self.groups)) or "none: head needs [pools.NAME.groups.GROUP] tables"
            raise ValueError(f"head = {self.head!r} names no group of this pool (its groups: {groups})")
        return self


GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


NODES_RULE = (
    "nodes must be an integer >= 1 (nodes = 2), a [desired, max] pair with 0 <= desired <= max and "
    "max >= 1 (nodes = [2, 8]; nodes = [0, 4] sleeps with no node when idle and wakes on its first "
    "task) or a table (nodes = { desired = 4, min = 2, max = 8 })"
)


def _count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def parse_nodes(text: str) -> int | list[int]:
    """``--nodes``: ``N`` (a fixed size, N >= 1) or ``DESIRED:MAX`` (elastic: starts with DESIRED,
    grows up to MAX while tasks wait, shrinks back to DESIRED when idle; DESIRED 0 sleeps with no
    node). The TOML value it stands for: ``N`` or ``[DESIRED, MAX]``."""
    parts = text.strip().split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1 and numbers[0] >= 1:
        return numbers[0]
    if len(numbers) == 2 and 0 <= numbers[0] <= numbers[1] and numbers[1] >= 1:
        return numbers
    raise ConfigError(
        f"command line: --nodes {text!r} is not valid: give N, a fixed number of nodes >= 1 (--nodes 2), or "
        f"DESIRED:MAX with 0 <= DESIRED <= MAX and MAX >= 1, an elastic pool that starts with DESIRED "
        f"nodes and grows up to MAX (--nodes 2:8); --nodes 0:4 starts with no node, wakes on the first "
        f"task and sleeps again when idle."
    )


# -- where the files are -------------------------------------------------------------------------
def find_project_file(start: Path | None = None) -> Path | None:
    """``skyward.toml`` in ``start`` (default: the current directory) or the nearest parent."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
    return None


def defaults_file() -> Path:
    return skyward_home() / "defaults.toml"


# -- reading and checking ------------------------------------------------------------------------
def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}). Fix the syntax at that line.") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}).") from None


def _explain(exc: ValidationError, source: str, table: str, raw: dict[str, Any]) -> ConfigError:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
        key = ".".join(loc)
        where = f"{source}: [{table}] " if table else f"{source}: "
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"{where}unknown key {key!r}.{hint} Allowed keys here: {', '.join(allowed)}.")
            continue
        rule = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}{key} = {err.get('input')!r}: {rule}.")
    return ConfigError("\n".join(lines))


def _allowed_keys(path: list[str]) -> list[str]:
    model: Any = PoolTable
    parts = iter(path)
    for part in parts:
        if part == "groups" and model is PoolTable:
            if next(parts, None) is None:
                return []  # the group names themselves: any valid name
            model = GroupTable
            continue
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif part == "pip_indexes":
            model = PipIndexTable
        elif part == "nodes":
            model = NodesTable
        else:
            return []
    return sorted(model.model_fields)


def check_table(raw: dict[str, Any], source: str, table: str = "") -> PoolTable:
    """Validate one layer on its own (a file's pool table, defaults.toml, the flags)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [{table}] must be a table of settings, got {raw!r}.")
    try:
        model = PoolTable.model_validate(raw)
    except ValidationError as exc:
        raise _explain(exc, source, table, raw) from None
    for kind in PROVIDERS:
        options = raw.get(kind)
        if options:
            _check_provider_options(kind, options, source, f"{table}.{kind}" if table else kind)
        for group, settings in (raw.get("groups") or {}).items():
            options = settings.get(kind)
            if options:
                where = f"{table}.groups.{group}.{kind}" if table else f"groups.{group}.{kind}"
                _check_provider_options(kind, options, source, where)
    return model


def _check_provider_options(kind: str, options: dict[str, Any], source: str, table: str) -> None:
    cls = provider_class(kind)
    if not is_dataclass(cls):
        return
    allowed = sorted(f.name for f in fields(cls))
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source}: [{table}] unknown key {key!r}.{hint} {cls.__name__} takes: "
                f"{', '.join(allowed) or 'no settings'}."
            )


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; tables (image, worker, provider settings) merge key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "nodes":
                out[key] = merge(out[key], value)
            else:
                out[key] = value
    return out


@dataclass(frozen=True)
class PoolConfig:
    """A named pool's settings after merging the layers: plain TOML data, kept in the registry."""

    name: str
    data: dict[str, Any]
    sources: tuple[str, ...]  # the files it came from, for messages

    @property
    def table(self) -> PoolTable:
        return PoolTable.model_validate(self.data)

    @property
    def groups(self) -> dict[str, dict[str, Any]]:
        """Each group's settings, name -> the data of one spec (``load`` merged them); a pool
        without ``[pools.NAME.groups.*]`` tables has none."""
        return dict(self.data.get("groups") or {})

    @property
    def head(self) -> str | None:
        return self.data.get("head")


# The keys of [pools.NAME] that are the pool's, not what each group is made of.
POOL_KEYS = ("groups", "head", "serve")


def with_groups(data: dict[str, Any], flags: dict[str, Any] | None) -> dict[str, Any]:
    """A pool's merged data with each group's own settings complete: the pool-level keys, then
    the group's table, then the command line's flags (they apply to every group)."""
    groups = data.get("groups")
    if not groups:
        return data
    if flags and "nodes" in flags:
        raise ConfigError(
            f"command line: --nodes does not apply to a pool of several groups (its groups: "
            f"{', '.join(map(repr, groups))}); set nodes in each [pools.NAME.groups.GROUP] table, or "
            f"change a running group's size with `skyward resize NAME --group GROUP N`."
        )
    base = {k: v for k, v in data.items() if k not in POOL_KEYS}
    whole = {name: merge(base, table, flags or {}) for name, table in groups.items()}
    return {**data, "groups": whole}


def load(name: str, *, project: Path | None = None, flags: dict[str, Any] | None = None,
         require: bool = True) -> PoolConfig:
    """The settings of pool ``name``: defaults.toml < skyward.toml [pools.NAME] < ``flags``.

    With ``require``, a name that no skyward.toml defines (and no flags describe) is an error.
    """
    check_name(name)
    layers: list[dict[str, Any]] = []
    sources: list[str] = []
    dfile = defaults_file()
    if dfile.is_file():
        raw = _read_toml(dfile)
        check_table(raw, str(dfile))
        layers.append(raw)
        sources.append(str(dfile))
    pfile = project if project is not None else find_project_file()
    table: dict[str, Any] | None = None
    if pfile is not None:
        doc = _read_toml(pfile)
        unknown = sorted(set(doc) - {"pools"})
        if unknown:
            raise ConfigError(
                f"{pfile}: unknown top-level key {unknown[0]!r}; skyward.toml holds pool tables "
                f"only, as [pools.NAME]."
            )
        pools = doc.get("pools", {})
        if not isinstance(pools, dict):
            raise ConfigError(f"{pfile}: 'pools' must be tables, written [pools.NAME].")
        for other in pools:
            check_name(other)
        table = pools.get(name)
        if table is not None:
            check_table(table, str(pfile), f"pools.{name}")
            layers.append(table)
            sources.append(str(pfile))
    if flags:
        check_table(flags, "command line")
        layers.append(flags)
        sources.append("command line")
    if require and table is None and not flags:
        where = str(pfile) if pfile is not None else f"no {PROJECT_FILE} in {Path.cwd()} or its parents"
        raise ConfigError(
            f"pool {name!r} is not running and not defined ({where}). Add a [pools.{name}] table "
            f"to {PROJECT_FILE}, or start it with `skyward up {name} --provider local --nodes 2`."
        )
    data = with_groups(merge(*layers), flags)
    check_table(data, " + ".join(sources) or "defaults")
    return PoolConfig(name, data, tuple(sources))


def load_flags(flags: dict[str, Any], name: str = "preview") -> PoolConfig:
    """A pool described by command-line flags alone: defaults.toml < ``flags``, no skyward.toml
    table (``skyward preview --provider aws ...`` without a pool name)."""
    layers: list[dict[str, Any]] = []
    sources: list[str] = []
    dfile = defaults_file()
    if dfile.is_file():
        raw = _read_toml(dfile)
        check_table(raw, str(dfile))
        layers.append(raw)
        sources.append(str(dfile))
    check_table(flags, "command line")
    layers.append(flags)
    sources.append("command line")
    data = merge(*layers)
    check_table(data, " + ".join(sources))
    return PoolConfig(name, data, tuple(sources))


def defined_pools(project: Path | None = None) -> dict[str, dict[str, Any]]:
    pfile = project if project is not None else find_project_file()
    if pfile is None:
        return {}
    pools = _read_toml(pfile).get("pools", {})
    return pools if isinstance(pools, dict) else {}


def describe_source(project: Path | None = None) -> str:
    pfile = project if project is not None else find_project_file()
    return str(pfile) if pfile else f"(no {PROJECT_FILE} found from {os.getcwd()})"
