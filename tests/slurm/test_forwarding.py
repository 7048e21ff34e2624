"""sky.Slurm on a site whose login node forbids TCP forwarding (sshd's AllowTcpForwarding no, as
some sites set): the pool reaches its agents through the multiplexer it runs on the login node
(one exec channel for every link, no forwarding asked of sshd), or without it (SKYWARD_SSH_MUX=0,
an older skyward there) through a relay over an exec channel per link, instead of a direct-tcpip
channel, and says so in the log."""

from __future__ import annotations

import logging
import time
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


@pytest.mark.parametrize("mux", ["one multiplexer", "a relay per link"])
def test_a_login_node_that_forbids_tcp_forwarding_is_relayed_through(
        no_forwarding: Site, monkeypatch: pytest.MonkeyPatch, mux: str) -> None:
    site = no_forwarding
    if mux != "one multiplexer":
        monkeypatch.setenv("SKYWARD_SSH_MUX", "0")
    said = Said()
    logger = logging.getLogger("skyward.slurm")  # (skyward's logger does not propagate while a pool is open)
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        with sky.Compute(provider=site.provider(), nodes=2, options=sky.Options(console=False)) as pool:
            hosts = host() @ pool
            squares = pool.map(square, range(20))
            muxes = site.muxes()
            relays = site.on_login("pgrep -f '[s]kyward[.]bootstrap[.]relay' || true").split()
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    assert sorted(hosts) == sorted(h.name for h in site.compute)
    assert list(squares) == [i * i for i in range(20)]
    text = " ".join(said.lines)
    assert "forbids TCP forwarding" in text and "relay" in text, text
    if mux == "one multiplexer":  # it connects to the agents itself: one exec channel, one process
        assert (len(muxes), relays) == (1, []), (muxes, relays)
        deadline = time.monotonic() + 10
        while site.muxes() and time.monotonic() < deadline:  # its input ended with the connection
            time.sleep(0.1)
        assert not site.muxes()
    else:  # a process and an exec channel per link
        assert (muxes, len(relays)) == ([], 2), (muxes, relays)


def test_the_first_channels_are_tried_one_at_a_time_until_forwarding_is_known() -> None:
    """paramiko keeps a refused channel's reason on the connection for whichever opener asks first:
    two nodes' channels refused at once left one of them a bare "Unable to open channel" (CI, once)
    instead of the refusal that sends the pool to the relay. Until a channel has opened or the
    relay is chosen, the attempts go one at a time; after it, at once."""
    import threading
    import time

    import paramiko

    from skyward.providers import slurm

    inside, most = [0], [0]
    lock = threading.Lock()

    class Login:
        label = "login node"

        def __init__(self, answer: str) -> None:
            self.answer = answer

        def tunnel(self, port: int, host: str) -> str:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.1)
            with lock:
                inside[0] -= 1
            if self.answer == "refused":
                raise paramiko.ChannelException(paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
                                                "administratively prohibited")
            return f"direct {host}"

        def relay(self, command: str) -> str:
            return "relay"

        def muxed(self, port: int, host: str, python: str, log_file: str) -> None:
            return None  # no multiplexer there (an older skyward on the login node)

    class Cluster:
        sky = "/home/u/.skyward"
        folder = "/home/u/.skyward/slurm/p"

        def __init__(self, answer: str) -> None:
            self.login = Login(answer)
            self._relay, self._forwarding, self._forwarding_lock = False, False, threading.Lock()

        def _login(self) -> Login:
            return self.login

        def _python(self) -> str:
            return "envs/x/bin/python"

    def both(cluster: Cluster) -> list[str]:
        got: list[str] = []
        threads = [threading.Thread(target=lambda a=a: got.append(slurm._tunnel(cluster, a, 1)))  # type: ignore[arg-type]
                   for a in ("10.0.0.1", "10.0.0.2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(got)

    assert both(Cluster("refused")) == ["relay", "relay"] and most[0] == 1
    forwarding = Cluster("open")
    assert both(forwarding) == ["direct 10.0.0.1", "direct 10.0.0.2"] and most[0] == 1
    most[0] = 0
    assert both(forwarding) == ["direct 10.0.0.1", "direct 10.0.0.2"] and most[0] == 2  # known: at once


@sky.function
def agent_of() -> tuple[str, str, int]:
    import os
    import socket

    return os.environ.get("SLURM_JOB_ID", ""), socket.gethostname(), os.getppid()


def test_a_dropped_login_session_reaches_the_same_agents_through_a_new_multiplexer(no_forwarding: Site) -> None:
    from helpers import wait_for

    from .test_citizen import drop_login_sessions

    site = no_forwarding
    replaced: list[sky.Event] = []
    with sky.Compute(provider=site.provider(), nodes=2, options=sky.Options(console=False)) as pool:
        pool.subscribe(lambda e: replaced.append(e) if isinstance(e, sky.InstanceReplaced) else None)
        before = agent_of() @ pool
        (old,) = site.muxes()
        assert drop_login_sessions(site) >= 1  # the multiplexer goes with its session
        wait_for(lambda: len(replaced) >= 2 and pool.current_nodes() == 2, 120, "for the pool to reconnect")
        after = agent_of() @ pool
        assert sorted(after) == sorted(before)  # the same job, hosts and agents
        (new,) = site.muxes()
        assert new != old
    wait_for(lambda: not site.muxes(), 10, "for the multiplexer to end")
    site.cluster.wait_idle()
