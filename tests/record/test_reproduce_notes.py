"""What a reproduction of a cloud pool cannot get again -- an instance type no longer sold, a
price that changed -- is said before anything is created, and strict refuses. The records are
written with record.write (so the trail holds their hash); nothing is provisioned."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.errors import RecordError
from skyward.records import record

pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def cloud_record(pool_id: str, instance_type: str, hourly_cost: float | None) -> str:
    spec = sky.Spec(provider=sky.AWS(region="us-east-1"))
    worker = sky.Worker()
    record.write({
        "format": record.FORMAT, "id": pool_id, "name": None, "provider": "aws", "created": time.time(),
        "spec": record.spec_view(spec, worker), "nodes": 1, "offer": None,
        "hourly_cost": hourly_cost, "total_hourly_cost": hourly_cost, "reproduces": None,
        "lock": {"packages": [], "apt": {}, "skyward": sky.__version__,
                 "cloud": {"image": "ami-0recorded1", "instance_type": instance_type, "region": "us-east-1"}},
        "rebuild": record._rebuild_blob(spec, worker),
    })
    return pool_id


def test_an_instance_type_no_longer_sold_is_said_and_strict_refuses() -> None:
    pool_id = cloud_record("gone0001", "m1.gone-forever", 0.1)
    rep = record.reproduction(pool_id)
    provider: Any = rep.spec.provider
    assert (provider.ami, provider.instance_type) == ("ami-0recorded1", "m1.gone-forever")
    assert any("cannot be had" in d and "m1.gone-forever" in d for d in rep.differences), rep.differences
    with pytest.raises(RecordError, match=r"cannot be reproduced exactly \(--strict\)"):
        sky.Compute(reproduce=pool_id, strict=True, options=sky.Options(console=False)).open()


def test_a_changed_price_is_said_and_the_same_price_is_not() -> None:
    rep = record.reproduction(cloud_record("same0001", "t3.medium", None))
    now = rep.spec.provider.hourly_cost(rep.spec)
    assert now is not None and not any("price" in d for d in rep.differences)
    rep = record.reproduction(cloud_record("same0002", "t3.medium", now))
    assert not any("price" in d for d in rep.differences), rep.differences
    rep = record.reproduction(cloud_record("price001", "t3.medium", now + 1.0))
    assert any("the price changed" in d for d in rep.differences), rep.differences
    with pytest.raises(RecordError, match="the price changed"):
        record.say(rep, strict=True)


def test_diff_of_an_edited_record_says_so_and_still_compares(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skyward.named.cli import main

    cloud_record("edit0001", "t3.medium", 0.1)
    cloud_record("edit0002", "t3.medium", 0.1)
    capsys.readouterr()
    assert main(["diff", "edit0001", "edit0002"]) == 0
    assert "warning" not in capsys.readouterr().err
    path = record.records_dir() / "edit0002.json"
    path.write_text(path.read_text().replace("t3.medium", "t3.large"))  # edited by hand
    assert main(["diff", "edit0001", "edit0002"]) == 1
    out, err = capsys.readouterr()
    assert "t3.large" in out
    assert "warning: the record of pool edit0002 was changed after it was written" in err
    assert "edit0001" not in err
