"""The skyward command on real Local pools: up, attach from a program, ls, exec, status, logs,
history, down; the ttl; concurrent ups; config errors. Every command: a success and a failure."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from .conftest import CLI

CLIENT = """
    import os, time, json
    import skyward as sky

    start = time.perf_counter()
    with sky.Compute(name="demo", options=sky.Options(console="silent")) as pool:
        pids = sky.function(os.getppid)() @ pool   # the agents' pids
        first = time.perf_counter() - start
        squares = pool.map(lambda x: x * x, range(10))
    print(json.dumps({"first": first, "agents": pids, "squares": squares}))
"""


def test_up_attach_exec_history_down_on_local(cli: CLI) -> None:
    up = cli("up", "demo", "--provider", "local", "--nodes", "2", "--ttl", "120")
    assert up.code == 0, up
    assert "stops after 120 s with no client attached" in up.out
    root = Path(cli.record("demo")["cluster"]["root"])
    assert root.is_dir()

    client = cli.python(CLIENT)
    assert client.code == 0, client
    got = client.json()
    assert got["squares"] == [x * x for x in range(10)]
    assert got["first"] < 1.0, got  # attach: no provisioning
    agents = [n["pid"] for n in cli.record("demo")["cluster"]["nodes"]]
    assert sorted(got["agents"]) == sorted(agents)

    listed = cli("ls", "--json")
    assert listed.code == 0, listed
    (row,) = listed.json()
    assert (row["name"], row["provider"], row["nodes"], row["state"]) == ("demo", "local", 2, "running")
    assert row["clients"] == 0 and row["expires_in_seconds"] > 100
    assert "token" not in listed.out

    ran = cli("exec", "demo", "--json", "--", "hostname")
    assert ran.code == 0, ran
    results = ran.json()
    assert [r["node"] for r in results] == [0, 1]
    assert all(r["exit_code"] == 0 and r["stdout"].strip() == os.uname().nodename for r in results)

    history = cli("history", "demo", "--json")
    assert history.code == 0, history
    events = [e["event"] for e in history.json()]
    assert events == ["provisioned", "attached", "detached", "exec"]
    assert all("@" in e["who"] and e["skyward"] for e in history.json())
    table = cli("history", "demo")
    assert "provisioned" in table.out and "attached" in table.out and "detached" in table.out

    down = cli("down", "demo")
    assert down.code == 0, down
    assert cli.wait_no_processes(5) == []
    assert not root.exists()
    assert cli("ls", "--json").json() == []
    assert cli("history", "demo", "--json").json()[-1]["event"] == "destroyed"


def test_registry_and_audit_files_are_private(cli: CLI) -> None:
    assert cli("up", "priv", "--nodes", "1").code == 0
    for path in (cli.home / "registry" / "priv.json", cli.home / "audit" / "priv.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((cli.home / "registry").stat().st_mode) == 0o700


def test_up_pool_with_short_ttl_is_gone_and_ls_says_so(cli: CLI) -> None:
    assert cli("up", "short", "--nodes", "1", "--ttl", "5").code == 0
    record = cli.record("short")
    folders = [Path(record["cluster"]["root"]), Path(record["cluster"]["spill_dir"])]
    time.sleep(5)
    deadline = time.monotonic() + 6
    while cli.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cli.processes() == []  # gone within ~10 s of `up` with no client
    listed = cli("ls", "--json")
    assert [(r["name"], r["state"], r["removed"]) for r in listed.json()] == [("short", "expired", True)]
    assert "removed expired pool 'short'" in listed.err
    assert not any(f.exists() for f in folders)  # the agents cleaned their folders
    assert cli("ls", "--json").json() == []
    assert cli("history", "short", "--json").json()[-1]["event"] == "destroyed"


def test_ttl_zero_warns_and_never_expires(cli: CLI) -> None:
    up = cli("up", "forever", "--nodes", "1", "--ttl", "0")
    assert up.code == 0, up
    assert "warning" in up.err and "never stop" in up.err
    assert "ttl 0" in up.out
    (row,) = cli("ls", "--json").json()
    assert row["expires"] is None and row["ttl"] == 0
    assert "never" in cli("ls").out


def test_two_concurrent_ups_of_one_name_one_wins(cli: CLI) -> None:
    procs = [cli.start("up", "race", "--nodes", "1") for _ in range(2)]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        outcomes.append((p.returncode, out, err))
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 1], outcomes
    loser = next(err for code, _, err in outcomes if code == 1)
    # Which message depends on timing: the winner may still hold the lock before its record exists.
    assert "'race'" in loser and any(m in loser for m in ("being provisioned", "already running",
                                                          "being changed")), loser
    (row,) = cli("ls", "--json").json()
    assert row["name"] == "race" and row["nodes"] == 1


def test_up_of_a_running_name_fails_clearly(cli: CLI) -> None:
    assert cli("up", "dup", "--nodes", "1").code == 0
    again = cli("up", "dup", "--nodes", "1")
    assert again.code == 1, again
    assert "already running" in again.err and "skyward down dup" in again.err


def test_up_with_a_bad_flag_is_a_usage_error(cli: CLI) -> None:
    bad = cli("up", "x", "--nodes", "0")
    assert bad.code == 2, bad
    assert "command line" in bad.err and "nodes" in bad.err
    assert cli("up", "Bad Name").code == 2
    assert cli("ls", "--json").json() == []


def test_compute_name_provisions_from_toml_and_destroys_on_exit(cli: CLI) -> None:
    cli.toml("""
        [pools.eph]
        provider = "local"
        nodes = 2
        ttl = 60
        [pools.eph.image]
        env = { GREETING = "hello" }
    """)
    client = cli.python("""
        import os, json, subprocess, sys
        import skyward as sky
        with sky.Compute(name="eph", options=sky.Options(console="silent")) as pool:
            greet = sky.function(lambda: os.environ.get("GREETING"))() @ pool
            listed = subprocess.run([sys.executable, "-m", "skyward", "ls", "--json"],
                                    capture_output=True, text=True).stdout
        print(json.dumps({"greet": greet, "listed": json.loads(listed)}))
    """)
    assert client.code == 0, client
    got = client.json()
    assert got["greet"] == ["hello", "hello"]
    assert [(r["name"], r["state"], r["ephemeral"]) for r in got["listed"]] == [("eph", "in use", True)]
    assert cli("ls", "--json").json() == []
    assert [e["event"] for e in cli("history", "eph", "--json").json()] == ["provisioned", "destroyed"]


def test_compute_name_unknown_pool_says_what_to_do(cli: CLI) -> None:
    client = cli.python("""
        import skyward as sky
        try:
            sky.Compute(name="nothere").__enter__()
        except sky.ConfigError as exc:
            print(exc)
    """)
    assert client.code == 0, client
    assert "'nothere' is not running and not defined" in client.out
    assert "skyward up nothere" in client.out


@pytest.mark.parametrize(("table", "expect"), [
    ("nodez = 2", ["[pools.bad]", "unknown key 'nodez'", "Did you mean 'nodes'"]),
    ('nodes = "two"', ["[pools.bad]", "nodes = 'two'", "nodes must be an integer"]),
    ('provider = "azure"', ["[pools.bad]", "provider = 'azure'", "'local', 'ssh', 'slurm', 'container', 'aws' or 'gcp'"]),
    ("[pools.bad.image]\npip = 'numpy'", ["image.pip = 'numpy'", "valid list"]),
    ('accelerator = "A1OO"', ["accelerator = 'A1OO'"]),
])
def test_broken_skyward_toml_names_file_key_and_rule(cli: CLI, table: str, expect: list[str]) -> None:
    path = cli.toml(f"[pools.bad]\n{table}\n")
    for args in (("up", "bad"), ("preview", "bad")):
        result = cli(*args)
        assert result.code == 2, result
        assert str(path) in result.err, result
        for text in expect:
            assert text in result.err, result
    assert cli.processes() == []


def test_broken_defaults_toml_is_named(cli: CLI) -> None:
    cli.home.mkdir(parents=True, exist_ok=True)
    (cli.home / "defaults.toml").write_text("ttl = -1\n")
    result = cli("up", "x", "--nodes", "1")
    assert result.code == 2, result
    assert str(cli.home / "defaults.toml") in result.err and "ttl = -1" in result.err


def test_defaults_and_flags_layer_over_skyward_toml(cli: CLI) -> None:
    cli.home.mkdir(parents=True, exist_ok=True)
    (cli.home / "defaults.toml").write_text("ttl = 321\n[worker]\nconcurrency = 3\n")
    cli.toml("[pools.layered]\nnodes = 1\n")
    preview = cli("preview", "layered", "--nodes", "2", "--json")
    assert preview.code == 0, preview
    got = preview.json()
    assert (got["nodes"], got["ttl"], got["provider"]) == (2, 321, "local")
    assert got["hourly_cost"] == 0.0 and len(got["resources"]) == 2
    assert cli.processes() == []  # preview creates nothing
    assert cli("ls", "--json").json() == []


def test_preview_of_a_cloud_pool_lists_its_stack_and_cost_creating_nothing(cli: CLI) -> None:
    pytest.importorskip("pulumi_aws")
    cli.toml('[pools.gpu]\nprovider = "aws"\nnodes = 2\naccelerator = "A100"\n'
             '[pools.gpu.aws]\nallow_ssh_from = ["10.1.0.0/16"]\n')
    result = cli("preview", "gpu", "--json")
    assert result.code == 0, result
    got = result.json()
    types = [r["type"] for r in got["resources"]]
    assert types.count("aws:ec2/instance:Instance") == 2
    assert types.count("aws:ec2/securityGroup:SecurityGroup") == 1 and "aws:ec2/keyPair:KeyPair" in types
    group = next(r for r in got["resources"] if r["type"].endswith("SecurityGroup"))
    assert "tcp 22 from <this machine's public address>/32, 10.1.0.0/16" in group["detail"], group
    assert got["offer"]["hourly_cost_per_node"] == got["hourly_cost_per_node"] > 0
    assert got["hourly_cost"] == round(got["hourly_cost_per_node"] * 2, 4)
    text = cli("preview", "gpu")
    assert text.code == 0 and "(nothing was created)" in text.out and "+ aws:ec2/instance:Instance  node-1" in text.out
    # Nothing was made: no key, no stack, no registry record (SKYWARD_HOME was never created).
    assert not cli.home.exists() or not any((cli.home / d).exists() for d in ("keys", "stacks", "registry"))


def test_down_unknown_and_bad_usage(cli: CLI) -> None:
    missing = cli("down", "ghost")
    assert missing.code == 1 and "no pool named 'ghost'" in missing.err, missing
    assert cli("down").code == 2
    assert cli("down", "ghost", "--all").code == 2


def test_down_expired_removes_only_expired(cli: CLI) -> None:
    assert cli("up", "keep", "--nodes", "1").code == 0
    result = cli("down", "--expired", "--json")
    assert result.code == 0 and result.json() == [], result
    assert [r["name"] for r in cli("ls", "--json").json()] == ["keep"]


def test_ls_empty_and_bad_flag(cli: CLI) -> None:
    empty = cli("ls")
    assert empty.code == 0 and "no pools" in empty.out
    assert cli("ls", "--bogus").code == 2


def test_status_healthy_then_a_killed_node_is_unreachable(cli: CLI) -> None:
    assert cli("up", "st", "--nodes", "2").code == 0
    ok = cli("status", "st", "--json")
    assert ok.code == 0, ok
    nodes = ok.json()["nodes"]
    assert [n["reachable"] for n in nodes] == [True, True]
    agents = [n["pid"] for n in cli.record("st")["cluster"]["nodes"]]
    assert [n["agent_pid"] for n in nodes] == agents
    os.kill(agents[1], 9)
    deadline = time.monotonic() + 5
    while agents[1] in cli.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    bad = cli("status", "st")
    assert bad.code == 1, bad
    assert "UNREACHABLE" in bad.out or "not running" in bad.out
    assert cli("status", "nope").code == 1


def test_status_counts_the_tasks_a_client_is_running(cli: CLI) -> None:
    import subprocess
    import sys
    import textwrap

    assert cli("up", "busy", "--nodes", "1").code == 0
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import time
            import skyward as sky
            with sky.Compute(name="busy", options=sky.Options(console="silent")) as pool:
                print("attached", flush=True)
                sky.function(time.sleep)(4) >> pool
        """)], cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "attached"
        time.sleep(1.0)
        status = cli("status", "busy", "--json")
        assert status.code == 0, status
        (node,) = status.json()["nodes"]
        assert node["tasks"] == 1, node
    finally:
        client.wait(timeout=60)
    (node,) = cli("status", "busy", "--json").json()["nodes"]
    assert node["tasks"] == 0


def test_history_unknown_name_fails(cli: CLI) -> None:
    result = cli("history", "never-was")
    assert result.code == 1 and "no history" in result.err, result
    verify = cli("history", "never-was", "--verify")  # not "the audit trail is intact"
    assert verify.code == 1 and "no history for a pool named 'never-was'" in verify.err, verify
    assert "intact" not in verify.out, verify
    assert cli("history", "never-was", "--verify", "--json").code == 1


def test_history_verify_of_a_name_taken_down_checks_its_trail(cli: CLI) -> None:
    assert cli("up", "gone", "--nodes", "1").code == 0
    assert cli("down", "gone").code == 0
    verify = cli("history", "gone", "--verify")
    assert verify.code == 0 and "the audit trail of 'gone' is intact" in verify.out, verify
    assert cli("history", "gone", "--verify", "--json").json() == {"ok": True, "problems": []}
    other = cli.home / "audit" / "other.jsonl"  # another name's broken trail is not this one's
    other.write_text('{"n": 0, "prev": ""}\n{"n": 5, "prev": "x"}\n')
    assert cli("history", "gone", "--verify").code == 0
    assert cli("history", "--verify").code == 1
    trail = cli.home / "audit" / "gone.jsonl"
    lines = trail.read_text().splitlines()
    first = json.loads(lines[0])
    first["who"] = "someone-else@elsewhere"
    trail.write_text("".join(line + "\n" for line in [json.dumps(first, sort_keys=True), *lines[1:]]))
    tampered = cli("history", "gone", "--verify")
    assert tampered.code == 1 and "TAMPERED: gone.jsonl" in tampered.out, tampered
    trail.unlink()  # its head remains: the trail was removed, not never written
    removed = cli("history", "gone", "--verify")
    assert removed.code == 1 and "TAMPERED: gone.jsonl" in removed.out, removed


def test_exec_reports_each_node_and_fails_when_a_node_fails(cli: CLI) -> None:
    assert cli("up", "ex", "--nodes", "2").code == 0
    failing = cli("exec", "ex", "--json", "--", "bash", "-c", "echo out; echo err >&2; exit 3")
    assert failing.code == 1, failing
    assert [(r["exit_code"], r["stdout"], r["stderr"]) for r in failing.json()] == [(3, "out\n", "err\n")] * 2
    assert cli("exec", "ex").code == 2  # no command
    assert cli("exec", "ghost", "--", "true").code == 1


def test_logs_show_agent_logs_and_unknown_pool_fails(cli: CLI) -> None:
    assert cli("up", "lg", "--nodes", "2").code == 0
    logs = cli("logs", "lg", "--lines", "5")
    assert logs.code == 0, logs
    assert logs.out.count("agent: serving on /") == 2  # each Local agent on its Unix socket
    one = cli("logs", "lg", "--node", "1", "--json")
    assert [r["node"] for r in one.json()] == [1]
    assert cli("logs", "lg", "--node", "5").code == 2
    assert cli("logs", "nope").code == 1


def test_offers_lists_the_catalogue_and_rejects_unknown_accelerators(cli: CLI) -> None:
    found = cli("offers", "--accelerator", "A100", "--limit", "3", "--json")
    if found.code == 1 and "not available" in found.err:
        pytest.skip("no offer catalogue in this version")
    assert found.code == 0, found
    rows = found.json()
    assert 0 < len(rows) <= 3 and all(r["accelerator"] == "A100" for r in rows)
    assert [r["price"] for r in rows] == sorted(r["price"] for r in rows)
    bad = cli("offers", "--accelerator", "A1OO")
    assert bad.code == 2 and "A1OO" in bad.err, bad


def test_up_of_a_cloud_pool_without_the_pulumi_cli_fails_before_creating_anything(cli: CLI) -> None:
    from skyward.stacks.cli import find

    if find() is not None:
        pytest.skip("the Pulumi CLI is installed here")
    cli.toml('[pools.cloud]\nprovider = "aws"\nnodes = 1\n')
    result = cli("up", "cloud")
    assert result.code == 1, result
    assert "Pulumi" in result.err and "install" in result.err.lower(), result
    assert cli("ls", "--json").json() == []
    assert not (cli.home / "keys").exists() and not (cli.home / "stacks").exists()


def test_a_node_lost_while_attached_is_in_the_history(cli: CLI) -> None:
    assert cli("up", "lossy", "--nodes", "2").code == 0
    client = cli.python("""
        import os, signal, time
        import skyward as sky

        def kill_my_agent():
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)

        def slow(event):  # holds the event thread: the trail's copies of the events wait behind it
            if isinstance(event, sky.InstanceLost):
                time.sleep(1.0)

        sky.subscribe(slow)
        with sky.Compute(name="lossy", options=sky.Options(console="silent")) as pool:
            try:
                pool.run(sky.function(kill_my_agent)(), target=1)
            except sky.NodeLostError:
                print("lost")
            deadline = time.monotonic() + 30
            while pool.current_nodes() < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # its replacement; then the program leaves at once
    """)
    assert client.code == 0 and "lost" in client.out, client
    history = cli("history", "lossy", "--json").json()
    lost = [e for e in history if e["event"] == "node lost"]
    assert [e["node"] for e in lost] == [1], lost
    replaced = [e for e in history if e["event"] == "node replaced"]
    assert [(e["node"], e["rank"]) for e in replaced] == [(1, 1)], replaced
    assert len(cli.record("lossy")["cluster"]["nodes"]) == 2  # the registry knows the new node


def test_an_attached_client_resizes_and_down_stops_every_node(cli: CLI) -> None:
    assert cli("up", "grow", "--nodes", "1").code == 0
    client = cli.python("""
        import time
        import skyward as sky
        with sky.Compute(name="grow", options=sky.Options(console="silent")) as pool:
            pool.resize(2)
            print(pool.current_nodes())
            time.sleep(0.5)  # the event reaches the trail and the registry
    """)
    assert client.code == 0 and client.out.strip() == "2", client
    assert len(cli.record("grow")["cluster"]["nodes"]) == 2
    assert [r["nodes"] for r in cli("ls", "--json").json()] == [2]
    assert "resized" in [e["event"] for e in cli("history", "grow", "--json").json()]
    ran = cli("exec", "grow", "--json", "--", "true")
    assert [r["exit_code"] for r in ran.json()] == [0, 0], ran
    assert cli("down", "grow").code == 0
    assert cli.wait_no_processes(5) == []
