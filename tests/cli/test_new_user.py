"""Named pools as a new user meets them: `skyward down` of a pool in use, a pool with
one dead node, `preview` of a named or running pool, and the small things (a second copy of a
startup error, a bare `skyward`, `down` of a name that does not exist, the prices' date)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from .conftest import CLI

# -- item 1: `skyward down` of a pool a program is using ---------------------------------------------
USER = """
    import time
    import skyward as sky

    with sky.Compute(name="shared", options=sky.Options(console="log")) as pool:
        print("attached", flush=True)
        try:
            sky.function(time.sleep)(60) >> pool
        except sky.PoolStoppedError as exc:
            print("STOPPED:", exc, flush=True)
        try:
            sky.function(time.sleep)(0) >> pool
        except sky.PoolStoppedError as exc:
            print("AGAIN:", exc, flush=True)
"""


def test_down_of_a_pool_in_use_warns_and_the_program_gets_one_clear_error(cli: CLI) -> None:
    import subprocess
    import sys
    import textwrap

    assert cli("up", "shared", "--nodes", "2").code == 0
    user = subprocess.Popen([sys.executable, "-c", textwrap.dedent(USER)], cwd=cli.cwd, env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert user.stdout is not None and user.stdout.readline().strip() == "attached"
        time.sleep(0.5)  # the task runs
        refused = cli("down", "shared")  # not a terminal, no --force: in use, so no
        assert refused.code == 1, refused
        assert "1 client" in refused.err and "--force" in refused.err, refused
        assert cli("ls", "--json").json()[0]["state"] == "in use"

        down = cli("down", "shared", "--force")
        assert down.code == 0, down
        assert "1 client" in down.err, down  # still said, even when forced
        out, err = user.communicate(timeout=60)
    finally:
        if user.poll() is None:
            user.kill()
            user.communicate()
    assert user.returncode == 0, (out, err)
    stopped = next(line for line in out.splitlines() if line.startswith("STOPPED:"))
    assert "stopped by `skyward down`" in stopped and "@" in stopped, stopped  # who
    assert "AGAIN:" in out and "stopped by `skyward down`" in out.split("AGAIN:")[1]
    for wrong in ("WorkerDiedError", "replaced it", "keep running", "was lost", "lost ("):
        assert wrong not in out + err, (wrong, out, err)
    assert cli.wait_no_processes(10) == []


def test_down_on_a_terminal_asks_when_clients_are_attached(cli: CLI) -> None:
    import os as os_
    import pty
    import subprocess
    import sys
    import textwrap

    assert cli("up", "asked", "--nodes", "1").code == 0
    user = subprocess.Popen([sys.executable, "-c", textwrap.dedent(USER.replace('"shared"', '"asked"'))],
                            cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert user.stdout is not None and user.stdout.readline().strip() == "attached"
        primary, secondary = pty.openpty()
        down = subprocess.Popen([sys.executable, "-m", "skyward", "down", "asked"], cwd=cli.cwd, env=cli.env,
                                stdin=secondary, stdout=secondary, stderr=secondary)
        os_.close(secondary)
        said = b""
        while b"[y/N]" not in said:
            try:
                chunk = os_.read(primary, 1024)
            except OSError:  # the command exited without asking
                break
            if not chunk:
                break
            said += chunk
        os_.write(primary, b"n\n")
        assert down.wait(timeout=30) == 1
        os_.close(primary)
        assert b"1 client" in said, said
        assert cli("ls", "--json").json()[0]["state"] == "in use"  # answered no: still up
    finally:
        cli("down", "asked", "--force")
        user.communicate(timeout=60)


# -- item 2: one dead node -------------------------------------------------------------------------
def _kill_agent(cli: CLI, name: str, node: int) -> int:
    pid = int(cli.record(name)["cluster"]["nodes"][node]["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid in cli.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def test_one_dead_node_leaves_the_rest_of_a_named_pool_usable(cli: CLI) -> None:
    assert cli("up", "half", "--nodes", "2").code == 0
    pid = _kill_agent(cli, "half", 1)

    status = cli("status", "half", "--json")
    assert status.code == 1, status  # not healthy...
    nodes = status.json()["nodes"]
    assert [n["reachable"] for n in nodes] == [True, False], nodes  # ...but judged node by node
    assert not nodes[0].get("error"), nodes
    assert str(pid) in nodes[1]["error"] and "expired" not in nodes[1]["error"], nodes
    text = cli("status", "half")
    assert "expired or was stopped" not in text.out + text.err, text

    (row,) = cli("ls", "--json").json()
    assert row["state"] == "running" and row["nodes_down"] == [1], row
    assert "1 of 2 nodes down" in cli("ls").out

    ran = cli("exec", "half", "--json", "--", "true")  # one line per node, each on its own
    assert ran.code == 1, ran
    assert [(r["node"], r["exit_code"]) for r in ran.json()] == [(0, 0), (1, None)], ran
    assert str(pid) in ran.json()[1]["error"]
    logs = cli("logs", "half", "--json")
    assert logs.code == 1, logs
    assert [(r["node"], bool(r["error"])) for r in logs.json()] == [(0, False), (1, True)], logs
    assert "serving on" in logs.json()[0]["text"]

    # A program attaching replaces the dead node first (pools heal), at its rank; the registry
    # and the trail say so, and the pool is whole again for everyone.
    client = cli.python("""
        import json, os
        import skyward as sky
        with sky.Compute(name="half", options=sky.Options(console="silent")) as pool:
            ranks = sky.function(lambda: sky.instance_info().node)() @ pool
            print(json.dumps({"nodes": pool.current_nodes(), "ranks": ranks}))
    """)
    assert client.code == 0, client
    assert client.json() == {"nodes": 2, "ranks": [0, 1]}, client
    assert "cannot be reached" not in client.err, client
    status = cli("status", "half", "--json")
    assert status.code == 0, status
    assert [n["reachable"] for n in status.json()["nodes"]] == [True, True], status
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "running" and not row.get("nodes_down"), row
    trail = cli("history", "half").out
    assert "node lost" in trail and "node replaced" in trail, trail


# -- item 8: preview ------------------------------------------------------------------------------
def test_preview_of_a_named_cloud_pool_uses_the_names_up_would(cli: CLI) -> None:
    pytest.importorskip("pulumi_aws")
    cli.toml('[pools.train]\nprovider = "aws"\nnodes = 1\n')
    result = cli("preview", "train", "--json")
    assert result.code == 0, result
    got = result.json()
    assert got["stack"] == "train-<id>", got["stack"]  # what `up` names it: <pool name>-<id>
    (key,) = [r for r in got["resources"] if r["type"] == "aws:ec2/keyPair:KeyPair"]
    assert key["detail"].startswith("skyward-train-<id>:"), key
    text = cli("preview", "train")
    assert "stack train-<id>" in text.out, text


def test_the_python_preview_has_the_hourly_cost_the_cli_shows() -> None:
    pytest.importorskip("pulumi_aws")
    import skyward as sky

    spec = sky.Spec(provider=sky.AWS(), nodes=2)
    plan = spec.provider.preview(spec)
    per_node = plan["offer"]["hourly_cost_per_node"]
    assert plan["hourly_cost_per_node"] == per_node > 0
    assert plan["hourly_cost"] == round(per_node * 2, 4)


def test_preview_of_a_running_pool_describes_it_instead_of_failing(cli: CLI) -> None:
    assert cli("up", "live", "--provider", "local", "--nodes", "2").code == 0  # no skyward.toml
    result = cli("preview", "live", "--json")
    assert result.code == 0, result
    got = result.json()
    assert (got["name"], got["provider"], got["nodes"]) == ("live", "local", 2)
    assert any("running now" in n and "skyward down live" in n for n in got["notes"]), got
    text = cli("preview", "live")
    assert text.code == 0 and "running now" in text.out, text
    assert "not running and not defined" not in text.err


# -- item 10: the small things ---------------------------------------------------------------------
def test_a_startup_failure_is_printed_once(cli: CLI) -> None:
    cli.toml('[pools.broken]\nprovider = "local"\n[pools.broken.image]\nincludes = ["no_such_folder"]\n')
    result = cli("up", "broken")
    assert result.code != 0, result
    assert result.err.count("does not exist") == 1, result  # not once by the console, once by the CLI
    assert cli("ls", "--json").json() == []


def test_down_of_an_unknown_pool_says_only_that(cli: CLI) -> None:
    result = cli("down", "ghost")
    assert result.code == 1 and "no pool named 'ghost'" in result.err, result
    assert "stopping" not in result.err, result


def test_attaching_does_not_say_nodes_started(cli: CLI) -> None:
    assert cli("up", "att", "--nodes", "2").code == 0
    client = cli.python("""
        import skyward as sky
        with sky.Compute(name="att", options=sky.Options(console="log")) as pool:
            pass
    """)
    assert client.code == 0, client
    assert "started" not in client.err, client
    assert "node 0: attached" in client.err and "node 1: attached" in client.err, client


def test_skyward_with_no_arguments_prints_help_and_exits_2(cli: CLI) -> None:
    result = cli()
    assert result.code == 2, result
    assert "usage: skyward" in result.out + result.err and "up" in result.out + result.err


def test_offers_say_when_the_prices_are_from(cli: CLI) -> None:
    rows = cli("offers", "--limit", "3", "--json").json()
    dates = sorted({r["as_of"] for r in rows})
    table = cli("offers", "--limit", "3")
    assert table.code == 0, table
    assert all(d in table.out for d in dates) and "as of" in table.out, table


def test_offers_of_a_card_no_cloud_rents_says_who_does(cli: CLI) -> None:
    result = cli("offers", "--accelerator", "rtx-4090")
    assert result.code == 1, result
    assert "RTX 4090 is rented by GPU marketplaces" in result.out and "sky.SSH" in result.out, result
    assert "loosen the filters" not in result.out, result  # no filter would find one
    loose = cli("offers", "--accelerator", "H100", "--max-hourly-cost", "0.01")
    assert loose.code == 1 and "loosen the filters" in loose.out, loose
