"""The stacks' grants for sky.Volume(storage=None): an IAM role + instance profile on AWS, a
bucket-level role for each node's service account on GCP; least privilege, shown by preview.

Pulumi mocks accept any input, so the policy rules that matter are checked on the documents
themselves (no write action for read-only volumes, no wildcard resource, prefixes kept)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")
pytest.importorskip("pulumi_gcp")

from stackfakes import Recorder, fresh_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.stacks import aws, buckets, gcp  # noqa: E402
from skyward.stacks.plan import BucketPlan, PoolPlan  # noqa: E402

WRITE = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
         "s3:ListBucketMultipartUploads"}
RO = (BucketPlan("datasets", "imagenet/v2", True),)
RW = (BucketPlan("datasets", "imagenet/v2", True), BucketPlan("checkpoints", "", False))


@pytest.fixture
def mocks() -> Recorder:
    return fresh_mocks()


def plan_with(volumes: tuple[BucketPlan, ...], nodes: int = 2) -> PoolPlan:
    return replace(make_plan(nodes=nodes), buckets=volumes)


def _actions(doc: dict[str, Any]) -> set[str]:
    return {a for st in doc["Statement"] for a in st["Action"]}


def test_a_read_only_volume_grants_read_actions_on_its_prefix_only() -> None:
    doc = buckets.aws_policy(plan_with(RO))
    assert _actions(doc) == {"s3:ListBucket", "s3:GetBucketLocation", "s3:GetObject"}
    assert not _actions(doc) & WRITE
    resources = [r for st in doc["Statement"] for r in st["Resource"]]
    assert resources == ["arn:aws:s3:::datasets", "arn:aws:s3:::datasets/imagenet/v2/*"]
    listing = doc["Statement"][0]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["imagenet/v2", "imagenet/v2/*"]}}


def test_no_wildcard_action_or_resource_and_writes_only_where_asked() -> None:
    doc = buckets.aws_policy(plan_with(RW))
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        assert all("*" not in a for a in st["Action"]), st
        assert all(r != "*" and not r.startswith("arn:aws:s3:::*") for r in st["Resource"]), st
        writes = set(st["Action"]) & WRITE
        assert not writes or all(r.startswith("arn:aws:s3:::checkpoints") for r in st["Resource"]), st
    assert {"s3:PutObject", "s3:DeleteObject"} <= _actions(doc)


def test_two_volumes_on_one_prefix_merge_and_read_write_wins() -> None:
    plan = plan_with((BucketPlan("b1x", "p", True), BucketPlan("b1x", "p", False)))
    assert buckets.grants(plan) == [BucketPlan("b1x", "p", False)]


@pulumi.runtime.test
def test_aws_declares_a_role_its_policy_and_an_instance_profile_on_every_node(mocks: Recorder) -> Any:
    plan = plan_with(RW)
    declared = aws.program(plan)
    assert declared.access is not None

    def check(values: list[Any]) -> None:
        (role,) = mocks.of_type("aws:iam/role:Role")
        trust = json.loads(role.inputs["assumeRolePolicy"])
        assert trust["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                       "Action": "sts:AssumeRole"}]
        (policy,) = mocks.of_type("aws:iam/rolePolicy:RolePolicy")
        assert json.loads(policy.inputs["policy"]) == buckets.aws_policy(plan)
        (profile,) = mocks.of_type("aws:iam/instanceProfile:InstanceProfile")
        instances = mocks.of_type("aws:ec2/instance:Instance")
        assert len(instances) == 2
        assert {i.inputs["iamInstanceProfile"] for i in instances} == {profile.inputs["name"]}

    ids = [i.id for i in declared.instances.values()]
    return pulumi.Output.all(declared.access.profile.name, declared.access.policy.policy, *ids).apply(check)


@pulumi.runtime.test
def test_aws_without_bucket_volumes_declares_no_role(mocks: Recorder) -> Any:
    declared = aws.program(make_plan(nodes=1))
    assert declared.access is None

    def check(_: Any) -> None:
        assert not mocks.of_type("aws:iam/role:Role")
        assert all(not i.inputs.get("iamInstanceProfile") for i in mocks.of_type("aws:ec2/instance:Instance"))

    return pulumi.Output.all(*[i.id for i in declared.instances.values()]).apply(check)


@pulumi.runtime.test
def test_gcp_grants_each_nodes_account_a_bucket_level_role(mocks: Recorder) -> Any:
    plan = plan_with(RW, nodes=2)
    declared = gcp.program(plan)

    def check(values: list[str]) -> None:
        emails = values[: len(declared.accounts)]
        members = mocks.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
        assert len(members) == 4  # 2 nodes x 2 buckets
        for node, email in enumerate(emails):
            mine = {m.inputs["bucket"]: m for m in members if m.inputs["member"] == f"serviceAccount:{email}"}
            assert set(mine) == {"datasets", "checkpoints"}, node
            assert mine["datasets"].inputs["role"] == "roles/storage.objectViewer"  # read-only
            assert mine["checkpoints"].inputs["role"] == "roles/storage.objectUser"
            cond = mine["datasets"].inputs["condition"]
            assert 'startsWith("projects/_/buckets/datasets/objects/imagenet/v2/")' in cond["expression"]
            assert "condition" not in mine["checkpoints"].inputs  # the whole bucket
        assert not mocks.of_type("gcp:projects/iAMMember:IAMMember")  # nothing project-wide

    granted = [g.id for gs in declared.grants.values() for g in gs]
    return pulumi.Output.all(*[a.email for a in declared.accounts.values()], *granted).apply(check)


def test_preview_lists_the_grants_and_their_permissions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    spec = sky.Spec(provider=sky.AWS(), nodes=2, volumes=[
        sky.Volume("datasets", "/data", prefix="imagenet"), sky.Volume("ckpt-bucket", "/ckpt", read_only=False)])
    out = spec.provider.preview(spec)
    rows = {r["type"]: r for r in out["resources"]}
    policy = rows["aws:iam/rolePolicy:RolePolicy"]["detail"]
    assert "s3:GetObject on arn:aws:s3:::datasets/imagenet/*" in policy
    assert "(prefixes imagenet, imagenet/*)" in policy
    assert "s3:PutObject" in policy.split("ckpt-bucket/*")[0].rsplit(";", 1)[-1]
    assert "aws:iam/instanceProfile:InstanceProfile" in rows and "aws:iam/role:Role" in rows

    gspec = sky.Spec(provider=sky.GCP(project="p"), nodes=1, volumes=[sky.Volume("datasets", "/data")])
    gout = gspec.provider.preview(gspec)
    (member,) = [r for r in gout["resources"] if r["type"] == "gcp:storage/bucketIAMMember:BucketIAMMember"]
    assert member["detail"] == "roles/storage.objectViewer on bucket datasets only"
