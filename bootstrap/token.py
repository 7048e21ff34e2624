"""Checking the pool's token: the agent, the lane and the collection server admit a peer only
with it. Standard library only (the agent imports it)."""

from __future__ import annotations

try:  # what hmac.compare_digest is, without hmac's OpenSSL import (4 ms of every node's start)
    from _operator import _compare_digest
except ImportError:  # pragma: no cover - an interpreter without it
    from hmac import compare_digest as _compare_digest  # type: ignore[no-redef]


def same_token(hello: dict[str, object], token: bytes) -> bool:
    """True when a HELLO's ``token`` is ``token``, compared in constant time."""
    return bool(_compare_digest(str(hello.get("token", "")).encode(), token))
