"""Records, locks, reproduce, diff and the tamper-evident trail, on real Local pools.

The package the pools install, ``skyprobe``, is built in the test as wheels (1.0, then 2.0) and
served from the test's own package index (tests/record/pkgindex.py), so "a newer version came
out" is something the test does, not something it waits for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.errors import RecordError
from skyward.named.cli import main
from skyward.records import audit, record

sys.path.insert(0, str(Path(__file__).parent))
from pkgindex import Index

QUIET = sky.Options(console=False, logging=False)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    ix = Index(tmp_path / "index")
    ix.publish("1.0")
    yield ix
    ix.close()


def image(ix: Index, **extra: object) -> sky.Image:
    return sky.Image(pip=["skyprobe"], pip_indexes=[sky.PipIndex(url=ix.url, packages=("skyprobe",))], **extra)  # type: ignore[arg-type]


@sky.function
def probe() -> str:
    import skyprobe  # type: ignore[import-not-found]

    return str(skyprobe.VERSION)


def open_pool(ix: Index, **extra: object) -> tuple[str, str]:
    with sky.Compute(image=image(ix, **extra), options=QUIET) as pool:
        return pool.id, probe() >> pool


def packages(pool_id: str) -> dict[str, str]:
    return {p["name"]: p["version"] for p in record.read(pool_id)["lock"]["packages"]}


def test_a_pool_records_the_exact_version_and_reproduce_installs_it_after_a_newer_one(
        home: Path, index: Index, capsys: pytest.CaptureFixture[str]) -> None:
    first, seen = open_pool(index)
    assert seen == "1.0"
    lock = record.read(first)["lock"]
    assert packages(first) == {"skyprobe": "1.0"}
    assert lock["packages"][0]["hashes"][0].startswith("sha256:")
    assert lock["python"].count(".") == 2 and lock["skyward"] == sky.__version__

    index.publish("2.0")  # a newer version: a fresh pool gets it...
    fresh, seen = open_pool(index)
    assert seen == "2.0" and packages(fresh) == {"skyprobe": "2.0"}

    with sky.Compute(reproduce=first, options=QUIET) as pool:  # ...a reproduction does not
        assert probe() >> pool == "1.0"
        again = pool.id
    assert record.read(again)["reproduces"] == first
    assert record.read(again)["lock"]["pinned"] is True

    capsys.readouterr()
    assert main(["diff", first, fresh]) == 1  # different pins: listed, exit 1
    out = capsys.readouterr().out
    assert "package changed" in out and "skyprobe" in out and "1.0" in out and "2.0" in out
    assert main(["diff", first, again]) == 0
    capsys.readouterr()
    assert main(["diff", first, fresh, "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == [
        {"what": "package changed", "key": "skyprobe", "a": "1.0", "b": "2.0"}]


def test_the_record_says_who_when_where_from_spec_and_cost(
        home: Path, index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "project"
    repo.mkdir()
    script = repo / "train.py"
    script.write_text("print('hi')\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    script.write_text("print('changed')\n")  # uncommitted: dirty
    monkeypatch.setattr(sys, "argv", [str(script), "--epochs", "3"])
    monkeypatch.chdir(tmp_path)

    pool_id, _ = open_pool(index, env={"MODE": "fast", "API_TOKEN": "s3cr3t-value-123"})
    r = record.read(pool_id)
    assert r["id"] == pool_id and r["name"] is None and r["provider"] == "local"
    assert r["who"] == audit.who() and r["created"] > 0
    assert r["origin"]["script"] == str(script) and r["origin"]["argv"] == ["--epochs", "3"]
    assert r["origin"]["cwd"] == str(tmp_path)
    assert r["origin"]["git"]["commit"] == commit and r["origin"]["git"]["dirty"] is True
    assert r["spec"]["image"]["pip"] == ["skyprobe"] and r["spec"]["nodes"]["desired"] == 1
    assert r["hourly_cost"] == 0.0 and r["nodes"] == 1
    # A secret's value is in neither the record nor the trail; a plain value is.
    assert r["spec"]["image"]["env"]["MODE"] == "fast"
    assert r["spec"]["image"]["env"]["API_TOKEN"].startswith("hmac:")  # keyed: no guess can be checked
    for path in [*home.joinpath("records").iterdir(), *home.joinpath("audit").iterdir()]:
        assert "s3cr3t-value-123" not in path.read_text(), path
        assert path.stat().st_mode & 0o077 == 0, path

    capsys.readouterr()
    assert main(["history", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["id"] for p in listed] == [pool_id] and listed[0]["commit"] == commit and listed[0]["dirty"]
    assert listed[0]["closed"] is not None
    assert main(["history", pool_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == r
    assert main(["history"]) == 0
    assert pool_id in capsys.readouterr().out


def test_a_secret_env_value_comes_from_this_environment_when_reproducing(
        home: Path, index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    pool_id, _ = open_pool(index, env={"API_TOKEN": "s3cr3t-value-123"})
    monkeypatch.delenv("API_TOKEN", raising=False)
    rep = record.reproduction(pool_id)
    assert any("API_TOKEN" in d and "not recorded" in d for d in rep.differences)
    monkeypatch.setenv("API_TOKEN", "s3cr3t-value-123")
    rep = record.reproduction(pool_id)
    assert rep.differences == () and rep.spec.image.env["API_TOKEN"] == "s3cr3t-value-123"


def test_a_yanked_version_is_said_before_anything_is_created_and_strict_refuses(
        home: Path, index: Index) -> None:
    first, _ = open_pool(index)
    index.withdraw("1.0")
    index.publish("2.0")
    before = sorted(p.name for p in home.joinpath("records").iterdir())
    with pytest.raises(RecordError, match=r"skyprobe==1.0 is not available"):
        sky.Compute(reproduce=first, strict=True, options=QUIET).open()
    assert sorted(p.name for p in home.joinpath("records").iterdir()) == before  # nothing was made
    assert main(["reproduce", first, "--strict"]) == 1


def test_a_changed_record_is_refused(home: Path, index: Index) -> None:
    pool_id, _ = open_pool(index)
    path = home / "records" / f"{pool_id}.json"
    data = json.loads(path.read_text())
    data["lock"]["packages"][0]["version"] = "2.0"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="changed after it was written"):
        sky.Compute(reproduce=pool_id, options=QUIET).open()


def test_reproduce_takes_only_a_provider_of_the_same_kind(home: Path, index: Index) -> None:
    pool_id, _ = open_pool(index)
    with pytest.raises(sky.ConfigError, match="nodes"):
        sky.Compute(reproduce=pool_id, nodes=2)
    with pytest.raises(RecordError, match="provider of that kind"):
        sky.Compute(reproduce=pool_id, provider=sky.SSH(hosts=["h"]), options=QUIET).open()


def test_reproduce_from_the_cli_starts_a_named_pool(home: Path, index: Index,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from skyward.providers import local

    first, _ = open_pool(index)
    index.publish("2.0")
    try:
        assert main(["reproduce", first, "--name", "again", "--console", "silent"]) == 0
        assert "reproducing pool" in capsys.readouterr().out
        with sky.Compute(name="again", options=QUIET) as pool:
            assert probe() >> pool == "1.0"
    finally:
        main(["down", "again"])
        for proc in local._DETACHED:
            proc.wait(10)
    trail = [e for e in audit.read(audit.POOLS) if e["event"] == "recorded"]
    assert trail[-1]["pool_name"] == "again" and trail[-1]["reproduces"] == first


def _lines(home: Path, name: str) -> list[str]:
    return (home / "audit" / f"{name}.jsonl").read_text().splitlines()


def _write(home: Path, name: str, lines: list[str]) -> None:
    (home / "audit" / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("tamper, message", [
    ("change", "line 2: was changed"),
    ("remove", "line 2: says it is line 3; lines before it were removed or reordered"),
    ("reorder", "line 2: says it is line 3; lines before it were removed or reordered"),
    ("change last", "line 4: was changed"),
    ("cut", "lines at the end were removed"),
])
def test_verify_names_the_first_line_changed_removed_or_reordered(
        home: Path, tamper: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(4):
        audit.append("train", "exec", "p1", command=f"step {i}")
    assert audit.verify() == []
    assert main(["history", "--verify"]) == 0
    lines = _lines(home, "train")
    if tamper in ("change", "change last"):
        at = 1 if tamper == "change" else 3
        entry = json.loads(lines[at])
        entry["who"] = "someone-else@elsewhere"
        lines[at] = json.dumps(entry, sort_keys=True)
    elif tamper == "remove":
        del lines[1]
    elif tamper == "reorder":
        lines[1], lines[2] = lines[2], lines[1]
    else:
        lines = lines[:-1]
    _write(home, "train", lines)
    capsys.readouterr()
    assert main(["history", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"train.jsonl {message}" in out or message in out, out
    # Still append-only and private: a new line chains on whatever is there now.
    assert os.stat(home / "audit" / "train.jsonl").st_mode & 0o777 == 0o600


def test_trails_written_before_the_chain_still_verify(home: Path) -> None:
    folder = home / "audit"
    folder.mkdir(parents=True)
    (folder / "old.jsonl").write_text('{"event": "provisioned", "pool": "a"}\n{"event": "destroyed", "pool": "a"}\n')
    audit.append("old", "provisioned", "b")
    assert audit.verify() == []
    assert audit.read("old")[-1]["n"] == 2
