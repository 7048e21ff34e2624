"""SHA-256 without ``hashlib``: ``import hashlib`` loads OpenSSL (``_hashlib``), 4-6 ms of every
interpreter that imports it, where the interpreter's own built-in module computes the same digest.
The handshake (every node's start) and the records and audit trail (every pool's start on the
client) take it from here. Standard library only."""

from __future__ import annotations

try:
    from _sha2 import sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # 3.11
    except ImportError:  # pragma: no cover - a build without the built-in hashes
        from hashlib import sha256

__all__ = ["sha256"]
