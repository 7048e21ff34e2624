"""SSH keys a cloud pool is born with, all made on the client.

* One ed25519 client key pair per pool: its public half goes into the stack (AWS key pair,
  GCP ssh-keys metadata), its private half stays in ``$SKYWARD_HOME/keys/<stack>/`` (0600).
* One ed25519 host key per node: injected through user data, so the client knows each
  node's host key before the first connection and never has to trust on first use.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from skyward.paths import skyward_home


@dataclass(frozen=True, slots=True)
class KeyPair:
    private: str  # OpenSSH PEM ("-----BEGIN OPENSSH PRIVATE KEY-----...")
    public: str  # "ssh-ed25519 AAAA..."


def ed25519(comment: str = "") -> KeyPair:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return KeyPair(private, f"{public} {comment}".strip())


def key_dir(stack: str) -> Path:
    return skyward_home() / "keys" / stack


def client_key(stack: str) -> tuple[Path, KeyPair]:
    """The pool's client key: made and saved on first use, read back afterwards."""
    folder = key_dir(stack)
    path = folder / "id_ed25519"
    if path.exists():
        return path, KeyPair(path.read_text(), (folder / "id_ed25519.pub").read_text().strip())
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = ed25519(f"skyward-{stack}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pair.private)
    (folder / "id_ed25519.pub").write_text(pair.public + "\n")
    return path, pair


def forget(stack: str) -> None:
    """Remove the pool's client key (its stack is gone)."""
    shutil.rmtree(key_dir(stack), ignore_errors=True)
