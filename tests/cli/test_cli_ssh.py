"""The named-pool flow of test_cli_pools, on real sshd hosts: skyward up / attach / ls / exec /
history / down with `provider = "ssh"` in skyward.toml."""

from __future__ import annotations

import json

import pytest

from .conftest import CLI
from .ssh_helpers import netns_hosts, on_host

CLIENT = """
    import json, socket
    import skyward as sky

    with sky.Compute(name="lab", options=sky.Options(console="silent")) as pool:
        names = sky.function(socket.gethostname)() @ pool
    print(json.dumps(names))
"""


@pytest.mark.timeout(300)
def test_up_attach_exec_history_down_on_ssh_hosts(cli: CLI) -> None:
    with netns_hosts(2) as hosts:
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 2\nttl = 120\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n')
        up = cli("up", "lab", timeout=180)
        assert up.code == 0, up
        pids = [n["agent_pid"] for n in cli.record("lab")["cluster"]["nodes"]]
        assert all(pids)
        ids = [n["agent_id"] for n in cli.record("lab")["cluster"]["nodes"]]
        assert len(set(ids)) == 2 and all(len(i) == 24 for i in ids)  # held to by every attach below

        client = cli.python(CLIENT)
        assert client.code == 0, client
        assert client.json() == [h.name for h in hosts]

        (row,) = cli("ls", "--json").json()
        assert (row["name"], row["provider"], row["nodes"], row["state"]) == ("lab", "ssh", 2, "running")

        ran = cli("exec", "lab", "--json", "--", "hostname")
        assert ran.code == 0, ran
        assert [r["stdout"].strip() for r in ran.json()] == [h.name for h in hosts]

        status = cli("status", "lab", "--json")
        assert status.code == 0, status
        assert [n["reachable"] for n in status.json()["nodes"]] == [True, True]
        logs = cli("logs", "lab")
        assert logs.code == 0, logs
        assert "serving on " in logs.out and "agent.sock" in logs.out  # the agents' own log (a Unix socket), read on each host

        events = [e["event"] for e in cli("history", "lab", "--json").json()]
        assert events[:3] == ["provisioned", "attached", "detached"]

        # A dead agent (its host up): the next program attaching restarts it on its host first.
        on_host(hosts[1], f"kill -9 {pids[1]}")
        again = cli.python(CLIENT)
        assert again.code == 0, again
        assert again.json() == [h.name for h in hosts]
        assert "cannot be reached" not in again.err, again
        assert cli.record("lab")["cluster"]["nodes"][1]["agent_pid"] != pids[1]
        assert cli.record("lab")["cluster"]["nodes"][1]["agent_id"] not in ("", ids[1])  # the new agent's
        trail = [e["event"] for e in cli("history", "lab", "--json").json()]
        assert "node lost" in trail and "node replaced" in trail, trail

        down = cli("down", "lab", timeout=120)
        assert down.code == 0, down
        for h in hosts:
            left = on_host(h, "pgrep -af skyward.bootstrap | grep -v pgrep; ls ~/.skyward/pools; true")
            assert left.strip() == "", left
        assert cli("ls", "--json").json() == []
