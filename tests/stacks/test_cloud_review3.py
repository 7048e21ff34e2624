"""The third desk review of the cloud stack programs -- the TPU VM self-delete grant
(item 2), GCP's default firewall rules (item 3), service-account eventual consistency (item 5), SDK
floors (item 6) and reclaim detection (item 7). Under Pulumi's mocks (assertions run by
``@pulumi.runtime.test``) and the fake automation-API workspace."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_gcp")

from stackfakes import CLIENT, fresh_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.stacks import gcp, gcp_tpu  # noqa: E402

TPU = {"project": "proj", "accelerator_type": "v5litepod-4", "tpu": {"runtime_version": "v2-alpha-tpuv5-lite"}}


def _declare(program: Any, plan: Any) -> Any:
    mocks = fresh_mocks()

    @pulumi.runtime.test
    def go() -> Any:
        program(plan)

    go()
    return mocks


def _tpu_plan(**kw: Any) -> Any:
    return make_plan(instance_type="tpu-v5litepod-4", region="us-central1", zone="us-central1-a",
                     settings=TPU, **kw)


def _gcp_plan(**kw: Any) -> Any:
    return make_plan(instance_type="n2-standard-4", region="us-central1", zone="us-central1-a",
                     settings={"project": "proj"}, **kw)


# -- item 2: a TPU VM's self-delete grant is what Cloud TPU can honour -------------------------------
def test_the_tpu_self_delete_grant_carries_no_condition_cloud_tpu_cannot_evaluate() -> None:
    # Cloud TPU is not among the services whose requests carry resource attributes for IAM
    # Conditions: a condition on resource.name either refuses the delete or never narrows it.
    mocks = _declare(gcp_tpu.program, _tpu_plan(nodes=2))
    members = mocks.of_type("gcp:projects/iAMMember:IAMMember")
    assert len(members) == 2
    for m in members:
        assert not m.inputs.get("condition"), m.inputs
    (role,) = mocks.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert role.inputs["permissions"] == ["tpu.nodes.delete"]
    assert "every TPU node of the project" in role.inputs["description"]


def test_the_preview_says_the_tpu_grant_reaches_every_tpu_node_of_the_project() -> None:
    gcp_ = sky.GCP(project="proj", detect_address=False, allow_ssh_from=[CLIENT])
    rows = {r["name"]: r["detail"] for r in gcp_.preview(sky.Spec(provider=gcp_, accelerator="v5e:8"))["resources"]}
    assert "every TPU node of the project" in rows["node-0-self-delete"]


# -- item 3: the default network's own rules do not reach a pool's nodes -----------------------------
@pytest.mark.parametrize("program,plan", [(gcp.program, _gcp_plan), (gcp_tpu.program, _tpu_plan)],
                         ids=["instances", "tpu"])
def test_a_deny_all_on_the_pools_tag_sits_between_its_allows_and_the_defaults(program: Any, plan: Any) -> None:
    mocks = _declare(program, replace(plan(), ssh_cidrs=(CLIENT, "2001:db8::/64")))
    rules = {r.name: r.inputs for r in mocks.of_type("gcp:compute/firewall:Firewall")}
    allows = [r for r in rules.values() if r.get("allows")]
    denies = [r for r in rules.values() if r.get("denies")]
    tag = allows[0]["targetTags"][0]
    # default-allow-ssh (tcp:22 from 0.0.0.0/0) and default-allow-internal (10.128.0.0/9) are at 65534.
    assert sorted(r["sourceRanges"][0] for r in denies) == ["0.0.0.0/0", "::/0"]
    for deny in denies:
        assert deny["denies"] == [{"protocol": "all"}] and deny["targetTags"] == [tag]
        assert deny["direction"] == "INGRESS"
        assert max(a["priority"] for a in allows) < deny["priority"] < 65534


def test_the_preview_shows_the_deny_rules() -> None:
    gcp_ = sky.GCP(project="proj", detect_address=False, allow_ssh_from=[CLIENT])
    rows = {r["name"]: r["detail"] for r in gcp_.preview(sky.Spec(provider=gcp_, accelerator="L4"))["resources"]}
    assert rows["deny-all"].startswith("ingress: deny all from 0.0.0.0/0 to tag sky-"), rows["deny-all"]
    assert rows["deny-all-v6"].startswith("ingress: deny all from ::/0 to tag sky-"), rows["deny-all-v6"]
    assert "(priority 65000)" in rows["deny-all"] and "(priority 1000)" in rows["ssh"]


# -- item 5: service accounts are eventually consistent --------------------------------------------
@pytest.mark.parametrize("program,plan", [(gcp.program, _gcp_plan), (gcp_tpu.program, _tpu_plan)],
                         ids=["instances", "tpu"])
def test_an_account_created_before_a_failed_update_is_adopted_not_refused(program: Any, plan: Any) -> None:
    # terraform-provider-google #18087: the retry after a create whose answer was lost hits
    # "already exists"; the provider's answer is create_ignore_already_exists (magic-modules #10813).
    mocks = _declare(program, plan(nodes=2))
    accounts = mocks.of_type("gcp:serviceaccount/account:Account")
    assert len(accounts) == 2 and all(a.inputs.get("createIgnoreAlreadyExists") is True for a in accounts)


@pytest.mark.parametrize("stderr", [
    # the grant before the new account is visible (the case handled before)
    "Error 400: Service account sky-783090604b-0@proj.iam.gserviceaccount.com does not exist., badRequest",
    # the provider's read right after create (terraform-provider-google #15042)
    'Error reading Service Account "projects/proj/serviceAccounts/sky-783090604b-0@proj.iam.gserviceaccount.com": '
    "googleapi: Error 404: Not found; Gaia id not found for email sky-783090604b-0@proj.iam.gserviceaccount.com",
    "Error reading Service Account \"projects/-/serviceAccounts/x\": googleapi: Error 403: Permission "
    "'iam.serviceAccounts.get' denied on resource (or it may not exist).",
    # a retried create of an account that was made (#18087)
    "Error creating service account: googleapi: Error 409: Service account sky-783090604b-0 already exists "
    "within project projects/proj., alreadyExists",
])
def test_each_known_service_account_race_is_retried(stderr: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackfakes import FakeWorkspace, command_error, isolated_home

    from skyward.stacks import cloudpool, keys

    isolated_home(tmp_path, monkeypatch)
    monkeypatch.setattr(cloudpool, "_IAM_RETRY_SECONDS", (0.0, 0.0, 0.0))
    ws = FakeWorkspace(fail={"update": [command_error(f"error: 1 error occurred:\n  * {stderr}")]})
    plan = make_plan(nodes=0, zone="us-central1-a", region="us-central1")
    key_path, _ = keys.client_key(plan.stack)
    pool = cloudpool.CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                               fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws)
    assert len(pool.start(1)) == 1
    assert [k for k, _ in ws.calls].count("update") == 2


# -- item 7: a stopped or preempted GCP instance or TPU VM is seen as reclaimed ----------------------
@pytest.mark.parametrize("outputs,says", [
    ({"currentStatus": "TERMINATED"}, "terminated"),  # gcp.compute.Instance (a stopped spot VM)
    ({"currentStatus": "STOPPED"}, "stopped"),
    ({"state": "PREEMPTED"}, "preempted"),  # gcp.tpu.V2Vm: stays PREEMPTED until deleted
    ({"state": "TERMINATED"}, "terminated"),
    ({"instanceState": "stopped"}, "stopped"),  # aws.ec2.Instance, as before
])
def test_a_spot_node_the_cloud_stopped_is_reported_as_reclaimed(
    outputs: dict[str, str], says: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stackfakes import FakeWorkspace, isolated_home

    from skyward.stacks import cloudpool, keys

    isolated_home(tmp_path, monkeypatch)
    ws = FakeWorkspace()
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    pool = cloudpool.CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=True,
                               fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws)
    pool.start(2)
    ws.states[pool.plan.stack]["resources"] = [
        {"urn": "urn:pulumi:s::skyward::gcp:compute/instance:Instance::node-0", "outputs": {"currentStatus": "RUNNING"}},
        {"urn": "urn:pulumi:s::skyward::gcp:tpu/v2Vm:V2Vm::node-1", "outputs": outputs},
    ]
    _, reclaimed = pool.replace(1)
    assert reclaimed and says in reclaimed, reclaimed


def test_a_running_node_is_not_reclaimed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackfakes import FakeWorkspace, isolated_home

    from skyward.stacks import cloudpool, keys

    isolated_home(tmp_path, monkeypatch)
    ws = FakeWorkspace()
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    pool = cloudpool.CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=True,
                               fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws)
    pool.start(1)
    ws.states[pool.plan.stack]["resources"] = [
        {"urn": "urn:pulumi:s::skyward::gcp:tpu/v2Vm:V2Vm::node-0", "outputs": {"state": "READY"}}]
    _, reclaimed = pool.replace(0)
    assert reclaimed is None
