"""How a pool's plugins are applied on the client: image, bootstrap ops, client hooks.

Providers call one function, after they made their ``Cluster`` and before they bootstrap
or start any node::

    prepare(spec: Spec, cluster: Cluster) -> tuple[Image, tuple[str, ...]]

It returns the final Image (``spec.image`` passed through every plugin's ``transform`` in
plugin order, each receiving the previous one's result and the cluster) and the plugin
bootstrap ops (each plugin's ``bootstrap(cluster)`` result, concatenated in plugin order).
The ops are bash command strings, meant to run on every node after the Image's own phases,
with the Image's env exported and the node's environment on PATH. A hook that raises, or
returns the wrong type, raises ``PluginError`` naming the plugin and the hook. Env values of
the final Image that look secret (``HF_TOKEN``...) are registered for redaction here.

The node side (around_app, around_process, decorate) is ``skyward.runtime.plugins``; the
launcher hook is applied by the agent.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError, PluginError, SerializationError

from .plugin import Plugin

if TYPE_CHECKING:
    from skyward.core.pool import Pool
    from skyward.providers.base import Cluster
    from skyward.spec import Image, Spec

log = logging.getLogger("skyward.plugins")


def validate(plugins: Iterable[Any]) -> tuple[Plugin, ...]:
    """The plugins of a Spec, checked: every item must be a Plugin."""
    out = []
    for item in plugins:
        if not isinstance(item, Plugin):
            hint = ""
            if isinstance(item, str):
                hint = f" Write sky.plugins.{item}() instead of {item!r}."
            elif callable(item):
                hint = " Call the factory: sky.plugins.torch() rather than sky.plugins.torch."
            raise ConfigError(
                f"plugins=[..., {item!r}, ...]: {type(item).__name__} is not a plugin; pass "
                f"sky.plugins.<name>(...) or a Plugin built with Plugin.create(name).{hint}"
            )
        out.append(item)
    return tuple(out)


def prepare(spec: Spec, cluster: Cluster) -> tuple[Image, tuple[str, ...]]:
    """The final Image and the plugin bootstrap ops for ``spec`` on ``cluster`` (see module doc)."""
    from skyward.observe import secrets
    from skyward.spec import Image

    plugins = validate(spec.plugins)
    image = spec.image
    for p in plugins:
        if p.transform is None:
            continue
        try:
            result = p.transform(image, cluster)
        except Exception as exc:
            raise PluginError(
                f"plugin {p.name!r}: its image transform raised {type(exc).__name__}: {exc}. "
                f"Fix the plugin's parameters, or leave the plugin out."
            ) from exc
        if not isinstance(result, Image):
            raise PluginError(
                f"plugin {p.name!r}: its image transform returned {type(result).__name__}, not an "
                f"Image; a transform must return dataclasses.replace(image, ...)."
            )
        image = result
    ops: list[str] = []
    for p in plugins:
        if p.bootstrap is None:
            continue
        try:
            produced = p.bootstrap(cluster)
        except Exception as exc:
            raise PluginError(
                f"plugin {p.name!r}: its bootstrap factory raised {type(exc).__name__}: {exc}."
            ) from exc
        if isinstance(produced, str):
            produced = (produced,)
        produced = tuple(produced or ())
        for op in produced:
            if not isinstance(op, str):
                raise PluginError(
                    f"plugin {p.name!r}: its bootstrap factory returned {op!r}; ops are shell "
                    f"command strings (a tuple of str)."
                )
        ops.extend(produced)
    secrets.register_env(image.env)
    return image, tuple(ops)


def encode_for_nodes(plugins: tuple[Plugin, ...]) -> str | None:
    """The node-side hooks, cloudpickled (base64) for the CONFIGURE frame; None when none.

    Client-only hooks (transform, bootstrap, around_client) stay here: they may hold things
    that cannot travel, and nodes never call them.
    """
    node_side = [
        replace(p, transform=None, bootstrap=None, around_client=None)
        for p in plugins
        if p.decorate or p.around_app or p.around_process or p.launcher
    ]
    if not node_side:
        return None
    import cloudpickle

    try:
        blob = cloudpickle.dumps(node_side, protocol=5)
    except Exception as exc:
        names = ", ".join(repr(p.name) for p in node_side)
        raise SerializationError(
            f"the node-side hooks of plugin(s) {names} could not be pickled ({type(exc).__name__}: "
            f"{exc}). Hooks travel to every node: create locks, clients and open files inside "
            f"the hook, not in the closure that builds the plugin."
        ) from exc
    return base64.b64encode(blob).decode("ascii")


def enter_client_hooks(plugins: tuple[Plugin, ...], pool: Pool, cluster: Cluster) -> ExitStack:
    """Enter every around_client hook in plugin order (in this thread); close the returned
    stack to exit them in reverse. If one fails, those already entered are exited."""
    stack = ExitStack()
    try:
        for p in plugins:
            if p.around_client is None:
                continue
            try:
                stack.enter_context(p.around_client(pool, cluster))
            except Exception as exc:
                raise PluginError(
                    f"plugin {p.name!r}: its around_client hook failed on entry with "
                    f"{type(exc).__name__}: {exc}."
                ) from exc
    except BaseException:
        stack.close()
        raise
    return stack
