"""Finding the Pulumi CLI (and the pulumi SDK extras) before a cloud pool does anything.

The automation API drives the ``pulumi`` binary; it is looked for on PATH, then under
``$SKYWARD_HOME/pulumi/bin`` (where ``install()`` puts it). When it is missing, cloud
operations fail at once -- before any file, key or stack exists -- with the commands that
install it. Local and SSH pools never come here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from skyward.errors import PulumiNotFoundError
from skyward.paths import skyward_home


def install_root() -> Path:
    return skyward_home() / "pulumi"


def find() -> Path | None:
    """The pulumi executable: on PATH first, then the one skyward installed."""
    on_path = shutil.which("pulumi")
    if on_path:
        return Path(on_path)
    ours = install_root() / "bin" / "pulumi"
    return ours if ours.is_file() and os.access(ours, os.X_OK) else None


def install_instructions() -> str:
    root = install_root()
    return (
        "Install the Pulumi CLI with one of:\n"
        f"    curl -fsSL https://get.pulumi.com | sh -s -- --install-root {root}\n"
        f"    python -c 'import skyward.stacks.cli as c; c.install()'   (the same, via pulumi's own installer)\n"
        "    brew install pulumi/tap/pulumi                          (macOS)\n"
        f"then open the pool again. skyward looks for `pulumi` on PATH and in {root}/bin. "
        "sky.Local() and sky.SSH(...) do not need it."
    )


def require_cli(what: str) -> Path:
    """The pulumi executable, or PulumiNotFoundError saying how to install it."""
    exe = find()
    if exe is None:
        raise PulumiNotFoundError(
            f"{what} is a Pulumi stack, and the Pulumi CLI was not found (not on PATH, not in "
            f"{install_root()}/bin).\n{install_instructions()}"
        )
    return exe


def require_sdk(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """Fail at once, with the pip command, when the Python SDK extra is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise PulumiNotFoundError(
            f"{what} needs the Python package(s) {', '.join(missing)}, which are not installed. "
            f"Install the extra: pip install 'skyward[{extra}]'"
        )


def install(version: str | None = None) -> Path:
    """Download the Pulumi CLI into ``$SKYWARD_HOME/pulumi`` (uses ``PulumiCommand.install``)."""
    from pulumi.automation import PulumiCommand

    parsed = None
    if version is not None:
        from semver import VersionInfo

        parsed = VersionInfo.parse(version.lstrip("v"))
    root = install_root()
    root.mkdir(parents=True, exist_ok=True)
    PulumiCommand.install(root=str(root), version=parsed)
    return root / "bin" / "pulumi"
