"""sky.Slurm's rules without a cluster: login forms, sbatch flags, time limits, the GPU
request, the batch script, and how squeue/sinfo lines are read."""

from __future__ import annotations

import pytest

import skyward as sky
from skyward.providers import slurm_queue as q


def test_login_forms_and_bad_settings() -> None:
    assert sky.Slurm("me@login:2222").target().port == 2222
    assert sky.Slurm("login", user="me").target().user == "me"
    for bad in ({"login": ""}, {"login": "a b"}, {"login": "h", "partition": "gpu; rm -rf /"},
                {"login": "h", "options": "--exclusive"}, {"login": "h", "options": ["exclusive"]},
                {"login": "h", "options": ["--nodes=4"]}, {"login": "h", "time": "soon"},
                {"login": "h", "pending_timeout": 0}, {"login": "h", "port": 70000}):
        with pytest.raises(sky.ConfigError):
            sky.Slurm(**bad)  # type: ignore[arg-type]


def test_flags_of_a_pool() -> None:
    p = sky.Slurm("h", partition="gpu", account="lab", qos="high", time=5400, constraint="a100",
                  options=["--exclusive", "--mem=64G"])
    spec = sky.Spec(provider=p, accelerator="A100:4", nodes=2, vcpus=16)
    assert p.flags(spec) == ("--partition=gpu", "--account=lab", "--qos=high", "--constraint=a100",
                             "--time=1:30:00", "--gpus-per-node=a100:4", "--cpus-per-task=16",
                             "--exclusive", "--mem=64G")
    assert q.gpu_flag(spec, "nvidia_a100") == "--gpus-per-node=nvidia_a100:4"
    assert q.gpu_flag(spec, "") == "--gpus-per-node=4"
    assert sky.Slurm("h", max_duration=60).flags(sky.Spec(provider=sky.Slurm("h"))) == ("--time=0:01:00",)
    assert q.check_time("1-12:00:00", "t") == "1-12:00:00"


def test_the_batch_script_runs_one_task_per_node_that_survives_the_others() -> None:
    text = q.JobRequest("skyward-x", 3, 5, "/h/.skyward/slurm/x", ("--partition=gpu",)).script("/h/node.sh")
    assert "#SBATCH --nodes=3" in text and "#SBATCH --partition=gpu" in text and "#SBATCH --no-kill" in text
    assert text.rstrip().endswith("--kill-on-bad-exit=0 --no-kill bash /h/node.sh 5")


def test_queue_and_partition_lines() -> None:
    (state,) = q.parse_squeue("12|PENDING|Resources|\n").values()
    assert (state.job, state.state, state.reason, state.ended) == ("12", "PENDING", "Resources", False)
    assert q.parse_squeue("12|NODE_FAIL|None|n1\n")["12"].ended
    assert q.never_reason("PartitionConfig") and q.never_reason("QOSMaxNodePerJobLimit")
    assert q.never_reason("Priority") is None and q.never_reason("Resources") is None
    assert q.parse_gres("gpu:a100:4(S:0-1),gpu:2") == [("a100", 4), ("gpu", 2)]
    assert q.parse_gres("(null)") == []
    parts = q.parse_sinfo("cpu*|n1|64|256000|(null)|idle|1-00:00:00|up\n"
                          "gpu|g1|32|512000|gpu:a100:4|mix|2-00:00:00|up\n"
                          "gpu|g2|32|512000|gpu:a100:4|idle|2-00:00:00|up\n")
    assert [(p.name, p.default, p.nodes, p.idle) for p in parts] == [("cpu", True, 1, 1), ("gpu", False, 2, 1)]
    spec = sky.Spec(provider=sky.Slurm("h"), accelerator="A100:4")
    assert [p.name for p in q.fitting(parts, spec)] == ["gpu"]
    assert q.fitting(parts, sky.Spec(provider=sky.Slurm("h"), accelerator="A100:8")) == []
    assert q.never_runs("sbatch: error: Batch job submission failed: Invalid partition name specified") \
        == "Batch job submission failed: Invalid partition name specified"


def test_accounting_from_sacct_lines() -> None:
    out = ("41|CANCELLED by 1001|3600|28800|billing=8,cpu=8,gres/gpu=4,mem=64G,node=2|2|gpu-[1-2]|"
           "2026-11-26T10:00:00|2026-11-26T11:00:00\n"
           "42|COMPLETED|90|90|billing=1,cpu=1,node=1|1|cpu-7|2026-11-26T10:00:00|2026-11-26T10:01:30\n")
    jobs = q.parse_sacct(out)
    assert jobs["41"] == {"state": "CANCELLED by 1001", "elapsed_seconds": 3600, "cpus": 8, "gpus": 4,
                          "cpu_hours": 8.0, "gpu_hours": 4.0, "nodes": 2, "nodelist": "gpu-[1-2]",
                          "start": "2026-11-26T10:00:00", "end": "2026-11-26T11:00:00"}
    assert jobs["42"]["cpu_hours"] == 0.025 and jobs["42"]["gpu_hours"] == 0.0
    assert q.parse_sacct("Slurm accounting storage is disabled\n") == {}


def test_accounting_from_scontrol_when_sacct_has_none() -> None:
    line = ("JobId=7 JobName=skyward-x UserId=u(1001) JobState=CANCELLED Reason=None RunTime=01:02:03 "
            "TimeLimit=00:15:00 StartTime=2026-11-26T10:00:00 EndTime=2026-11-26T11:02:03 NodeList=n-[1-3] "
            "NumNodes=3 NumCPUs=6 NumTasks=3 TRES=cpu=6,node=3,billing=6,gres/gpu:a100=3 Command=(null)\n")
    job = q.parse_scontrol_job(line)
    assert job is not None
    assert job == {"state": "CANCELLED", "elapsed_seconds": 3723, "cpus": 6, "gpus": 3,
                   "cpu_hours": round(6 * 3723 / 3600, 4), "gpu_hours": round(3 * 3723 / 3600, 4), "nodes": 3,
                   "nodelist": "n-[1-3]", "start": "2026-11-26T10:00:00", "end": "2026-11-26T11:02:03"}
    assert q.parse_scontrol_job("slurm_load_jobs error: Invalid job id specified\n") is None
    assert q.duration("2-01:00:00") == 176400 and q.duration("05:07") == 307


def test_what_apt_installed_on_the_nodes_goes_into_the_pools_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm node's bootstrap says which apt versions it installed: they go into the pool's
    lock (the record's lock["apt"]), as on SSH and Container nodes, along with its phases' events."""
    from skyward.providers.slurm import SlurmCluster, _Node

    provider = sky.Slurm("login.example")
    cluster = SlurmCluster(sky.Spec(provider=provider, image=sky.Image(apt=["openssh-server"])), "aptlock", provider)
    cluster.package_lock = {"packages": [], "apt": {}}
    looks = [
        "42|RUNNING|None|n1\n@@squeue 0\n"
        "@@@log 0\n@@skyward phase apt started\n@@skyward apt openssh-server 1:9.2p1-2\n"
        "@@skyward apt openssh-server 0.1\n@@skyward phase apt done\n"
        '@@@hello 0 {"ip": "10.0.0.5", "hostname": "n1", "agent": {"direct": 4000, "pid": 7}}\n@@@sig 1/1\n'
    ]
    monkeypatch.setattr(cluster, "_run", lambda *a, **k: (0, looks[0]))
    phases: list[tuple[int, str, str]] = []
    monkeypatch.setattr(cluster, "_phase", lambda node, phase, status, seconds=None: phases.append((node, phase, status)))
    cluster._nodes[0] = _Node(0, "42")
    (endpoint,) = cluster._wait("42", [0])
    assert (endpoint.index, endpoint.private_ip, endpoint.hostname) == (0, "10.0.0.5", "n1")
    assert cluster.package_lock["apt"] == {"openssh-server": "1:9.2p1-2"}  # the first version reported
    assert phases == [(0, "apt", "started"), (0, "apt", "done")]
