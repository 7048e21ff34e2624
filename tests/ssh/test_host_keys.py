"""Host keys the user already trusts count, against real sshd test hosts.

Before trusting a host's key on first use, skyward consults the known_hosts files the user's
OpenSSH trusts (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts``, or what ``UserKnownHostsFile``
/ ``GlobalKnownHostsFile`` in ``~/.ssh/config`` name). Every test runs with a HOME of its own,
never this machine's ``~/.ssh``.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

import skyward as sky
from skyward.bootstrap.remote import Remote, Target

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own, with an empty ~/.ssh (0700, as ssh wants it)."""
    folder = tmp_path / "home"
    (folder / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(folder))
    return folder


@pytest.fixture
def host(ssh_hosts: Any) -> Iterator[Any]:
    yield ssh_hosts(1)[0]


def _name(h: Any) -> str:
    """The host as known_hosts names it."""
    return h.address if h.port == 22 else f"[{h.address}]:{h.port}"


def _hashed(line: str) -> str:
    """``line`` with its host name hashed, as `HashKnownHosts yes` writes it."""
    name, rest = line.split(" ", 1)
    return f"{paramiko.HostKeys.hash_host(name)} {rest}"


def _connect(h: Any, known_hosts: Path) -> None:
    remote = Remote(Target(h.address, h.port, h.user, str(h.key_path), known_hosts=str(known_hosts)),
                    retry_for=20.0, label=f"node 0 ({h.address})")
    try:
        remote.open()
        assert remote.run("echo ok")[1].strip() == "ok"
    finally:
        remote.close()


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What reached the console (skyward's console shows WARNING and above)."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("skyward")]


def _other_key(tmp_path: Path, name: str) -> str:
    """A host key line body ("ssh-ed25519 AAAA...") that no test host has."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    return " ".join((tmp_path / f"{name}.pub").read_text().split()[:2])


@pytest.mark.parametrize("where", ["user", "user-hashed", "global"])
def test_a_key_the_user_already_trusts_is_used_without_trust_on_first_use(
        host: Any, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str) -> None:
    line = host.known_hosts_line
    if where == "global":  # /etc/ssh/ssh_known_hosts, moved where the test may write by ~/.ssh/config
        system = tmp_path / "ssh_known_hosts"
        system.write_text(line + "\n")
        (home / ".ssh" / "config").write_text(f"GlobalKnownHostsFile {system}\n")
    else:
        (home / ".ssh" / "known_hosts").write_text(
            "# earlier hosts\n" + (_hashed(line) if where == "user-hashed" else line) + "\n")
    ours = tmp_path / "skyward_known_hosts"
    with caplog.at_level(logging.INFO, logger="skyward"):
        _connect(host, ours)
    assert _said(caplog) == []  # nothing trusted on first use, nothing to say
    assert not ours.exists() or _name(host) not in ours.read_text()


def test_a_key_other_than_the_one_the_user_trusts_is_refused_with_the_fix(
        host: Any, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    users = home / ".ssh" / "known_hosts"
    # The host's entry is hashed and on line 3: the message must still find it.
    users.write_text("# my hosts\n10.9.9.9 " + _other_key(tmp_path, "a") + "\n"
                     + _hashed(f"{_name(host)} {_other_key(tmp_path, 'b')}") + "\n")
    ours = tmp_path / "skyward_known_hosts"
    with pytest.raises(sky.HostKeyError) as info:
        _connect(host, ours)
    message = str(info.value)
    assert f"{users} line 3" in message, message
    assert "SHA256:" in message, message  # fingerprints as `ssh-keygen -l` shows them
    assert not ours.exists(), "a refused key is never recorded"
    command = next(line.strip() for line in message.splitlines() if line.strip().startswith("ssh-keygen -R"))
    assert command == f"ssh-keygen -R '{_name(host)}' -f {users}", message
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert done.returncode == 0, done
    assert users.read_text().count("\n") == 2  # the other host's line stays
    with caplog.at_level(logging.INFO, logger="skyward"):  # the way out works: first use again
        _connect(host, ours)
    assert len(_said(caplog)) == 1


def test_a_new_key_is_recorded_and_said_on_the_console_once(
        host: Any, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ours = tmp_path / "skyward_known_hosts"
    with caplog.at_level(logging.INFO, logger="skyward"):
        # Two connections at once (two nodes behind one bastion do that), then a later one.
        threads = [threading.Thread(target=_connect, args=(host, ours)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _connect(host, ours)
    said = _said(caplog)
    assert len(said) == 1, said
    fingerprint = subprocess.run(["ssh-keygen", "-lf", "-"], input=host.known_hosts_line, text=True,
                                 capture_output=True, check=True).stdout.split()[1]
    assert _name(host) in said[0] and fingerprint in said[0] and str(ours) in said[0], said
    assert ours.read_text() == host.known_hosts_line + "\n"  # one line, no duplicate
    assert ours.stat().st_mode & 0o077 == 0


def test_the_files_consulted_follow_openssh(home: Path, tmp_path: Path) -> None:
    """OpenSSH's defaults, or what ~/.ssh/config names (~, %d, %u, %h and %k expanded)."""
    from skyward.bootstrap.remote import trusted_known_hosts

    assert trusted_known_hosts({}, "h") == [home / ".ssh/known_hosts", home / ".ssh/known_hosts2",
                                            Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2")]
    config = {"userknownhostsfile": "~/kh %d/.kh/%h", "globalknownhostsfile": f"{tmp_path}/g"}
    assert trusted_known_hosts(config, "node1") == [home / "kh", home / ".kh/node1", tmp_path / "g"]
    assert trusted_known_hosts({"userknownhostsfile": "none", "globalknownhostsfile": "none"}, "h") == []


def test_a_key_that_changed_since_skyward_recorded_it_names_skywards_file_and_line(
        host: Any, home: Path, tmp_path: Path) -> None:
    ours = tmp_path / "skyward_known_hosts"
    ours.write_text("10.9.9.9 " + _other_key(tmp_path, "a") + "\n")
    _connect(host, ours)  # trusted on first use: line 2
    host.restart(new_host_key=True)
    with pytest.raises(sky.HostKeyError) as info:
        _connect(host, ours)
    message = str(info.value)
    assert f"{ours} line 2" in message, message
    assert f"    ssh-keygen -R '{_name(host)}' -f {ours}\n" in message, message


def test_known_keys_reads_what_paramiko_reads_and_sees_a_changed_file(tmp_path: Path) -> None:
    from skyward.bootstrap.remote import known_keys

    keys = [paramiko.Ed25519Key.from_path(_keygen(tmp_path, f"k{i}")) for i in range(3)]
    line = [f"{k.get_name()} {k.get_base64()}" for k in keys]
    path = tmp_path / "known_hosts"
    lines = [
        "# a comment",
        f"10.0.0.1 {line[0]}",
        _hashed(f"[10.0.0.2]:2222 {line[1]}"),
        f"10.0.0.4,10.0.0.1 {line[2]}",
        f"10.0.0.1 {line[0]}",  # the same again: once
    ]
    path.write_text("\n".join(lines) + "\n")
    for name in ("10.0.0.1", "[10.0.0.2]:2222", "10.0.0.4", "10.0.0.9"):
        found = paramiko.HostKeys(str(path)).lookup(name)
        assert known_keys(path, name) == list(dict.fromkeys((found or {}).values())), name
    assert known_keys(path, "10.0.0.1") == [keys[0]]  # paramiko checks the first key of a type
    # a broken line is skipped, as OpenSSH skips it (paramiko's HostKeys gives up on the file)
    path.write_text("\n".join([*lines[:3], "10.0.0.3 ssh-ed25519 not-base64!", *lines[3:]]) + "\n")
    assert known_keys(path, "10.0.0.4") == [keys[2]]
    path.write_text(f"10.0.0.1 {line[1]}\n")  # the file changed: read again
    assert known_keys(path, "10.0.0.1") == [keys[1]]
    assert known_keys(path, "[10.0.0.2]:2222") == []


def _keygen(folder: Path, name: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    return folder / name
