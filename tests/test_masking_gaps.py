"""The masking and at-rest gaps of the second security review: a password of
digits, the OTLP exporter's headers, a password with an "@" in a URL, a secret URL-encoded or in
base64, an uncaught task exception, fingerprints that a guess can be checked against, the
pool's secret in the environment block of the agents and workers, SKYWARD_HOME's mode, and
names with a trailing newline."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

import skyward.observe.secrets as secrets
from skyward.errors import ConfigError
from skyward.observe.secrets import (
    fingerprint,
    is_secret_name,
    mask_url,
    redact,
    register_env,
    secret,
)
from tests.helpers import without_fork_server


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "_REGISTRY", secrets._Registry())


# -- what is masked ---------------------------------------------------------------------------------
def test_a_password_of_digits_is_masked() -> None:
    register_env({"DB_PASSWORD": "73914620", "PGPASSWORD": "4711", "MYSQL_PWD": "2468", "API_TOKEN": "90817263"})
    line = "connecting with 73914620, 4711, 2468 and 90817263"
    assert redact(line) == "connecting with ***, ***, *** and ***"
    # short numbers under key-like names stay settings (API_KEY_INDEX=2 is not a credential)
    register_env({"MAX_TOKEN": "1024", "CACHE_KEY": "12"})
    assert redact("a batch of 1024 in slot 12") == "a batch of 1024 in slot 12"


def test_the_otlp_exporter_headers_are_secret() -> None:
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "otel_exporter_otlp_logs_headers"):
        assert is_secret_name(name), name
    assert not is_secret_name("OTEL_EXPORTER_OTLP_ENDPOINT")
    register_env({"OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team=hcKey0123456789,Authorization=Bearer%20tok-abcdef98"})
    assert redact("sending with hcKey0123456789") == "sending with ***"
    assert redact("header Authorization: Bearer tok-abcdef98") == "header Authorization: ***"
    assert redact("token tok-abcdef98 alone") == "token *** alone"  # the credential alone too

    from skyward.records.record import _secret

    assert _secret("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc")  # a record keeps its fingerprint only


def test_a_url_password_with_an_at_sign_is_masked_whole() -> None:
    assert mask_url("pip from https://u:p@ss@host.example/simple now") == "pip from https://***@host.example/simple now"
    assert mask_url("https://tok@en@pkgs.example") == "https://***@pkgs.example"
    assert not secrets.has_credentials(mask_url("https://u:p@ss@h/x"))
    # an address after the URL is not part of its userinfo
    assert mask_url("see https://host.example/a or mail bob@example.com") == (
        "see https://host.example/a or mail bob@example.com")
    assert mask_url('{"url": "https://host.example", "owner": "bob@example.com"}') == (
        '{"url": "https://host.example", "owner": "bob@example.com"}')


def test_encoded_forms_of_a_secret_are_masked() -> None:
    value = "s3cr3t/p@ss+w0rd!x"
    secret(value)
    assert "s3cr3t" not in redact(f"GET /login?pw={quote(value, safe='')}")
    assert "s3cr3t" not in redact(f"form pw={quote_plus(value)}")
    for prefix in ("", "u:", "ab:", "user:"):  # base64 groups three bytes: each alignment
        encoded = base64.b64encode(f"{prefix}{value}".encode()).decode()
        shown = redact(f"Authorization: Basic {encoded}")
        assert encoded not in shown and "***" in shown, (prefix, shown)
        left = shown.removeprefix("Authorization: Basic ").replace("***", "")
        # what is left: the prefix's characters, and the last group (two bytes of the value at most)
        assert len(left) <= -(-len(prefix) * 4 // 3) + 4, shown
    urlsafe = base64.urlsafe_b64encode(value.encode()).decode()
    assert urlsafe.rstrip("=") not in redact(urlsafe)


def test_an_uncaught_task_exception_is_printed_masked(tmp_path: Path) -> None:
    script = tmp_path / "uncaught.py"
    script.write_text(textwrap.dedent("""
        import os
        import skyward as sky

        @sky.function
        def boom():
            raise ValueError("bad password " + os.environ["DB_PASSWORD"])

        with sky.Compute(nodes=1, image=sky.Image(env={"DB_PASSWORD": "hunter2-xyzzy"}),
                         options=sky.Options(console=False)) as pool:
            boom() >> pool
    """))
    env = {**os.environ, "SKYWARD_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "ValueError: bad password ***" in proc.stderr, proc.stderr
    assert "hunter2-xyzzy" not in proc.stderr + proc.stdout


# -- fingerprints ----------------------------------------------------------------------------------
def test_a_fingerprint_is_keyed_and_cannot_be_checked_against_a_guess(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "a"))
    pin = "73914620"
    kept = fingerprint(pin)
    plain = hashlib.sha256(pin.encode()).hexdigest()[:16]
    assert plain not in kept  # a record's 8-digit PIN is not 10^8 hashes away
    assert kept == fingerprint(pin) and kept != fingerprint("73914621")
    assert secrets.fingerprint_matches(pin, kept) and not secrets.fingerprint_matches("x" + pin, kept)
    key = tmp_path / "a" / "fingerprint.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "b"))
    assert fingerprint(pin) != kept  # another home, another key
    # a record written before fingerprints were keyed still compares
    assert secrets.fingerprint_matches(pin, "sha256:" + plain)


# -- names -----------------------------------------------------------------------------------------
def test_a_name_with_a_trailing_newline_is_refused() -> None:
    from skyward.named.registry import NAME_RULE, check_name
    from skyward.volumes import Volume

    assert check_name("train-a100") == "train-a100"
    with pytest.raises(ConfigError):
        check_name("train\n")
    assert NAME_RULE.match("train\n") is None  # callers that use match() too
    with pytest.raises(ConfigError):
        Volume(bucket="my-bucket\n", mount="/data")


# -- SKYWARD_HOME ----------------------------------------------------------------------------------
def test_the_home_and_its_cache_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.bootstrap import wheelhouse
    from skyward.records import resolver

    old = os.umask(0o022)
    try:
        home = tmp_path / "fresh" / "home"
        monkeypatch.setenv("SKYWARD_HOME", str(home))
        wheelhouse.cache_dir("uv", "x")
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE((home / "cache").stat().st_mode) == 0o700
        # a home made before, by the umask: closed on first use
        older = tmp_path / "older"
        (older / "cache").mkdir(parents=True, mode=0o755)
        older.chmod(0o755)
        (older / "cache").chmod(0o755)
        monkeypatch.setenv("SKYWARD_HOME", str(older))
        resolver.uv_version.cache_clear()
        resolver.uv_version()
        assert stat.S_IMODE(older.stat().st_mode) == 0o700
        assert stat.S_IMODE((older / "cache").stat().st_mode) == 0o700
        # records, logs... made under a fresh home: the home is 0700 whoever makes it first
        third = tmp_path / "third"
        monkeypatch.setenv("SKYWARD_HOME", str(third))
        from skyward.paths import skyward_home

        (skyward_home() / "records").mkdir(parents=True, exist_ok=True, mode=0o700)
        assert stat.S_IMODE(third.stat().st_mode) == 0o700
    finally:
        os.umask(old)


# -- the pool's secret in /proc/PID/environ ------------------------------------------------------
def _environ_holders(token: str) -> dict[str, list[int]]:
    """On the node: which processes' environment blocks hold ``token`` (this worker's, its
    agent's, the agent's parent's, and every other one readable here)."""
    import os as _os

    found: dict[str, list[int]] = {"self": [], "agent": [], "any": []}
    wanted = token.encode()
    agent = _os.getppid()
    for entry in _os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                block = f.read()
        except OSError:
            continue
        if wanted in block:
            found["any"].append(int(entry))
            if int(entry) == _os.getpid():
                found["self"].append(int(entry))
            if int(entry) == agent:
                found["agent"].append(int(entry))
    return found


@pytest.mark.parametrize("forked", [True, False], ids=["fork-server", "own-interpreter"])
def test_tasks_do_not_find_the_pools_secret_in_any_environ(forked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import skyward as sky

    if not forked:  # the path where the fork server cannot run: each agent a new interpreter
        without_fork_server(monkeypatch, "not in this test")
    holders = sky.function(_environ_holders)
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        token = pool.cluster.token
        assert len(token) >= 32
        for found in holders(token) @ pool:
            assert found == {"self": [], "agent": [], "any": []}, found


@pytest.mark.parametrize("value", ["12345678", "87654321x", "s3cr3t/p@ss+w0rd!x", "correct horse"])
def test_no_character_of_a_base64_form_that_holds_the_secret_shows(value: str) -> None:
    """The review's 8-digit password: the last base64 group of ``user:PASSWORD`` printed as it
    was, and it held the last two digits. Every character that depends on the value, the
    groups it shares with what comes before and after included, is masked; what depends on
    the text around it alone is left."""
    secret(value)
    other = bytes(b ^ 0xFF for b in value.encode())  # every bit of the value flipped
    for prefix in ("", "u", "u:", "user:", "a longer user name:"):
        for suffix in ("", "@", "@h", "\n", "@db.example.com:5432"):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                encoded = encode(prefix.encode() + value.encode() + suffix.encode()).decode()
                changed = encode(prefix.encode() + other + suffix.encode()).decode()
                held = [i for i, (a, b) in enumerate(zip(encoded, changed, strict=True)) if a != b]
                expected = encoded[:held[0]] + "***" + encoded[held[-1] + 1:]
                assert redact(encoded) == expected, (prefix, suffix, encoded)
