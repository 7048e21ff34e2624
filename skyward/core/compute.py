"""Opening pools: sky.Compute (one pool for a `with` block) and sky.Session (several pools)."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Mapping
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, PoolClosedError
from ..spec import (
    SPEC_FIELDS,
    Options,
    PoolSpec,
    Spec,
    Worker,
    check_session_option,
    select_spec,
    unknown_field_error,
)

if TYPE_CHECKING:
    from typing import Unpack

    from ..observe.logs import LogConfig
    from ..spec import ConsoleMode, SpecKwargs
    from .pool import Pool


def _resolve_worker(options: Options, worker: Worker | None) -> Worker:
    if worker is not None and not isinstance(worker, Worker):
        raise ConfigError(f"worker={worker!r} is not valid: pass sky.Worker(...).")
    if worker is not None and options.worker is not None:
        raise ConfigError(
            "worker= was given both to sky.Compute and in sky.Options; give it in one place only."
        )
    return worker or options.worker or Worker()


def _build_specs(specs: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Spec, ...]:
    for s in specs:
        if not isinstance(s, Spec):
            raise ConfigError(
                f"sky.Compute() takes sky.Spec objects positionally, got {s!r}; pass other settings "
                f"as keywords (provider=..., nodes=...)."
            )
    if specs and kwargs:
        raise ConfigError(
            f"sky.Compute() got Spec objects and Spec keywords ({', '.join(sorted(kwargs))}) together; "
            f"use one form: put the keywords inside each sky.Spec(...), or drop the Spec objects."
        )
    if specs:
        return specs
    for key in kwargs:
        if key not in SPEC_FIELDS:
            raise unknown_field_error(key)
    return (Spec(**kwargs),)


def _local(specs: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether the pool described will run on sky.Local() (the default provider)."""
    providers = [getattr(s, "provider", None) for s in specs] if specs else [kwargs.get("provider")]
    return all(p is None or getattr(p, "kind", None) == "local" for p in providers)


def _check_named(name: str, specs: tuple[Any, ...], kwargs: Mapping[str, Any],
                 worker: Worker | None, options: Options) -> None:
    from ..named.pools import check_name

    check_name(name)
    given = [*(["specs"] if specs else []), *sorted(kwargs), *(["worker"] if worker or options.worker else [])]
    if given:
        raise ConfigError(
            f"sky.Compute(name={name!r}) got {', '.join(given)} too: a named pool's settings come "
            f"from [pools.{name}] in skyward.toml (or from the running pool). Move them there, "
            f"or drop name= and describe the pool with keywords."
        )


class Compute:
    """Provision a pool for a ``with`` block and destroy it on the way out.

    ``sky.Compute(nodes=2, ...)`` (Spec fields as keywords) or ``sky.Compute(spec_a, spec_b,
    options=sky.Options(selection="first"))``. Validation happens here, at the call site;
    provisioning happens on ``__enter__``.
    """

    def __init__(
        self,
        *specs: Spec,
        name: str | None = None,
        options: Options | None = None,
        worker: Worker | None = None,
        reproduce: str | None = None,
        strict: bool = False,
        groups: Mapping[str, Spec | tuple[Spec, ...]] | None = None,
        head: str | None = None,
        **kwargs: Unpack[SpecKwargs],
    ) -> None:
        """``reproduce=POOL_ID``: open the pool of that record again, everything pinned (see
        skyward.records.record); ``provider=`` may replace the recorded provider (same kind), ``strict``
        refuses when anything cannot be the same.

        ``groups={"prep": sky.Spec(...), "train": sky.Spec(...)}``: a pool of several kinds of
        node (skyward.core.group), each group a spec (or a tuple of alternatives) of its own;
        ``pool["train"]`` dispatches to one group. ``head`` names the group whose first node
        holds the pool's collections (the first group by default)."""
        if name is None and reproduce is None and groups is None and _local(specs, kwargs):
            from ..providers.local_fork import prestart

            prestart()  # the nodes' fork server loads while this pool is built and opened
        self.name = name
        self.options = options or Options()
        if not isinstance(self.options, Options):
            raise ConfigError(f"options={options!r} is not valid: pass sky.Options(...).")
        self.reproduce, self.strict = reproduce, strict
        self.groups: dict[str, tuple[Spec, ...]] | None = None
        self.head = head
        if groups is not None:
            from .group import check_groups

            _check_grouped(specs, kwargs, name, reproduce)
            self.groups = check_groups(groups, head)
        elif head is not None:
            raise ConfigError(
                f"head={head!r} names a group, and this pool has none: give groups={{...}} too, or "
                f"leave head= out."
            )
        if reproduce is not None:
            _check_reproduce(reproduce, name, specs, kwargs, worker)
            self._provider = kwargs.get("provider")
            kwargs = {}
        elif name is not None:
            _check_named(name, specs, kwargs, worker, self.options)
        self.worker = _resolve_worker(self.options, worker)
        self.specs = _build_specs(specs, kwargs) if self.groups is None else next(iter(self.groups.values()))
        self.label: str | None = None  # set by Session.compute: its name for a pool it describes
        self.pool: Pool | None = None
        self._previous_sigterm: Any = None

    def open(self) -> Pool:
        if self.reproduce is not None:
            return _reproduce(self.reproduce, self._provider, self.options, self.strict)
        if self.name is not None:
            from ..named.pools import open_named

            return open_named(self.name, self.options)
        if self.groups is not None:
            chosen = {name: _checked(select_spec(specs, self.options)) for name, specs in self.groups.items()}
            from .pool import Pool

            return Pool(chosen[self.head or next(iter(chosen))], self.options, self.worker, label=self.label,
                        groups=chosen, head=self.head)
        spec = _checked(select_spec(self.specs, self.options))
        return _open_pool(spec, self.options, self.worker, self.label)

    def __enter__(self) -> Pool:
        self.pool = self.open()
        self._trap_sigterm()
        return self.pool.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.pool is not None:
                self.pool.__exit__(*exc)
        finally:
            self._restore_sigterm()

    def _trap_sigterm(self) -> None:
        # SIGTERM would end the process without running `finally`; turn it into SystemExit so
        # the with-block unwinds and the pool is destroyed.
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.SIG_DFL
            signal.signal(signal.SIGTERM, _raise_exit)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _checked(spec: PoolSpec) -> PoolSpec:
    """What can be refused before anything is provisioned (preflight, plugins, ttl=0)."""
    spec.provider.preflight(spec)  # e.g. no Pulumi CLI: say so before anything is written
    if spec.plugins:
        from ..plugins.compose import validate

        validate(spec.plugins)  # a wrong item fails here, before anything is provisioned
    if spec.ttl == 0:
        warnings.warn(
            "ttl=0 disables the node watchdog: if this program is killed, its nodes keep running "
            "until you stop them yourself.", stacklevel=4,
        )
    return spec


def _check_grouped(specs: tuple[Any, ...], kwargs: Mapping[str, Any], name: str | None,
                   reproduce: str | None) -> None:
    """groups= describes the whole pool: nothing else may describe it too."""
    given = [*(["specs"] if specs else []), *sorted(kwargs), *(["name"] if name is not None else []),
             *(["reproduce"] if reproduce is not None else [])]
    if given:
        raise ConfigError(
            f"sky.Compute(groups=...) got {', '.join(given)} too: with groups, each group's settings "
            f"go in its own sky.Spec(...) (groups={{'prep': sky.Spec(nodes=4), ...}}); named pools and "
            f"reproduced pools of several groups are not supported yet."
        )


def _check_reproduce(pool_id: str, name: str | None, specs: tuple[Any, ...], kwargs: Mapping[str, Any],
                     worker: Worker | None) -> None:
    if not isinstance(pool_id, str) or not pool_id:
        raise ConfigError(f"reproduce={pool_id!r} is not valid: give a pool id (`skyward history` lists them).")
    extra = [*(["name"] if name is not None else []), *(["specs"] if specs else []),
             *sorted(k for k in kwargs if k != "provider"), *(["worker"] if worker is not None else [])]
    if extra:
        raise ConfigError(
            f"sky.Compute(reproduce={pool_id!r}) got {', '.join(extra)} too: a reproduced pool is what its "
            f"record says (provider= alone may replace the provider, with the same kind). To reproduce it "
            f"as a named pool, run `skyward reproduce {pool_id} --name NAME`."
        )


def _reproduce(pool_id: str, provider: Any, options: Options, strict: bool) -> Pool:
    """Open the pool of record ``pool_id`` again; what cannot be the same is said first."""
    from ..records.record import reproduction, say

    rep = reproduction(pool_id, provider=provider)
    say(rep, strict)
    spec = rep.spec
    spec.provider.preflight(spec)
    if spec.plugins:
        from ..plugins.compose import validate

        validate(spec.plugins)
    for other in (rep.groups or {}).values():
        if other is not spec:
            _checked(other)
    with rep.pinned():
        from .pool import Pool

        return Pool(spec, options, rep.worker, groups=rep.groups, head=rep.head)


def _open_pool(spec: PoolSpec, options: Options, worker: Worker, label: str | None = None) -> Pool:
    """A new pool. A provider that can start its nodes at once (Local: processes) starts them
    before the pool's own modules load, so the two overlap; the pool then connects to them.
    That head start is only an optimisation: when it fails, the pool starts its nodes itself
    and reports what goes wrong the usual way."""
    pool_id = os.urandom(4).hex()  # the pool's id (Pool makes one the same way when not given)
    launched = None
    try:
        launched = spec.provider.launch(spec, pool_id)
    except Exception:
        import logging  # (not at the top: the nodes start before the pool's modules, logging included)

        logging.getLogger("skyward").debug("starting the nodes ahead of the pool failed; the pool starts them",
                                           exc_info=True)
    from .pool import Pool

    try:
        return Pool(spec, options, worker, pool_id=pool_id, launched=launched, label=label)
    except BaseException:
        if launched is not None:
            launched.close()  # a pool that failed before it took them (closing twice is harmless)
        raise


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class Session:
    """Several pools with one lifetime: ``session.compute(...)`` opens one; all close together.

    ``console``, ``logging`` and ``shutdown_timeout`` are the options that concern the whole
    session, taken as keywords as the reference project's Session takes them: the values
    ``sky.Options`` accepts, applied over ``options=`` (None: as ``options=`` has it). They are
    the options of every pool the session opens, except a pool given its own ``options=``,
    which is used as it is.

    ``session.compute(..., name="a")`` with the pool described (keywords or Specs) names it
    within the session, as the reference project's Session does: a label, unique among the
    session's open pools, shown in the console, events and record, and what ``stop_pool``
    takes. ``session.compute(name="a")`` alone attaches to the named pool ``a`` of
    skyward.toml, as ``sky.Compute(name="a")`` does."""

    def __init__(self, *, options: Options | None = None, console: bool | ConsoleMode | None = None,
                 logging: LogConfig | bool | None = None, shutdown_timeout: float | None = None) -> None:
        base = Options() if options is None else options
        if not isinstance(base, Options):
            raise ConfigError(f"sky.Session(options={options!r}) is not valid: pass sky.Options(...).")
        given: dict[str, Any] = {}
        for name, value in (("console", console), ("logging", logging), ("shutdown_timeout", shutdown_timeout)):
            if value is not None:
                check_session_option("sky.Session", name, value)
                given[name] = value
        self.options = replace(base, **given)
        self.pools: list[Pool] = []
        self._closed = False

    @property
    def is_active(self) -> bool:
        """True until the session is closed (its pools are closed with it)."""
        return not self._closed

    def compute(self, *specs: Spec, name: str | None = None, options: Options | None = None,
                worker: Worker | None = None, **kwargs: Unpack[SpecKwargs]) -> Pool:
        if self._closed:
            raise PoolClosedError("this session is closed; open pools in a new sky.Session().")
        label = None
        if name is not None and (specs or kwargs):  # the pool is described here: name is a label
            label, name = self._free_label(name), None
        compute = Compute(*specs, name=name, options=options or self.options, worker=worker, **kwargs)
        compute.label = label
        pool = compute.open()
        self.pools.append(pool)
        return pool

    def _free_label(self, label: object) -> str:
        if not isinstance(label, str) or not label.strip():
            raise ConfigError(
                f"session.compute(name={label!r}) is not valid: a pool's name in a session is a "
                f"non-empty string, e.g. name='train'."
            )
        taken = self._find(label)
        if taken is not None:
            raise ConfigError(
                f"session.compute(name={label!r}): this session already has a pool called {label!r} "
                f"(id {taken.id}); give each pool its own name, or stop that one first with "
                f"session.stop_pool({label!r})."
            )
        return label

    def _find(self, name: str) -> Pool | None:
        return next((p for p in self.pools if name in (p.label, p.name)), None)

    def stop_pool(self, pool: str | Pool) -> None:
        """Close one of the session's pools now, by its name in the session (or the Pool): its
        nodes are destroyed (a named pool it attached to is only let go); the others go on."""
        found = pool if not isinstance(pool, str) else self._find(pool)
        if found is None or found not in self.pools:
            names = ", ".join(repr(p.label or p.name or p.id) for p in self.pools) or "none"
            raise ConfigError(
                f"session.stop_pool({pool!r}): this session has no pool called {pool!r} "
                f"(its pools: {names}); name one of them, or pass the Pool itself."
            )
        self.pools.remove(found)
        found.close()

    def close(self) -> None:
        self._closed = True
        while self.pools:
            self.pools.pop().close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Compute", "Session"]
