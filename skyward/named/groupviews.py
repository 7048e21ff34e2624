"""A named pool's record seen one group at a time: ``group_views`` and ``--group``'s
``group_view``. Apart from skyward.named.pools so that the modules pools itself uses (the SSH
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
