"""Framework rendezvous ports listen on the head node's private address only:
torch's TCPStore (MASTER_ADDR:MASTER_PORT) and JAX's coordinator (JAX_COORDINATOR_ADDRESS) used to
listen on every interface (``*`` / ``[::]``), public ones included, on real 2-node Local pools."""

from __future__ import annotations

import pytest

import skyward as sky

QUIET = sky.Options(console="silent")


@sky.function(timeout=60)
def listening(variable: str) -> tuple[str, set[str]]:
    """(the rendezvous host as the plugin set it, the addresses listening on its port), read from
    /proc/net/tcp{,6}: Local nodes share this machine's network."""
    import os
    import socket
    from pathlib import Path

    host, _, port = os.environ[variable].rpartition(":")
    if variable == "MASTER_ADDR":
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    found = set()
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != int(port):  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)  # host byte order, 32 bits at a time
            ip = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
            found.add(ip.removeprefix("::ffff:"))  # an IPv6 socket bound to an IPv4 address
    return host, found


def test_torchs_store_listens_on_the_head_nodes_private_address_only() -> None:
    pytest.importorskip("torch")
    with sky.Compute(nodes=2, plugins=[sky.plugins.torch()], options=QUIET) as pool:
        host, found = pool.run(listening("MASTER_ADDR"), target=0)
    assert found == {host}, f"MASTER_PORT listens on {found}, not only on {host}"


def test_jaxs_coordinator_listens_on_the_head_nodes_private_address_only() -> None:
    pytest.importorskip("jax")
    with sky.Compute(nodes=2, plugins=[sky.plugins.jax()], options=QUIET) as pool:
        host, found = pool.run(listening("JAX_COORDINATOR_ADDRESS"), target=0)
    assert found == {host}, f"the JAX coordinator listens on {found}, not only on {host}"


def test_an_address_the_head_does_not_have_is_a_clear_error() -> None:
    from skyward.plugins.frameworks import _listen

    with pytest.raises(sky.PluginError) as info:
        _listen("torch", "203.0.113.77", 29500)
    message = str(info.value)
    assert "203.0.113.77:29500" in message and "private_ip" in message, message
