"""Where a pool came from, read without git where the repository is plain, and the audit trail
under threads that fork (the pool writes its record on a thread of its own)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from skyward.records import audit
from skyward.records.record import _git


def _repo(path: Path) -> list[str]:
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "trunk"], check=True)
    (path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    return git


def _asked(path: Path) -> dict[str, object]:
    """What git itself says, as the record had it when it asked git for everything."""
    def run(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()

    return {"root": run("rev-parse", "--show-toplevel"), "commit": run("rev-parse", "HEAD"),
            "branch": run("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}


def test_the_git_state_read_from_the_files_is_what_git_says(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "deep" / "er").mkdir(parents=True)
    git = _repo(repo)
    assert _git(repo / "deep" / "er") == _asked(repo) and _asked(repo)["branch"] == "trunk"
    (repo / "a.py").write_text("x = 2\n")  # a tracked file changed
    assert _git(repo) == _asked(repo) and _asked(repo)["dirty"] is True
    subprocess.run([*git, "pack-refs", "--all"], check=True)  # the branch only in packed-refs
    assert not (repo / ".git" / "refs" / "heads" / "trunk").exists()
    assert _git(repo) == _asked(repo)
    subprocess.run([*git, "checkout", "-q", "--detach"], check=True)  # detached: branch "HEAD"
    assert _git(repo) == _asked(repo) and _asked(repo)["branch"] == "HEAD"


def test_a_worktree_and_an_unborn_branch_ask_git_and_no_repository_is_none(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = _repo(repo)
    subprocess.run([*git, "worktree", "add", "-q", str(tmp_path / "wt")], check=True)  # .git is a file there
    assert _git(tmp_path / "wt") == _asked(tmp_path / "wt")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    subprocess.run(["git", "-C", str(fresh), "init", "-q"], check=True)  # no commit yet
    got = _git(fresh)
    assert got is not None and got["root"] == str(fresh.resolve()) and got["commit"] is None
    lone = tmp_path / "lone"
    lone.mkdir()
    assert _git(lone) is None or _git(lone)["root"] != str(lone)  # (tmp_path is in no repository here)


def test_a_fork_waits_for_the_append_another_thread_is_making(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked while another thread appends to a trail must not inherit the trail's held
    flock: the parent's next append (its pool's close) would wait as long as the child lives."""
    inside, go = threading.Event(), threading.Event()
    real = audit._write_head

    def slow(path: Path, n: int, digest: str) -> None:  # inside the flock
        inside.set()
        go.wait(10)
        real(path, n, digest)

    monkeypatch.setattr(audit, "_write_head", slow)
    appending = threading.Thread(target=audit.append, args=("t", "exec", "p1"))
    appending.start()
    assert inside.wait(10)
    threading.Timer(0.2, go.set).start()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: is the trail's flock free, and the line there?
        code = 1
        try:
            import fcntl

            fd = os.open(audit._path("t"), os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(write, str(len(Path(audit._path("t")).read_text().splitlines())).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    said = os.read(read, 16)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    appending.join(10)
    assert os.waitstatus_to_exitcode(status) == 0 and said == b"1"
    monkeypatch.setattr(audit, "_write_head", real)
    audit.append("t", "exec", "p2")  # and the parent appends on, at once
    assert audit.verify("t") == []
