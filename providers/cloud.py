"""What the cloud providers (AWS, GCP) share: the checks before a stack exists, and the one
path from a stack's nodes to running agents -- the SSH bootstrap.

Not a provider itself; ``aws.py`` and ``gcp.py`` use it so that neither imports the other.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Cluster, ProviderConfig

if TYPE_CHECKING:
    from skyward.catalogue import Offer
    from skyward.records.pkglock import Package
    from skyward.spec import Options, Spec
    from skyward.stacks.cloudpool import CloudGroup, CloudPool


def preflight(what: str, extra: str, modules: tuple[str, ...], *, fake_workspace: bool = False) -> None:
    """Everything a cloud pool needs on this machine, checked before anything is written."""
    from skyward.stacks.cli import require_cli, require_sdk

    if not fake_workspace:
        require_sdk(what, extra, modules)
        require_cli(f"a {what} pool")


# The oldest provider SDK each stack program is written for (pyproject.toml's extras say the same;
# a test keeps them equal). Pulumi installs the resource plugin of the SDK's own version
# (plugin_version), so the SDK's version is the provider's. pulumi-gcp before 8 is built on
# terraform-provider-google 5.x, whose schema has no scheduling.termination_time (6.25.0), which
# max_duration uses; the floors are the versions the test suite runs with.
SDK_FLOORS = {"pulumi-aws": "7.51", "pulumi-gcp": "10.2"}


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_sdk_floor(package: str) -> None:
    """ConfigError when the installed provider SDK is older than the stack program needs."""
    from skyward.errors import ConfigError

    floor = SDK_FLOORS.get(package)
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return  # require_sdk says what to install
    if floor and _version_tuple(installed) < _version_tuple(floor):
        raise ConfigError(
            f"{package} {installed} is installed; skyward's stack programs need {package}>={floor} "
            f"(older providers lack arguments they declare, e.g. scheduling.termination_time). "
            f"Upgrade: pip install -U '{package}>={floor}'"
        )


def plugin_version(name: str, package: str) -> dict[str, str]:
    """{plugin: version} of the Pulumi resource plugin matching the installed SDK package."""
    try:
        return {name: importlib.metadata.version(package)}
    except importlib.metadata.PackageNotFoundError:
        return {}


def require_preview_sdk(what: str, extra: str, modules: tuple[str, ...], spec: Spec, offer: Offer) -> None:
    """A preview runs the stack program under Pulumi's mocks: it needs the SDK (not the CLI).
    Without it, say what the pool would be and cost, and how to get the resource list."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        from skyward.errors import PulumiNotFoundError

        nodes = spec.node_spec.desired
        price = offer.price(spec.allocation)
        cost = "" if price is None else f", ${price * nodes:,.2f}/h for {nodes} node(s)"
        raise PulumiNotFoundError(
            f"the pool would use {offer}{cost}; listing the resources of its stack runs {what}'s "
            f"stack program, which needs the Python package(s) {', '.join(missing)} (not installed). "
            f"Install the extra: pip install 'skyward[{extra}]' (no Pulumi CLI or credentials "
            f"needed for a preview)."
        )


def _hooks(ssh: Any, cloud: CloudPool | CloudGroup, kind: str) -> dict[str, Any]:
    """What ties an SSHCluster to its stack: growing and shrinking are stack updates, closing
    destroys the stack, and the description carries what reopens it in another process."""
    host = ssh.SSHHost
    return {
        "grow": lambda count: [host(**n.host_fields()) for n in cloud.grow(count)],
        "shrink": cloud.shrink,
        "on_close": cloud.close,
        "kind": kind,
        "describe_extra": lambda: {"stack": cloud.describe()},
    }


def _heal_hook(cluster: Any, ssh: Any, cloud: CloudPool | CloudGroup) -> None:
    """A lost node that does not answer is replaced by one stack update (skyward.core.healing),
    unless the pool's max_duration deadline is near (Cluster.no_growth: no node starts then).
    Also the cluster's firewall: the stack, which opens a node's port with an update."""
    cluster.deadline = cloud.plan.expires
    cluster.firewall = cloud  # pool.serve(on="head", allow_from=...) opens the head's port through it

    def replace_host(host: Any) -> tuple[Any, str | None]:
        address, reclaimed = cloud.replace(host)
        return ssh.SSHHost(**address.host_fields()), reclaimed

    cluster.replace_host = replace_host


def _lock_hooks(cluster: Any, cloud: CloudPool | CloudGroup) -> Any:
    """The pool's record reads the image id, instance type and region from the stack's plan, and
    writes the finished lock back into the stack config."""
    cluster.cloud_lock = cloud.lock_facts
    cluster.keep_lock = cloud.keep_lock
    cluster.node_architecture = cloud.plan.architecture  # the lock resolves for the nodes' platform
    return cluster


def ssh_cluster(spec: Spec, pool_id: str, cloud: CloudPool, options: Options | None = None,
                install: str = "index", kind: str = "aws", pin: tuple[Package, ...] | None = None,
                fanout: bool = False) -> Cluster:
    """Bring the stack up and hand its nodes to the SSH bootstrap: stack outputs -> hosts ->
    bootstrap -> agents, the same path as sky.SSH. Closing the cluster destroys the stack."""
    ssh: Any = importlib.import_module("skyward.providers.ssh")
    host = ssh.SSHHost

    nodes = cloud.start(spec.node_spec.desired)
    try:
        cluster: Cluster = ssh.SSHCluster(
            spec, pool_id, [host(**n.host_fields()) for n in nodes], options=options, install=install, pin=pin,
            fanout=fanout, **_hooks(ssh, cloud, kind),
        )
        _lock_hooks(cluster, cloud)
        _heal_hook(cluster, ssh, cloud)
    except BaseException:
        cloud.close()
        raise
    return cluster


def ssh_clusters(specs: dict[str, Spec], pool_id: str, cloud: CloudPool, options: Options | None = None,
                 install: str = "index", kind: str = "aws",
                 pin: tuple[Package, ...] | None = None, fanout: bool = False) -> dict[str, Cluster]:
    """A pool of several groups in one stack: one update brings every group's nodes up, then
    each group's nodes go through the SSH bootstrap as that group's own cluster (all at once),
    which grows, shrinks, heals and closes through its view of the stack (CloudGroup). When any
    group fails, the clusters made are closed and the stack destroyed."""
    import threading

    ssh: Any = importlib.import_module("skyward.providers.ssh")
    host = ssh.SSHHost
    nodes = cloud.start_groups({g: spec.node_spec.desired for g, spec in specs.items()})
    made: dict[str, Cluster] = {}
    errors: list[BaseException] = []

    def bootstrap(name: str) -> None:
        try:
            view = cloud.group(name)
            cluster: Cluster = ssh.SSHCluster(
                specs[name], f"{pool_id}-{name}", [host(**n.host_fields()) for n in nodes[name]], options=options,
                install=install, pin=pin, fanout=fanout, **_hooks(ssh, view, kind),
            )
            _lock_hooks(cluster, view)
            _heal_hook(cluster, ssh, view)
            made[name] = cluster
        except BaseException as exc:
            exc.add_note(f"(while bootstrapping group {name!r} of stack {cloud.plan.stack})")
            errors.append(exc)

    threads = [threading.Thread(target=bootstrap, args=(g,), name=f"skyward-group-{g}", daemon=True) for g in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for cluster in made.values():
            try:
                cluster.close()
            except Exception as exc:  # the first error is the one to show
                errors[0].add_note(f"closing a group that came up failed too: {exc}")
        cloud.close()
        raise errors[0]
    return {g: made[g] for g in specs}


# -- named pools: Cluster.describe() of a cloud pool is the SSH description plus "stack" -----------
def _reopen(kind: str, description: dict[str, Any], program: Callable[[Any], Any],
            connect: Any) -> CloudPool | CloudGroup:
    from skyward.errors import ProviderError
    from skyward.stacks.cloudpool import CloudPool

    from .base import require_kind

    require_kind(description, kind)
    stack = description.get("stack")
    if not isinstance(stack, dict) or "plan" not in stack:
        raise ProviderError(
            f"this {kind} pool's record does not describe its stack (written by an older skyward?), "
            f"so it cannot be reopened. Remove the record with `skyward down`, then destroy the stack "
            f"by name with skyward.stacks.open_stack('<stack>').destroy() (`skyward history` shows it)."
        )
    cloud = CloudPool.from_description(stack, program, connect=connect)
    return cloud.group(str(stack["group"])) if stack.get("group") else cloud


def attach(kind: str, description: dict[str, Any], program: Callable[[Any], Any], connect: Any) -> Cluster:
    """The running nodes of a described cloud pool, with its stack reopened (provisions nothing)."""
    ssh: Any = importlib.import_module("skyward.providers.ssh")
    cloud = _reopen(kind, description, program, connect)
    cluster: Cluster = ssh.SSHCluster.from_description(description, **_hooks(ssh, cloud, kind))
    _heal_hook(cluster, ssh, cloud)
    return cluster


def destroy(kind: str, description: dict[str, Any], program: Callable[[Any], Any], connect: Any) -> None:
    """Stop the agents over SSH (best effort: a node that cannot be reached stops by its ttl),
    then refresh, destroy and remove the stack. Raises StackError when the stack remains."""
    attach(kind, description, program, connect).close()


def stack_history(kind: str, description: dict[str, Any], connect: Any) -> list[dict[str, Any]]:
    """The update history of a described pool's stack (newest first)."""
    return _reopen(kind, description, lambda plan: None, connect).stack.history()


class CloudProvider(ProviderConfig):
    """What sky.AWS and sky.GCP do alike once each has said how to pick an offer (``offer``)
    and what its stack program is given (``_stack_args``): checks, costs, preview, stacks, named
    pools. The class attributes name the cloud's SDK extra and its stack program."""

    label: ClassVar[str] = "?"  # "sky.AWS"
    extra: ClassVar[str] = "?"  # pip extra: skyward[aws]
    sdk: ClassVar[tuple[str, ...]] = ()  # modules the SDK extra provides
    plugin_package: ClassVar[str] = "?"  # the Python package matching the Pulumi resource plugin
    volume_kind: ClassVar[str] = "block volumes"
    workspace: Any
    install: str
    fanout: bool

    def _check_common(self) -> None:
        from skyward.errors import ConfigError

        if self.install not in ("index", "wheelhouse"):
            raise ConfigError(f"{type(self).__name__}(install={self.install!r}) is not valid: use 'index' or 'wheelhouse'.")
        if not isinstance(self.fanout, bool):
            raise ConfigError(f"{type(self).__name__}(fanout={self.fanout!r}) is not valid: use True or False.")

    # The workspace is this process's way of running stacks (tests pass a fake holding threads
    # and hosts): a pickled spec -- in a named pool's description -- goes without it.
    def __getstate__(self) -> list[Any]:
        return [None if f.name == "workspace" else getattr(self, f.name) for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def __setstate__(self, state: list[Any]) -> None:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        if len(state) > len(fields):
            raise TypeError(f"a {type(self).__name__} pickled by a newer skyward ({len(state)} fields, "
                            f"this one has {len(fields)}): upgrade skyward here")
        for f in fields[len(state):]:  # fields added since the state was written: their defaults
            object.__setattr__(self, f.name, f.default if f.default is not dataclasses.MISSING else None)
        for f, value in zip(fields, state, strict=False):
            object.__setattr__(self, f.name, value)

    def offer(self, spec: Spec) -> Offer:
        raise NotImplementedError

    def _stack_args(self, spec: Spec, offer: Offer) -> dict[str, Any]:
        raise NotImplementedError

    def _program(self) -> Callable[[Any], Any]:
        return importlib.import_module(f"skyward.stacks.{self.kind}").program

    def check(self, spec: Spec) -> str | None:
        from skyward.errors import NoOfferError

        if any(type(v).__name__ not in ("Disk", "Volume") for v in spec.volumes):
            return f"{self.kind.upper()} volumes are sky.Disk(...) {self.volume_kind} or sky.Volume(...) buckets"
        try:
            self.offer(spec)
        except NoOfferError as exc:
            return str(exc)
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        return self.offer(spec).price(spec.allocation)

    def preflight(self, spec: Spec) -> None:
        preflight(self.label, self.extra, self.sdk, fake_workspace=self.workspace is not None)
        check_sdk_floor(self.plugin_package)

    def preview(self, spec: Spec, name: str | None = None) -> dict[str, Any]:
        """What a pool of ``spec`` would create, creating nothing: ``{"resources": [{"type",
        "name", "detail"}], "offer", "stack", "hourly_cost", "hourly_cost_per_node", "notes"}``.
        ``name``: a named pool's name, which its stack and key carry (``<name>-<id>``, as `up`
        makes them). The real stack program runs under Pulumi's mocks: no Pulumi CLI, no
        credentials, no network. Needs the pulumi SDK."""
        from skyward.stacks.preview import preview_pool

        offer = self.offer(spec)
        require_preview_sdk(self.label, self.extra, self.sdk, spec, offer)
        return preview_pool(self.kind, spec, offer, self._program(), pool_name=name,
                            **self._stack_args(spec, offer))

    def create(self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
               pin: tuple[Package, ...] | None = None) -> Cluster:
        from skyward.stacks.cloudpool import launch

        self.preflight(spec)
        offer = self.offer(spec)
        cloud = launch(
            self.kind, spec, pool_id, offer, self._program(), provider=self, **self._stack_args(spec, offer),
            plugins=plugin_version(self.kind, self.plugin_package), connect=self.workspace, pool_name=name,
        )
        return ssh_cluster(spec, pool_id, cloud, options, install=self.install, kind=self.kind, pin=pin,
                           fanout=self.fanout)

    def create_together(self, specs: dict[str, Spec], pool_id: str, options: Options | None = None,
                        name: str | None = None, pin: tuple[Package, ...] | None = None) -> dict[str, Cluster] | None:
        """The groups of one pool on this cloud in ONE stack: one network and security group
        (firewalls on GCP) and client key for the pool, each group's instances with their own
        type, market, disks and image. None -- each group its own stack -- when they cannot
        share one (``_pool_settings``: other regions, other buckets, TPUs, no common zone)."""
        from skyward.stacks.cloudpool import launch_groups

        offers = {g: self.offer(spec) for g, spec in specs.items()}
        args = {g: self._stack_args(spec, offers[g]) for g, spec in specs.items()}
        settings = self._pool_settings(specs, offers, args)
        if settings is None:
            return None
        for spec in specs.values():
            self.preflight(spec)
        cloud = launch_groups(
            self.kind, specs, pool_id, offers, self._program(), provider=self, stack_args=args, settings=settings,
            plugins=plugin_version(self.kind, self.plugin_package), connect=self.workspace, pool_name=name,
        )
        return ssh_clusters(specs, pool_id, cloud, options, install=self.install, kind=self.kind, pin=pin,
                            fanout=self.fanout)

    def _pool_settings(self, specs: dict[str, Spec], offers: dict[str, Offer],
                       args: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        """The settings of one stack for these groups (the first group's), or None when they
        cannot share one: offers in other regions, or other sky.Volume buckets (the nodes' one
        role grants the pool's buckets)."""
        from skyward.volumes import Volume

        if len({o.region for o in offers.values()}) > 1:
            return None
        buckets = {tuple((v.bucket, v.prefix, v.read_only) for v in spec.volumes
                         if isinstance(v, Volume) and v.storage is None) for spec in specs.values()}
        if len(buckets) > 1:
            return None
        return dict(args[next(iter(specs))]["settings"])

    # -- named pools (see ProviderConfig): the SSH description plus the stack's ---------------
    def attach(self, description: dict[str, Any]) -> Cluster:
        return attach(self.kind, description, self._program(), connect=self.workspace)

    def destroy(self, description: dict[str, Any]) -> None:
        preflight(self.label, self.extra, self.sdk, fake_workspace=self.workspace is not None)
        destroy(self.kind, description, self._program(), connect=self.workspace)

    def stack_history(self, description: dict[str, Any]) -> list[dict[str, Any]]:
        """The Pulumi update history of a described pool's stack (newest first)."""
        return stack_history(self.kind, description, connect=self.workspace)
