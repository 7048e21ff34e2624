"""What the cloud providers (AWS, GCP) share: the checks before a stack exists, and the one
path from a stack's nodes to running agents -- the SSH bootstrap.

Not a provider itself; ``aws.py`` and ``gcp.py`` use it so that neither imports the other.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyward.catalogue import Offer
    from skyward.spec import Options, Spec
    from skyward.stacks.cloudpool import CloudPool

    from .base import Cluster


def preflight(what: str, extra: str, modules: tuple[str, ...], *, fake_workspace: bool = False) -> None:
    """Everything a cloud pool needs on this machine, checked before anything is written."""
    from skyward.stacks.cli import require_cli, require_sdk

    if not fake_workspace:
        require_sdk(what, extra, modules)
        require_cli(f"a {what} pool")


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


def _hooks(ssh: Any, cloud: CloudPool, kind: str) -> dict[str, Any]:
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


def ssh_cluster(spec: Spec, pool_id: str, cloud: CloudPool, options: Options | None = None,
                install: str = "index", kind: str = "aws") -> Cluster:
    """Bring the stack up and hand its nodes to the SSH bootstrap: stack outputs -> hosts ->
    bootstrap -> agents, the same path as sky.SSH. Closing the cluster destroys the stack."""
    ssh: Any = importlib.import_module("skyward.providers.ssh")
    host = ssh.SSHHost

    nodes = cloud.start(spec.node_spec.desired)
    try:
        cluster: Cluster = ssh.SSHCluster(
            spec, pool_id, [host(**n.host_fields()) for n in nodes], options=options, install=install,
            **_hooks(ssh, cloud, kind),
        )
    except BaseException:
        cloud.close()
        raise
    return cluster


# -- named pools: Cluster.describe() of a cloud pool is the SSH description plus "stack" -----------
def _reopen(kind: str, description: dict[str, Any], program: Callable[[Any], Any], connect: Any) -> CloudPool:
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
    return CloudPool.from_description(stack, program, connect=connect)


def attach(kind: str, description: dict[str, Any], program: Callable[[Any], Any], connect: Any) -> Cluster:
    """The running nodes of a described cloud pool, with its stack reopened (provisions nothing)."""
    ssh: Any = importlib.import_module("skyward.providers.ssh")
    cloud = _reopen(kind, description, program, connect)
    cluster: Cluster = ssh.SSHCluster.from_description(description, **_hooks(ssh, cloud, kind))
    return cluster


def destroy(kind: str, description: dict[str, Any], program: Callable[[Any], Any], connect: Any) -> None:
    """Stop the agents over SSH (best effort: a node that cannot be reached stops by its ttl),
    then refresh, destroy and remove the stack. Raises StackError when the stack remains."""
    attach(kind, description, program, connect).close()


def stack_history(kind: str, description: dict[str, Any], connect: Any) -> list[dict[str, Any]]:
    """The update history of a described pool's stack (newest first)."""
    return _reopen(kind, description, lambda plan: None, connect).stack.history()
