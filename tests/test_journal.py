"""The event journal of named pools (skyward/observe/journal.py): bounded, private, each pool's
own events only, secrets masked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from skyward.observe import events as ev
from skyward.observe import journal, secrets


def test_the_journal_keeps_two_generations_at_most(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "MAX_BYTES", 4096)
    for i in range(400):
        journal.append("big", [{"time": float(i), "event": "Error", "message": f"line {i}"}])
    files = sorted(p.name for p in (home / "events").iterdir())
    assert files == ["big.1.jsonl", "big.jsonl"]
    assert all((home / "events" / f).stat().st_size <= 4096 for f in files)
    kept = journal.read("big")
    assert kept[-1]["message"] == "line 399" and len(kept) < 400  # the oldest went, the newest stay
    assert [e["time"] for e in kept] == sorted(e["time"] for e in kept)
    assert stat.S_IMODE((home / "events" / "big.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "events").stat().st_mode) == 0o700


def test_a_journal_writes_its_own_pool_only_and_masks_secrets(home: Path) -> None:
    secrets.register("hunter2-token-value")
    j = journal.Journal("mine", "provision")
    ev.bus.emit(ev.ClusterRequested(pool="other", provider="local", nodes=1))  # another pool of this process
    ev.bus.emit(ev.ClusterRequested(pool="p1", provider="local", nodes=2))
    ev.bus.flush()
    close = j.bind("p1")  # held events of p1 are written, the others dropped
    ev.bus.emit(ev.Error(pool="p1", message="failed with hunter2-token-value inside"))
    ev.bus.emit(ev.Error(pool="other", message="not mine"))
    close()
    ev.bus.emit(ev.Error(pool="p1", message="after close"))
    ev.bus.flush()
    kept = journal.read("mine")
    assert [(e["event"], e["pool"]) for e in kept] == [("ClusterRequested", "p1"), ("Error", "p1")]
    assert kept[1]["message"] == "failed with *** inside" and kept[1]["role"] == "provision"
    assert kept[1]["pid"] == os.getpid()
    assert isinstance(journal.rebuilt(kept[0]), ev.ClusterRequested)


def test_a_failed_opening_keeps_the_attempt_that_raised(home: Path) -> None:
    j = journal.Journal("failing", "provision")
    ev.bus.emit(ev.ClusterRequested(pool="a", provider="local", nodes=1))
    ev.bus.emit(ev.ClusterRequested(pool="b", provider="local", nodes=1))  # opened at the same time
    ev.bus.emit(ev.Error(pool="b", message="the other pool broke"))
    ev.bus.emit(ev.Error(pool="a", message="no such package"))
    j.failed(RuntimeError("no such package"))
    assert [(e["event"], e["pool"]) for e in journal.read("failing")] == [("ClusterRequested", "a"), ("Error", "a")]


def test_requests_and_the_shutdown_are_journaled_and_told_as_the_console_tells_them(home: Path) -> None:
    from skyward.named import eventlog

    j = journal.Journal("told", "provision")
    close = j.bind("p2")
    ev.bus.emit(ev.InstanceRequested(pool="p2", provider="local", count=2))
    ev.bus.emit(ev.InstanceRequested(pool="p2", provider="local", replacing=1))
    ev.bus.emit(ev.ShutdownRequested(pool="p2", nodes=2))
    ev.bus.emit(ev.ShutdownCompleted(pool="p2", nodes=2, seconds=0.25))
    ev.bus.emit(ev.ShutdownCompleted(pool="p2", nodes=2, seconds=1.5, ok=False))
    ev.bus.flush()
    close()
    kept = journal.read("told")
    assert [e["event"] for e in kept] == ["InstanceRequested", "InstanceRequested", "ShutdownRequested",
                                          "ShutdownCompleted", "ShutdownCompleted"]
    assert [journal.rebuilt(e) for e in kept] == [
        ev.InstanceRequested(pool="p2", provider="local", count=2, time=kept[0]["time"]),
        ev.InstanceRequested(pool="p2", provider="local", replacing=1, time=kept[1]["time"]),
        ev.ShutdownRequested(pool="p2", nodes=2, time=kept[2]["time"]),
        ev.ShutdownCompleted(pool="p2", nodes=2, seconds=0.25, time=kept[3]["time"]),
        ev.ShutdownCompleted(pool="p2", nodes=2, seconds=1.5, ok=False, time=kept[4]["time"]),
    ]
    lines = [eventlog.describe(e) for e in kept]
    assert lines[0].startswith("pool told: asking local for 2 node(s)  [pool p2")
    assert lines[1].startswith("node 1: asking local for a node in its place")
    assert lines[2].startswith("pool told: shutting down 2 node(s)")
    assert lines[3].startswith("pool told: shut down, 2 node(s) in 0.25 s")
    assert lines[4].startswith("pool told: shut down with an error, 2 node(s) in 1.50 s")
