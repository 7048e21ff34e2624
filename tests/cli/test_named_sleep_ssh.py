"""A named pool that sleeps at zero nodes on real sshd hosts: `skyward up` starts it
asleep with no host taken, a program's first task wakes it on a host, the last program to leave
puts it back to sleep, the trail says each, and `skyward down` leaves nothing on the hosts."""

from __future__ import annotations

import json

import pytest

from .conftest import CLI
from .ssh_helpers import netns_hosts, on_host

CLIENT = """
    import json, socket
    import skyward as sky

    with sky.Compute(name="lab", options=sky.Options(console="silent")) as pool:
        before = pool.current_nodes()
        host = sky.function(socket.gethostname)() >> pool
    print(json.dumps({"before": before, "host": host}))
"""


@pytest.mark.timeout(300)
def test_a_named_ssh_pool_sleeps_at_zero_and_wakes_on_a_host(cli: CLI) -> None:
    with netns_hosts(2) as hosts:
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = [0, 2]\nttl = 120\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n')
        up = cli("up", "lab", timeout=180)
        assert up.code == 0, up
        assert cli.record("lab")["cluster"]["nodes"] == []
        (row,) = cli("ls", "--json").json()
        assert (row["name"], row["state"], row["nodes"]) == ("lab", "asleep", 0), row

        for _ in range(2):  # woken, put back to sleep by the last program to leave; twice
            client = cli.python(CLIENT, timeout=180)
            assert client.code == 0, client
            assert client.json()["before"] == 0 and client.json()["host"] in {h.name for h in hosts}
            assert cli.record("lab")["cluster"]["nodes"] == []
            status = cli("status", "lab", "--json")
            assert status.code == 0 and status.json()["state"] == "asleep", status

        trail = [e["event"] for e in cli("history", "lab", "--json").json()]
        assert trail.count("woke") == 2 and trail.count("asleep") == 2, trail

        down = cli("down", "lab", timeout=120)
        assert down.code == 0, down
        for h in hosts:
            left = on_host(h, "pgrep -af skyward.bootstrap | grep -v pgrep; true")
            assert left.strip() == "", left
