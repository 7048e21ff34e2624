"""Where stacks live and how their secrets are encrypted.

* Backend: ``PULUMI_BACKEND_URL`` when set (an s3:// or gs:// bucket, or Pulumi Cloud, for a
  team's shared audit trail); otherwise a file backend in ``$SKYWARD_HOME/stacks``.
* Secrets: the passphrase provider. ``PULUMI_CONFIG_PASSPHRASE`` or
  ``PULUMI_CONFIG_PASSPHRASE_FILE`` when the user set one; otherwise a random passphrase
  generated once into ``$SKYWARD_HOME/stacks.passphrase`` (mode 0600). Losing that file means
  losing the ability to read the stacks' secrets (not the ability to destroy them).
* Names: project ``skyward``; one stack per pool, ``<pool name>-<short id>``.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from skyward.paths import skyward_home

PROJECT = "skyward"


def backend_url() -> str:
    return os.environ.get("PULUMI_BACKEND_URL") or (skyward_home() / "stacks").as_uri()


def local_state_dir(backend: str | None = None) -> Path | None:
    """The folder of a file backend (None for bucket and cloud backends). ``file://~`` and
    ``file://~/x`` are the user's home, as the Pulumi CLI reads them."""
    url = urlparse(backend or backend_url())
    if url.scheme != "file":
        return None
    if url.netloc.startswith("~"):
        return Path(url.netloc + url.path).expanduser()
    return Path(url.path or "/").expanduser() if url.netloc in ("", "localhost") else Path(url.netloc + url.path)


def passphrase_file() -> Path:
    return skyward_home() / "stacks.passphrase"


def secrets_env() -> dict[str, str]:
    """Environment for the CLI so it can encrypt and decrypt this project's secrets."""
    if os.environ.get("PULUMI_CONFIG_PASSPHRASE") is not None or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        return {}
    path = passphrase_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under another name, then linked into place: link() fails when the file
        # exists, so of two processes starting their first pool at once one wins, and neither
        # can ever read a file that exists but is still empty.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".passphrase-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
            os.chmod(tmp, 0o600)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return {"PULUMI_CONFIG_PASSPHRASE_FILE": str(path)}


def prepare(backend: str | None = None) -> dict[str, str]:
    """Make the file backend's folder (if that is the backend) and return the CLI's environment
    (``backend``: a stack's recorded backend, else the current one)."""
    url = backend or backend_url()
    state = local_state_dir(url)
    if state is not None:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {"PULUMI_BACKEND_URL": url, "PULUMI_SKIP_UPDATE_CHECK": "true", **secrets_env()}


def stack_name(pool_name: str | None, pool_id: str) -> str:
    """``<pool name>-<id>``: lower-case letters, digits and dashes (valid for every backend)."""
    base = re.sub(r"[^a-z0-9-]+", "-", (pool_name or "pool").lower()).strip("-") or "pool"
    return f"{base[:40]}-{pool_id}"
