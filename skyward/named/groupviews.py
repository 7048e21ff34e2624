"""A named pool's record seen one group at a time: ``group_views``, ``--group``'s
``group_view``, and ``pool_rank`` for a node numbered across the whole pool. Apart from skyward.named.pools so that the modules pools itself uses (the SSH
config entries) can read a record's groups without importing it."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

DEFAULT_GROUP = "default"  # skyward.core.group's name for a pool's one group (not imported: it loads the pool)


def group_views(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each group of a named pool's record as a record of that group alone (its ``config``,
    ``cluster`` and ``provider``), in group order. A pool of one spec is the one group
    ``default``, whose view is the record itself (records written before groups were too)."""
    groups = record.get("groups")
    if not groups:
        return {DEFAULT_GROUP: record}
    return {name: {**record, "config": g["config"], "cluster": g.get("cluster"), "provider": g.get("provider"),
                   "hourly_cost": g.get("hourly_cost"), "offer": g.get("offer"), "group": name}
            for name, g in groups.items()}


def group_view(record: dict[str, Any], group: str | None, command: str) -> dict[str, Any]:
    """The view of ``--group GROUP`` (see ``group_views``); without one, the record itself,
    unless ``command`` needs one group of a pool that has several."""
    views = group_views(record)
    if group is None:
        if len(views) > 1 and command:
            raise ConfigError(
                f"pool {record['name']!r} has several groups ({', '.join(map(repr, views))}): "
                f"`{command}` needs one, e.g. `{command.replace('NAME', record['name'])} --group "
                f"{next(iter(views))}`."
            )
        return record
    if group not in views:
        raise ConfigError(
            f"--group {group!r}: pool {record['name']!r} has no group called {group!r}; its groups are "
            f"{', '.join(map(repr, views))}."
        )
    return views[group]


def node_count(view: dict[str, Any]) -> int:
    """How many nodes a group's view (or a record) describes now."""
    return len((view.get("cluster") or {}).get("nodes") or [])


def pool_rank(record: dict[str, Any], views: dict[str, dict[str, Any]], node: int) -> tuple[str, int]:
    """``--node N`` without ``--group`` on a pool of several groups: the node at that place in the
    whole pool, numbered group after group (as ``instance_info().node``), as (group, its rank)."""
    rank = node
    for g, view in views.items():
        count = node_count(view)
        if 0 <= rank < count:
            return g, rank
        rank -= count
    total = node - rank
    raise ConfigError(f"--node {node}: pool {record['name']!r} has {total} node(s) across its groups "
                      f"({', '.join(map(repr, views))}), numbered 0 to {total - 1} group after group; "
                      f"--group GROUP --node N picks by the rank within a group.")
