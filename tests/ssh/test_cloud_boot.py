"""Connecting to a cloud node that is still booting: until cloud-init has run, sshd shows the
image's own host key and refuses the pool's key. Cloud pools wait that out (within their SSH
budget) and still accept only the planned host key; SSH hosts fail at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

from skyward.bootstrap.remote import Remote, Target
from skyward.errors import HostKeyError, ProviderError
from skyward.stacks import keys


@pytest.fixture
def host() -> Iterator[object]:
    hosts = SSHHosts(1)
    try:
        hosts.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    try:
        yield hosts[0]
    finally:
        hosts.close()


def _cloud_init(host: object, planned: keys.KeyPair, client_pub: str, after: float) -> threading.Thread:
    """What cloud-init does, ``after`` seconds from now: install the planned host key and the
    pool's login key, restart sshd."""

    def run() -> None:
        time.sleep(after)
        h: object = host
        h.stop()  # type: ignore[attr-defined]
        key = h.state_dir / "ssh_host_ed25519_key"  # type: ignore[attr-defined]
        key.write_text(planned.private)
        key.chmod(0o600)
        key.with_suffix(".pub").write_text(planned.public + "\n")
        with open(h.state_dir / "authorized_keys", "a") as f:  # type: ignore[attr-defined]
            f.write(client_pub + "\n")
        h.start()  # type: ignore[attr-defined]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _client_key(tmp_path: object) -> tuple[str, str]:
    pair = keys.ed25519("pool")
    path = tmp_path / "id_ed25519"  # type: ignore[operator]
    path.write_text(pair.private)
    path.chmod(0o600)
    return str(path), pair.public


def test_a_booting_cloud_node_is_waited_for(host: object, tmp_path: object) -> None:
    planned = keys.ed25519("node-0")
    key, public = _client_key(tmp_path)
    h: object = host
    target = Target(h.address, h.port, h.user, key, planned.public)  # type: ignore[attr-defined]
    boot = _cloud_init(host, planned, public, after=3.0)
    remote = Remote(target, connect_timeout=5, retry_for=60, booting=True, label="node 0").open()
    try:
        assert remote.run("echo ready")[1].strip() == "ready"
    finally:
        remote.close()
        boot.join()


def test_an_ssh_host_with_another_key_fails_at_once(host: object, tmp_path: object) -> None:
    planned = keys.ed25519("node-0")
    key, _ = _client_key(tmp_path)
    h: object = host
    target = Target(h.address, h.port, h.user, key, planned.public)  # type: ignore[attr-defined]
    started = time.monotonic()
    with pytest.raises((ProviderError, HostKeyError)):
        Remote(target, connect_timeout=5, retry_for=60, booting=False).open()
    assert time.monotonic() - started < 20


def test_a_cloud_node_that_never_shows_the_planned_key_is_refused(host: object, tmp_path: object) -> None:
    planned = keys.ed25519("node-0")
    key, _ = _client_key(tmp_path)
    h: object = host
    target = Target(h.address, h.port, h.user, key, planned.public)  # type: ignore[attr-defined]
    with pytest.raises((ProviderError, HostKeyError)):
        Remote(target, connect_timeout=3, retry_for=4, booting=True).open()
