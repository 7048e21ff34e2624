"""What the cloud providers (AWS, GCP) share: the checks before a stack exists, and the one
path from a stack's nodes to running agents -- the SSH bootstrap.

Not a provider itself; ``aws.py`` and ``gcp.py`` use it so that neither imports the other.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def ssh_cluster(spec: Spec, pool_id: str, cloud: CloudPool, options: Options | None = None,
                install: str = "index") -> Cluster:
    """Bring the stack up and hand its nodes to the SSH bootstrap: stack outputs -> hosts ->
    bootstrap -> agents, the same path as sky.SSH. Closing the cluster destroys the stack."""
    ssh: Any = importlib.import_module("skyward.providers.ssh")
    host = ssh.SSHHost

    nodes = cloud.start(spec.node_spec.desired)
    try:
        cluster: Cluster = ssh.SSHCluster(
            spec, pool_id, [host(**n.host_fields()) for n in nodes], options=options, install=install,
            grow=lambda count: [host(**n.host_fields()) for n in cloud.grow(count)],
            shrink=cloud.shrink,
            on_close=cloud.close,
        )
    except BaseException:
        cloud.close()
        raise
    return cluster
