"""The client's side of a forwarded ssh-agent: answers a node's logins with the client's keys.

``sky.SSH(fanout=True)`` runs, on the pool's first node, a program that logs into the other hosts
with OpenSSH (bootstrap/fanout.py). It authenticates with the client's key through agent
forwarding: sshd on that node gives the session an agent socket whose requests come back to
the client as ``auth-agent@openssh.com`` channels, and ``KeyAgent`` answers them with the keys
the client itself logs in with. The private keys never leave the client; only signatures do,
and only while the program runs (``close`` refuses every request after).

The protocol (draft-miller-ssh-agent): a message is a uint32 length and that many bytes, the
first the type. Two requests are answered: the identities (11 -> 12) and a signature (13 -> 14);
anything else gets SSH_AGENT_FAILURE (5).
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("skyward.ssh")

_FAILURE, _IDENTITIES, _IDENTITIES_ANSWER, _SIGN, _SIGN_RESPONSE = 5, 11, 12, 13, 14
_RSA_SHA2_256, _RSA_SHA2_512 = 2, 4
_MAX = 256 * 1024  # no request of the protocol is larger


class KeyAgent:
    """Answers forwarded agent channels with ``keys`` (paramiko keys: a key file's, or an
    ``AgentKey`` of the client's own ssh-agent, which signs there). Pass it as the handler of
    ``Channel.request_forward_agent``; ``signed`` counts the signatures made."""

    def __init__(self, keys: list[paramiko.PKey]) -> None:
        self._keys = {k.asbytes(): k for k in keys}
        self._open = True
        self._channels: list[paramiko.Channel] = []
        self._lock = threading.Lock()
        self.signed = 0

    def __call__(self, chan: paramiko.Channel) -> None:
        """A new agent channel (paramiko's transport thread calls this): served on a thread."""
        with self._lock:
            if not self._open:
                chan.close()
                return
            self._channels.append(chan)
        threading.Thread(target=self._serve, args=(chan,), name="skyward-agent-fwd", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._open = False
            channels, self._channels = self._channels, []
        for chan in channels:
            _close(chan)

    def _serve(self, chan: paramiko.Channel) -> None:
        try:
            while True:
                head = _recv(chan, 4)
                if head is None:
                    return
                (size,) = struct.unpack(">I", head)
                if not 0 < size <= _MAX:
                    return
                body = _recv(chan, size)
                if body is None:
                    return
                chan.sendall(self._answer(body))
        except Exception as exc:  # a channel that broke: the login on the node fails and says so
            log.debug("forwarded agent channel: %s", exc)
        finally:
            with self._lock:
                if chan in self._channels:
                    self._channels.remove(chan)
            _close(chan)

    def _answer(self, body: bytes) -> bytes:
        kind = body[0]
        with self._lock:
            open_ = self._open
        if not open_:
            return _message(bytes([_FAILURE]))
        if kind == _IDENTITIES:
            parts = [bytes([_IDENTITIES_ANSWER]), struct.pack(">I", len(self._keys))]
            for blob in self._keys:
                parts += [_string(blob), _string(b"skyward")]
            return _message(b"".join(parts))
        if kind == _SIGN:
            try:
                blob, rest = _take(body, 1)
                data, rest = _take(body, rest)
                (flags,) = struct.unpack(">I", body[rest:rest + 4])
            except (ValueError, struct.error):
                return _message(bytes([_FAILURE]))
            key = self._keys.get(blob)
            if key is None:
                return _message(bytes([_FAILURE]))
            algorithm = None
            if key.get_name() == "ssh-rsa" or key.get_name().startswith("ssh-rsa-cert"):
                algorithm = ("rsa-sha2-512" if flags & _RSA_SHA2_512 else
                             "rsa-sha2-256" if flags & _RSA_SHA2_256 else "ssh-rsa")
            try:
                signature = key.sign_ssh_data(data, algorithm) if algorithm else key.sign_ssh_data(data)
            except Exception as exc:
                log.debug("forwarded agent: cannot sign with %s: %s", key.get_name(), exc)
                return _message(bytes([_FAILURE]))
            with self._lock:
                self.signed += 1
            return _message(bytes([_SIGN_RESPONSE]) + _string(signature.asbytes()))
        return _message(bytes([_FAILURE]))


def _recv(chan: paramiko.Channel, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = chan.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _take(body: bytes, at: int) -> tuple[bytes, int]:
    (size,) = struct.unpack(">I", body[at:at + 4])
    end = at + 4 + size
    if end > len(body):
        raise ValueError("truncated")
    return body[at + 4:end], end


def _message(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _close(chan: paramiko.Channel) -> None:
    """Close a forwarded agent's channel; its connection may have closed first (EOFError)."""
    try:
        chan.close()
    except Exception as exc:
        log.debug("closing a forwarded agent channel: %s", exc)
