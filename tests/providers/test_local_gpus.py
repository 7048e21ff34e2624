"""Local pools on a machine with GPUs: each node gets GPUs of its own.

No GPU is needed: a fake ``nvidia-smi`` on PATH describes a 4-GPU machine. The tests that need a
real one carry the ``gpu`` marker and skip where there is none."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.providers import local_gpus
from tests.helpers import without_fork_server

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
UUIDS = [f"GPU-{i}a5e7c1d-0000-4000-8000-00000000000{i}" for i in range(4)]


@pytest.fixture(autouse=True)
def no_gpu_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the plugins and Local set in a process stays in its test (set, then deleted: so that
    monkeypatch restores them, whoever sets them later)."""
    for name in ("CUDA_VISIBLE_DEVICES", "SKYWARD_GPUS", "SKYWARD_GPU_SHARE", "SKYWARD_NODE_GPUS",
                 "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.fixture
def four_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake nvidia-smi first on PATH: 4 A100s; ``--query-gpu`` answers for every GPU, GPU i
    at 10*(i+1) % and 30+i degrees, with its index and UUID when the query asks; each call is
    logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "nvidia-smi.log"
    listing = "".join(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {u})\\n" for i, u in enumerate(UUIDS))
    rows = "".join(f'echo "{10 * (i + 1)}, {1024 * (i + 1)}, 81920, {30 + i}${{extra:+, {i}, {u}}}"\n'
                   for i, u in enumerate(UUIDS))
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {log}\n'
        f"if [ \"$1\" = \"-L\" ]; then printf '{listing}'; exit 0; fi\n"
        'extra=""\n'
        'case "$1" in *,index,uuid) extra=1 ;; esac\n'
        f"{rows}"
    )
    script.chmod(0o755)
    # (no daemon for the mps plugin's bootstrap to start on a machine without drivers)
    (bin_dir / "nvidia-cuda-mps-control").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


@sky.function
def gpus_here() -> dict[str, Any]:
    info = sky.instance_info()
    acc = info.accelerator
    return {
        "node": info.node,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "metrics_ids": os.environ.get("SKYWARD_GPUS"),
        "share": os.environ.get("SKYWARD_GPU_SHARE"),
        "mps": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "type": acc.type if acc else None,
        "count": acc.count if acc else None,
        "devices": list(acc.devices) if acc else None,
        "agent": os.getppid(),
    }


def visible(pool: sky.Pool) -> list[list[str]]:
    return [r["visible"].split(",") for r in gpus_here() @ pool]


def local(nodes: int, accelerator: Any = "A100", **kwargs: Any) -> sky.Compute:
    return sky.Compute(provider=sky.Local(), nodes=nodes, accelerator=accelerator, options=QUIET, **kwargs)


def flat(lists: list[list[str]]) -> list[str]:
    return [item for items in lists for item in items]


def test_each_node_gets_its_own_gpu(four_gpus: Path) -> None:
    with local(4) as pool:
        results = gpus_here() @ pool
    assert sorted(r["visible"] for r in results) == UUIDS  # one each, never the same one
    for r in results:
        assert r["metrics_ids"] == r["visible"]
        assert (r["type"], r["count"], r["share"]) == ("A100", 1, None)
        assert r["devices"] == [r["visible"]]  # instance_info().accelerator: the node's own


def test_two_gpus_each_and_free_again_when_the_pool_closes(four_gpus: Path) -> None:
    with local(2, "A100:2") as pool:
        first, second = visible(pool)
    assert len(first) == len(second) == 2
    assert sorted(first + second) == UUIDS
    assert local_gpus.in_use() == []
    with local(4) as pool:
        assert sorted(flat(visible(pool))) == UUIDS


def test_more_gpus_than_the_machine_has_fails_before_any_node_starts(four_gpus: Path) -> None:
    with pytest.raises(sky.NoOfferError) as caught, local(5):
        pass
    message = str(caught.value)
    assert "5 Local node(s) of 1 GPU each need 5 GPU(s) and this machine has 4" in message
    assert "fewer nodes (at most 4)" in message and "count=0.5" in message and "provider" in message
    assert local_gpus.in_use() == []
    with pytest.raises(sky.NoOfferError, match=r"need 6 GPU"), local(3, "A100:2"):
        pass


def test_a_fraction_shares_one_gpu_and_the_mps_plugin_sizes_each_share(four_gpus: Path) -> None:
    half = sky.accelerators.A100(count=0.5)
    with local(2, half) as pool:
        a, b = gpus_here() @ pool
    assert a["visible"] == b["visible"] and a["visible"] in UUIDS  # two halves of one GPU
    assert a["share"] == b["share"] == "0.5" and a["count"] == 0.5 and a["devices"] == [a["visible"]]
    with local(2, half, plugins=[sky.plugins.mps()]) as pool:
        assert [r["mps"] for r in gpus_here() @ pool] == ["50", "50"]
    with local(8, half) as pool:
        assert sorted(set(flat(visible(pool)))) == UUIDS  # two per GPU
    with pytest.raises(sky.NoOfferError, match=r"9 Local node.* need 5 GPU.*has 4"), local(9, half):
        pass


def test_the_client_cuda_visible_devices_limits_what_is_handed_out(
        four_gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"1,{UUIDS[3][:12]}")  # an index and a UUID prefix
    with local(2) as pool:
        assert sorted(flat(visible(pool))) == [UUIDS[1], UUIDS[3]]
    limited = r"has 2 that Local may hand out \(this process's CUDA_VISIBLE_DEVICES="
    with pytest.raises(sky.NoOfferError, match=limited), local(3):
        pass


def test_two_pools_at_once_never_hand_out_the_same_gpu(four_gpus: Path, tmp_path: Path) -> None:
    # The other pool runs in a process of its own: the claims are the machine's, not a process's.
    program = tmp_path / "other.py"
    program.write_text(textwrap.dedent("""\
        import os, sys
        import skyward as sky

        @sky.function
        def mine():
            return os.environ["CUDA_VISIBLE_DEVICES"]

        with sky.Compute(provider=sky.Local(), nodes=2, accelerator="A100",
                         options=sky.Options(console=False)) as pool:
            print(",".join(mine() @ pool), flush=True)
            sys.stdin.readline()
        """))
    other = subprocess.Popen([sys.executable, str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ))
    try:
        assert other.stdout is not None
        theirs = other.stdout.readline().strip().split(",")
        assert len(theirs) == 2 and set(theirs) <= set(UUIDS)
        with local(2) as pool:
            ours = flat(visible(pool))
            assert sorted(theirs + ours) == UUIDS
            taken = r"has 4 GPU\(s\) Local may hand out and 4 of them are held, 4 by other running pools \(pool"
            with pytest.raises(sky.ProviderError, match=taken), local(1):
                pass
    finally:
        assert other.stdin is not None
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(60) == 0
    assert local_gpus.in_use() == []


def test_a_crashed_holder_frees_its_gpus(four_gpus: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claims = local_gpus.GpuClaims("crashed-pool", 1)
        taken = claims.take([0, 1, 2, 3])
        for node in taken:
            claims.bind(node, holder.pid)
        assert len(local_gpus.in_use()) == 4
        with pytest.raises(sky.ProviderError, match=r"4 by other running pools \(pool crashed-pool \(pid"):
            local_gpus.GpuClaims("next-pool", 1).take([0])
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert local_gpus.in_use() == []  # no clean-up ran: its claims are stale
        assert set(local_gpus.GpuClaims("next-pool", 1).take([0, 1, 2, 3])) == {0, 1, 2, 3}
    finally:
        holder.kill()
        holder.wait()
        local_gpus.GpuClaims("next-pool", 1).free()


def test_a_replaced_node_gets_the_free_gpu(four_gpus: Path) -> None:
    with local(4) as pool:
        before = gpus_here() @ pool
        lost = before[1]
        os.kill(lost["agent"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the lost node was not replaced"
            try:
                after = gpus_here() @ pool
            except sky.SkywardError:
                after = []
            if len(after) == 4 and after[1]["agent"] != lost["agent"]:
                break
            time.sleep(0.2)
        assert after[1]["visible"] == lost["visible"]  # the only free one: the lost node's
        assert sorted(r["visible"] for r in after) == UUIDS
        claims = local_gpus.in_use()
        assert sorted(c["gpu"] for c in claims) == UUIDS
        assert {c["pid"] for c in claims} == {r["agent"] for r in after}  # each held by its agent


def test_elastic_growth_takes_free_gpus_and_shrinking_frees_them(four_gpus: Path) -> None:
    with local(2) as pool:
        pool.resize(4)
        assert sorted(flat(visible(pool))) == UUIDS
        with pytest.raises(sky.ProviderError, match=r"4 of them are held, 4 by this pool's own nodes\."):
            pool.resize(5)
        pool.resize(1)
        assert len(local_gpus.in_use()) == 1


def test_node_gpu_metrics_query_only_its_own_gpus(four_gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.bootstrap import metrics

    exe = shutil.which("nvidia-smi")
    assert exe is not None
    assert [g[0] for g in metrics._query_gpus(exe)] == [10, 20, 30, 40]  # no Local node: every GPU
    monkeypatch.setenv("SKYWARD_GPUS", f"{UUIDS[1]},{UUIDS[3]}")
    assert [g[0] for g in metrics._query_gpus(exe)] == [20, 40]
    monkeypatch.setenv("SKYWARD_GPUS", "2")  # (by index where nvidia-smi gives no UUID)
    assert [g[0] for g in metrics._query_gpus(exe)] == [30]


def test_cpu_pools_leave_the_gpus_alone(four_gpus: Path) -> None:
    with sky.Compute(provider=sky.Local(), nodes=2, options=QUIET) as pool:
        assert [r["visible"] for r in gpus_here() @ pool] == [None, None]
    assert local_gpus.in_use() == []


def test_usable_gpus_reads_cuda_visible_devices_as_cuda_does(four_gpus: Path) -> None:
    def names(value: str) -> list[str]:
        return [g.visible for g in local_gpus.usable_gpus({"CUDA_VISIBLE_DEVICES": value})]

    assert [g.visible for g in local_gpus.usable_gpus({})] == UUIDS
    assert names("2,0") == [UUIDS[2], UUIDS[0]]
    assert names("0,7,1") == [UUIDS[0]]  # an entry that names nothing ends the list
    assert names("") == names("-1") == []
    assert names("MIG-abc") == ["MIG-abc"]


def test_plugins_bind_each_worker_process_to_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.plugins.frameworks import _worker_device, bind_worker_gpus
    from skyward.runtime.info import InstanceInfo

    def info(worker: int, workers: int) -> InstanceInfo:
        return InstanceInfo(node=0, worker=worker, total_nodes=1, workers_per_node=workers, head_addr="127.0.0.1",
                            head_port=1, job_id="j", peers=[], network={"interface": "lo"})

    for worker, expected in [(0, ("a", "b")), (1, ("c", "d"))]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "a,b,c,d")
        monkeypatch.delenv("SKYWARD_NODE_GPUS", raising=False)
        assert bind_worker_gpus(info(worker, 2)) == expected
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(expected)
        assert _worker_device(info(worker, 2), 2) == 0
        assert bind_worker_gpus(info(worker, 2)) == expected  # again: the same
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "a")
    monkeypatch.delenv("SKYWARD_NODE_GPUS", raising=False)
    assert bind_worker_gpus(info(1, 1)) == ("a",)  # one worker per node: all of the node's
    assert _worker_device(info(0, 1), 1) == 0


def _cuda_gpus(at_least: int) -> None:
    torch = pytest.importorskip("torch")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < at_least:
        pytest.skip(f"needs a machine with {at_least} or more CUDA GPUs (torch sees {have})")


@sky.function
def all_reduce() -> tuple[str, float, str]:
    import torch
    import torch.distributed as dist

    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return uuid, float(t.item()), dist.get_backend()


@pytest.mark.gpu
def test_torch_ranks_on_local_nodes_use_their_own_gpus() -> None:
    _cuda_gpus(2)
    # (Local does not match the model name: any accelerator name stands for the machine's GPUs)
    with local(2, plugins=[sky.plugins.torch()]) as pool:
        results = all_reduce() @ pool
    assert [r[1:] for r in results] == [(2.0, "nccl"), (2.0, "nccl")]
    assert results[0][0] != results[1][0]


@pytest.mark.gpu
def test_torch_ranks_sharing_one_gpu_on_purpose_all_reduce_over_gloo() -> None:
    _cuda_gpus(1)
    with local(2, sky.accelerators.A100(count=0.5), plugins=[sky.plugins.torch()]) as pool:
        results = all_reduce() @ pool
    assert [r[1:] for r in results] == [(2.0, "gloo"), (2.0, "gloo")]
    assert results[0][0] == results[1][0]


@pytest.mark.gpu
def test_more_nodes_than_real_gpus_is_refused() -> None:
    _cuda_gpus(1)
    have = len(local_gpus.usable_gpus())
    with pytest.raises(sky.NoOfferError, match=rf"need {have + 1} GPU\(s\) and this machine has {have}"), \
            local(have + 1):
        pass

def test_a_named_pool_keeps_its_gpus_while_no_client_is_attached(four_gpus: Path) -> None:
    def skyward(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "skyward", *args], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ))

    up = skyward("up", "gpus", "--provider", "local", "--nodes", "2", "--accelerator", "A100", "--ttl", "120")
    assert up.returncode == 0, up.stderr
    try:
        held = local_gpus.in_use()  # by its agents: `skyward up` has exited
        assert len(held) == 2 and os.getpid() not in {c["pid"] for c in held}
        with pytest.raises(sky.ProviderError, match=r"2 by other running pools"), local(3):
            pass
        with sky.Compute(name="gpus", options=QUIET) as pool:
            assert sorted(flat(visible(pool))) == sorted(c["gpu"] for c in held)
            pool.resize(3)  # a resize of the attached pool takes a free GPU
            assert len(set(flat(visible(pool)))) == 3
        assert len(local_gpus.in_use()) == 3  # detached: its nodes keep theirs
    finally:
        down = skyward("down", "gpus")
    assert down.returncode == 0, down.stderr
    assert local_gpus.in_use() == []


def test_torch_ranks_that_share_a_gpu_use_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.plugins.frameworks import _gpu_shared
    from skyward.runtime.info import InstanceInfo

    def info(workers: int) -> InstanceInfo:
        return InstanceInfo(node=0, total_nodes=2, workers_per_node=workers, head_addr="127.0.0.1",
                            head_port=1, job_id="j", peers=[], network={"interface": "lo"})

    monkeypatch.setenv("SKYWARD_NODE_GPUS", "a")
    monkeypatch.delenv("SKYWARD_GPU_SHARE", raising=False)
    assert not _gpu_shared(info(1), ("a",))
    assert _gpu_shared(info(2), ("a",))  # two worker processes on the node's one GPU
    monkeypatch.setenv("SKYWARD_GPU_SHARE", "0.5")  # a Local node with count=0.5
    assert _gpu_shared(info(1), ("a",))


def test_jax_processes_sharing_a_gpu_take_their_share_of_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.plugins.frameworks import _jax_memory_share
    from skyward.runtime.info import InstanceInfo

    def info(workers: int) -> InstanceInfo:
        return InstanceInfo(node=0, total_nodes=2, workers_per_node=workers, head_addr="127.0.0.1",
                            head_port=1, job_id="j", peers=[], network={"interface": "lo"})

    for share, node, workers, expected in [(None, "a", 1, None), ("0.5", "a", 1, "0.375"),
                                           (None, "a,b", 4, "0.375"), ("0.25", "a", 1, "0.188")]:
        monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
        if share is None:
            monkeypatch.delenv("SKYWARD_GPU_SHARE", raising=False)
        else:
            monkeypatch.setenv("SKYWARD_GPU_SHARE", share)
        monkeypatch.setenv("SKYWARD_NODE_GPUS", node)
        _jax_memory_share(info(workers))
        assert os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") == expected
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # the user's own stays
    _jax_memory_share(info(1))
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"


def test_nodes_started_without_the_fork_server_get_their_gpus_too(
        four_gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_fork_server(monkeypatch)  # each agent its own interpreter
    with local(2) as pool:
        assert len(set(flat(visible(pool)))) == 2


def test_each_node_reports_metrics_of_its_own_gpu(four_gpus: Path) -> None:
    image = sky.Image(metrics=[sky.metrics.GPU(interval=0.2), sky.metrics.GPUTemp(interval=0.2)])
    with local(2, image=image) as pool:
        mine = {r["node"]: UUIDS.index(r["visible"]) for r in gpus_here() @ pool}
        seen: dict[tuple[int, str], float] = {}
        for event in pool.events():
            if isinstance(event, sky.Metric) and event.name in ("gpu", "gpu_temp"):
                seen[(event.node, event.name)] = event.value
            if len(seen) == 4:
                break
    for node, gpu in mine.items():  # the fake GPU i runs at 10*(i+1) % and 30+i degrees (a new
        # pool's nodes are numbered as their ranks)
        assert seen[(node, "gpu")] == 10 * (gpu + 1) and seen[(node, "gpu_temp")] == 30 + gpu


def test_the_torch_plugin_gives_each_worker_process_its_half_of_the_node_gpus(four_gpus: Path) -> None:
    pytest.importorskip("torch")

    def worker_gpus(_: int) -> tuple[int, str]:
        time.sleep(0.05)
        return sky.instance_info().worker, os.environ["CUDA_VISIBLE_DEVICES"]

    worker = sky.Worker(concurrency=2, executor="process")
    with local(1, "A100:2", worker=worker, plugins=[sky.plugins.torch()]) as pool:
        node = (gpus_here() >> pool)["metrics_ids"].split(",")  # (SKYWARD_GPUS: the node's, not narrowed)
        seen = dict(pool.map(worker_gpus, range(16), chunksize=1))
    assert len(node) == 2
    assert seen == {0: node[0], 1: node[1]}  # (the CPU torch here picks gloo: no CUDA)


def test_groups_of_one_pool_get_gpus_of_their_own(four_gpus: Path) -> None:
    groups = {"prep": sky.Spec(nodes=2), "train": sky.Spec(nodes=1, accelerator="A100:2"),
              "eval": sky.Spec(nodes=2, accelerator="A100")}
    with sky.Compute(groups=groups, options=QUIET) as pool:
        got = {name: [r["visible"] for r in gpus_here() @ pool[name]] for name in groups}
    assert got["prep"] == [None, None]  # a CPU group leaves the GPUs alone
    (train,) = got["train"]
    handed = [*train.split(","), *got["eval"]]
    assert sorted(handed) == UUIDS  # two for the train node, one each for the eval nodes, none twice
    assert local_gpus.in_use() == []
