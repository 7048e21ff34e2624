"""sky.Slurm on a site whose login node forbids TCP forwarding (sshd's AllowTcpForwarding no, as
some sites set): the pool reaches its agents through a relay over an exec channel on the login
node instead of a direct-tcpip channel, and says so in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import skyward as sky

from .conftest import Site, open_site

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def no_forwarding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with open_site(tmp_path_factory, hosts=3, sshd_options={"AllowTcpForwarding": "no"}) as made:
        yield made


@sky.function
def host() -> str:
    import socket

    return socket.gethostname()


@sky.function
def square(x: int) -> int:
    return x * x


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_login_node_that_forbids_tcp_forwarding_is_relayed_through(no_forwarding: Site) -> None:
    site = no_forwarding
    said = Said()
    logger = logging.getLogger("skyward.slurm")  # (skyward's logger does not propagate while a pool is open)
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        with sky.Compute(provider=site.provider(), nodes=2, options=sky.Options(console=False)) as pool:
            hosts = host() @ pool
            squares = pool.map(square, range(20))
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    assert sorted(hosts) == sorted(h.name for h in site.compute)
    assert list(squares) == [i * i for i in range(20)]
    text = " ".join(said.lines)
    assert "forbids TCP forwarding" in text and "relay" in text, text
