"""Everything the ``skyward`` command prints of a node -- ``exec`` (text and --json), ``logs``,
``cp`` errors -- and the trail's ``command=`` mask a pool's secrets: a
secret ``Image.env`` value and a package index's password, on a real named Local pool, read by
real CLI processes that only know them from the pool's own settings."""

from __future__ import annotations

import json

from .conftest import CLI

SECRET = "cli-env-secret-3141"
PASSWORD = "cli-index-pass-2718"
URL = f"https://bob:{PASSWORD}@pkgs.invalid/simple"


def clean(*texts: str) -> bool:
    return not any(s in t for t in texts for s in (SECRET, PASSWORD))


def test_exec_logs_cp_and_the_trail_mask_the_pools_secrets(cli: CLI) -> None:
    cli.toml(f"""
        [pools.sec]
        provider = "local"
        nodes = 1
        ttl = 120
        [pools.sec.image]
        env = {{ API_KEY = "{SECRET}", EXTRA_INDEX = "{URL}" }}
    """)
    up = cli("up", "sec")
    assert up.code == 0, up
    assert clean(up.out, up.err), up

    text = cli("exec", "sec", "--", "env")
    assert text.code == 0, text
    assert "API_KEY=***" in text.out and "EXTRA_INDEX=https://***@pkgs.invalid/simple" in text.out, text
    assert clean(text.out, text.err), text

    as_json = cli("exec", "sec", "--json", "--", "env")
    assert as_json.code == 0, as_json
    (result,) = as_json.json()
    assert "API_KEY=***" in result["stdout"]
    assert clean(as_json.out, as_json.err), as_json

    # The secret in the command itself, and in what fails: the trail and stderr mask it too.
    failed = cli("exec", "sec", "--", "sh", "-c", f"echo {SECRET} >&2; exit 3")
    assert failed.code == 1 and "***" in failed.out, failed
    assert clean(failed.out, failed.err), failed

    # A node's log with the secret in it (written there by the node itself).
    log = cli.record("sec")["cluster"]["nodes"][0]["log"]
    wrote = cli("exec", "sec", "--", "sh", "-c", f'echo "leaked $API_KEY and {URL}" >> {log}')
    assert wrote.code == 0, wrote
    logs = cli("logs", "sec")
    assert logs.code == 0 and "leaked ***" in logs.out, logs
    assert clean(logs.out, logs.err), logs
    logs_json = cli("logs", "sec", "--json")
    assert logs_json.code == 0 and clean(logs_json.out, logs_json.err), logs_json

    copied = cli("cp", f"sec:/no/such/{SECRET}", str(cli.cwd / "here"))
    assert copied.code != 0 and "***" in copied.err, copied
    assert clean(copied.out, copied.err), copied

    trail = cli("history", "sec", "--json")
    assert trail.code == 0, trail
    commands = [e.get("command") for e in trail.json() if e.get("event") == "exec"]
    assert any(c and "***" in c for c in commands), commands
    assert clean(trail.out, trail.err), trail
    audit = (cli.home / "audit" / "sec.jsonl").read_text()
    assert clean(audit)
    assert all(clean(json.dumps(json.loads(line))) for line in audit.splitlines())
