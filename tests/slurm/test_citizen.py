"""sky.Slurm as a citizen of a shared cluster: what a real site does every day must not
destroy or resurrect a pool against its user's or the site's will.

* item 1: a failed ``squeue`` (the controller restarting, a timeout) is no answer, never "the job
  left the queue": `skyward ls` keeps a named pool whose squeue fails, and a pool whose job waits
  while squeue fails starts once it answers again;
* item 2: a dropped SSH session to the login node is connected again, and the pool's nodes are
  the same agents in the same job (nothing resubmitted);
* item 3: a job ended by ``scancel`` (the user or an admin) or by its time limit ends the pool with
  an error that says so, and nothing is resubmitted; a node lost by NODE_FAIL is replaced
  (tests/slurm/test_lifecycle.py);
* item 4: a pool's job is submitted --no-requeue: an admin's ``scontrol requeue`` is refused;
* item 5: a job waiting in the queue is looked at less and less often (squeue calls counted);
* item 6: the GPU request takes the site's spelling of its GRES type (sinfo's);
* item 7: a failed environment build on the login node fails a waiting pool at once, with its cause;
* item 9: short flags with their value (``-N2``) and flags the spec sets too are refused in options=.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli.conftest import CLI
from helpers import wait_for

import skyward as sky
from skyward.providers import slurm_queue as q

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


def live(site: Site) -> list[dict[str, str]]:
    return [j for j in site.cluster.jobs() if j["state"] in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING")]


class BrokenSqueue:
    """``squeue`` on the login node fails as it does while the controller restarts (its words, exit
    1): a script bound over it inside the login host's own mount namespace (nothing else sees it)
    fails while a flag file exists, and runs a copy of the real one otherwise (that namespace has
    no /proc, so the bind stays for the module's cluster)."""

    def __init__(self, site: Site) -> None:
        d = site.cluster.dir
        self.flag = d / "squeue-broken"
        self.count = d / "squeue-calls"  # one line per call on the login node
        fake, real = d / "squeue-fake", d / "squeue-real"
        if not fake.exists():
            shutil.copy2("/usr/bin/squeue", real)
            self.count.touch()
            self.count.chmod(0o666)
            fake.write_text(f"#!/bin/sh\necho >> {self.count}\n"
                            f"if [ -e {self.flag} ]; then echo 'slurm_load_jobs error: Unable to contact "
                            f"slurm controller (connect failure)' >&2; exit 1; fi\nexec {real} \"$@\"\n")
            fake.chmod(0o755)
            subprocess.run(["nsenter", "-t", str(site.login.pid), "-m", "--", "mount", "--bind", str(fake),
                            "/usr/bin/squeue"], check=True, capture_output=True, timeout=30)

    def calls(self) -> int:
        return len(self.count.read_text().splitlines())

    def __enter__(self) -> BrokenSqueue:
        self.flag.touch()
        return self

    def restore(self) -> None:
        self.flag.unlink(missing_ok=True)

    def __exit__(self, *exc: object) -> None:
        self.restore()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[CLI]:
    helper = CLI(tmp_path)
    yield helper
    helper("down", "--all", "--force")


# -- the words, alone ---------------------------------------------------------------------------------
def test_a_failed_squeue_is_no_answer_and_an_unknown_job_is_confirmed_before_it_is_gone() -> None:
    broken = q.parse_look("slurm_load_jobs error: Socket timed out on send/recv operation\n@@squeue 1\n")
    assert broken.states == {} and broken.error is not None and "Socket timed out" in broken.error
    assert q.parse_look("12|RUNNING|None|n1\n").error is not None  # no exit status: cut short
    assert q.parse_look("12|RUNNING|None|n1\n@@squeue 0\n").states["12"].state == "RUNNING"
    purged = q.parse_look("slurm_load_jobs error: Invalid job id specified\n@@squeue 1\n")
    assert purged.states == {} and purged.error is None  # the controller answered: it knows none
    out = ("@@job 12\nJobId=12 JobName=x JobState=CANCELLED Reason=None Restarts=0 NodeList=n1\n@@rc 0\n"
           "@@job 13\nslurm_load_jobs error: Invalid job id specified\n@@rc 1\n"
           "@@job 14\nslurm_load_jobs error: Unable to contact slurm controller (connect failure)\n@@rc 1\n"
           "@@sacct\n12|CANCELLED by 1000\n")
    states, unknown = q.parse_confirm(out, ["12", "13", "14"])
    assert states["12"].state == "CANCELLED" and "by 1000" in states["12"].reason
    assert states["13"].state == "GONE" and states["13"].ended
    assert list(unknown) == ["14"] and "Unable to contact" in unknown["14"]
    assert q.stops_the_pool(states["12"]) == "was cancelled by uid 1000"
    assert q.stops_the_pool(q.JobState("9", "TIMEOUT", "TimeLimit", "")) == "reached its time limit"
    for replaced in ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "RUNNING", "PENDING", "FAILED", "GONE"):
        assert q.stops_the_pool(q.JobState("9", replaced, "", "")) is None, replaced


# -- item 1: a failed squeue ------------------------------------------------------------------------
def test_ls_while_squeue_fails_keeps_a_named_pool_and_its_job(site: Site, cli: CLI) -> None:
    login = f"{site.login.user}@{site.login.address}"
    cli.toml(f'[pools.flaky]\nprovider = "slurm"\nnodes = 1\nttl = 600\n\n'
             f'[pools.flaky.slurm]\nlogin = "{login}"\nkey = "{site.hosts.client_key}"\n'
             f'known_hosts = "{site.known_hosts}"\n')
    assert cli("up", "flaky", timeout=180).code == 0
    (job,) = cli.record("flaky")["cluster"]["jobs"]
    with BrokenSqueue(site):
        ls = cli("ls", "--json", timeout=120)
        assert ls.code == 0, ls
        (row,) = ls.json()
        assert not row.get("removed") and row["state"] != "expired", row
        assert {j["id"]: j["state"] for j in site.cluster.jobs()}.get(job) == "RUNNING"
        status = cli("status", "flaky", timeout=120)
        assert {j["id"]: j["state"] for j in site.cluster.jobs()}.get(job) == "RUNNING", status
    (row,) = cli("ls", "--json").json()  # squeue answers again: the pool is as it was
    assert row["state"] == "running" and row["nodes_down"] == [], row
    assert cli("down", "flaky", timeout=120).code == 0
    wait_for(lambda: not [j for j in live(site) if j["id"] == job], 30, "for the job to end")
    site.cluster.wait_idle()


@sky.function
def job_id() -> str:
    import os

    return os.environ.get("SLURM_JOB_ID", "")


@sky.function
def job_id_later(seconds: float) -> str:
    time.sleep(seconds)
    return job_id()


def test_a_pool_whose_squeue_fails_while_its_job_starts_waits_for_an_answer(site: Site) -> None:
    with BrokenSqueue(site) as broken:
        threading.Timer(4.0, broken.restore).start()
        with sky.Compute(provider=site.provider(), nodes=1, options=QUIET) as pool:
            (job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
            assert (job_id() >> pool) == job
    wait_for(lambda: not live(site), 30, "for the pool's job to end")
    site.cluster.wait_idle()


# -- item 3: scancel and the time limit are not undone -------------------------------------------------
def losses(events: list[sky.Event]) -> list[str]:
    from skyward.observe import events as ev

    ev.bus.flush()
    return [e.reason for e in list(events) if isinstance(e, sky.InstanceLost)]


def test_a_scancelled_job_ends_the_pool_with_its_reason_and_is_not_resubmitted(site: Site) -> None:
    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    with sky.Compute(provider=site.provider(), nodes=2, options=QUIET) as pool:
        (job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
        assert (job_id() >> pool) == job
        running = job_id_later(30) > pool
        time.sleep(0.5)  # it runs when the job is cancelled
        site.cluster.run(["scancel", job])  # an admin (or the user, from another shell)
        started = time.monotonic()
        # scancel stops the task's worker process with its agent: the task still ends with the
        # job's reason, not as a worker that crashed on a node that "keeps serving".
        with pytest.raises(Exception, match=f"Slurm job {job} was cancelled"):
            running.result(timeout=60)
        with pytest.raises(Exception, match=f"Slurm job {job} was cancelled"):
            while time.monotonic() - started < 60:
                job_id() >> pool
                time.sleep(0.5)
        time.sleep(3)  # nothing came back meanwhile, nor after
        assert not live(site), site.cluster.jobs()
    unsubscribe()
    site.cluster.wait_idle()
    # Each lost node's event says what Slurm did, not only what the connection saw (item 8).
    lost = losses(seen)
    assert lost and all(f"Slurm job {job} was cancelled" in r for r in lost), lost


def test_a_job_past_its_time_limit_ends_the_pool_and_is_not_resubmitted(site: Site) -> None:
    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    with sky.Compute(provider=site.provider(time=60), nodes=1, options=QUIET) as pool:
        (job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
        assert (job_id() >> pool) == job
        with pytest.raises(Exception, match=f"Slurm job {job} reached its time limit"):
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                job_id() >> pool
                time.sleep(1.0)
        time.sleep(3)
        assert not live(site), site.cluster.jobs()
    unsubscribe()
    site.cluster.wait_idle()
    lost = losses(seen)
    assert lost and all(f"Slurm job {job} reached its time limit (TIMEOUT)" in r for r in lost), lost


# -- item 2: a dropped SSH session to the login node --------------------------------------------------
@sky.function
def agent_of() -> tuple[str, str, int]:
    import os
    import socket

    return os.environ.get("SLURM_JOB_ID", ""), socket.gethostname(), os.getppid()


def drop_login_sessions(site: Site) -> int:
    """Kill every SSH session the login node's sshd serves now (every process under its listener,
    found before any is killed: a session's privilege-separated child holds the socket too, and
    would be reparented to the listener mid-walk): the pool's connection drops as on an sshd
    restart or a network blip; the listener stays."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    under: set[int] = set()
    grew = True
    while grew:
        found = {pid for pid, ppid in parents.items() if (ppid == site.login.pid or ppid in under)}
        grew = bool(found - under)
        under |= found
    for pid in under:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(under)


def test_a_dropped_login_session_reconnects_to_the_same_agents(site: Site) -> None:
    replaced: list[sky.Event] = []
    with sky.Compute(provider=site.provider(), nodes=2, options=QUIET) as pool:
        pool.subscribe(lambda e: replaced.append(e) if isinstance(e, sky.InstanceReplaced) else None)
        (job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
        before = agent_of() @ pool
        assert {b[0] for b in before} == {job}
        assert drop_login_sessions(site) >= 1
        wait_for(lambda: len(replaced) >= 2 and pool.current_nodes() == 2, 120, "for the pool to reconnect")
        after = agent_of() @ pool
        assert sorted(after) == sorted(before)  # the same job, hosts and agents: nothing resubmitted
        assert [j["id"] for j in live(site)] == [job]
    wait_for(lambda: not live(site), 30, "for the pool's job to end")
    site.cluster.wait_idle()


# -- item 4: a requeue ----------------------------------------------------------------------------------
def test_a_pools_job_is_never_requeued(site: Site) -> None:
    with sky.Compute(provider=site.provider(), nodes=1, options=QUIET) as pool:
        (job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
        refused = site.cluster.run(["scontrol", "requeue", job], check=False)
        assert refused.returncode != 0 and "disabled" in refused.stderr, refused
        assert (job_id() >> pool) == job  # the same job, untouched
        shown = site.cluster.run(["scontrol", "show", "job", "-o", job]).stdout
        assert "Requeue=0" in shown and "Restarts=0" in shown, shown
    wait_for(lambda: not live(site), 30, "for the pool's job to end")
    site.cluster.wait_idle()


# -- item 5: polling the queue ------------------------------------------------------------------------
def test_a_waiting_job_is_looked_at_less_and_less_often(site: Site) -> None:
    squeue = BrokenSqueue(site)  # (not broken: only counting the login node's squeue calls)
    blocker = site.cluster.run(["sbatch", "--parsable", "--exclusive", f"-N{len(site.compute)}", "--chdir=/",
                                "-o", "/dev/null", "--job-name=someone-else", "--wrap", "sleep 300"]).stdout.strip()
    try:
        wait_for(lambda: {j["id"]: j["state"] for j in site.cluster.jobs()}.get(blocker) == "RUNNING", 30)
        before = squeue.calls()
        started = time.monotonic()
        with pytest.raises(sky.ProviderError, match="pending_timeout"), \
                sky.Compute(provider=site.provider(pending_timeout=25), nodes=1, options=QUIET):
            pass
        took = time.monotonic() - started
        calls = squeue.calls() - before
        # 0.25 s apart for 2 s, then 1, 2 and 5 s apart: about 19 looks in 25 s (100 at 0.25 s).
        assert calls <= 24 and 25 <= took < 40, (calls, took)
    finally:
        site.cluster.run(["scancel", blocker], check=False)
    wait_for(lambda: not live(site), 30, "for the jobs to end")
    site.cluster.wait_idle()


def test_the_shared_look_asks_once_for_callers_at_once_and_again_when_too_old() -> None:
    from skyward.providers.slurm_shared import SharedQueue

    calls: list[str] = []

    def run(command: str) -> tuple[int, str]:
        calls.append(command)
        time.sleep(0.3)  # every other caller arrives while this one asks
        return 0, "7|PENDING|Priority|\n8|RUNNING|None|n1\n@@squeue 0\n"

    shared = SharedQueue()
    seen: list[Any] = []
    threads = [threading.Thread(target=lambda: seen.append(shared.look(run, max_age=5.0))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and "squeue" in calls[0] and "-u" in calls[0], calls
    assert all(look.states["7"].state == "PENDING" and look.states["8"].nodelist == "n1" for look in seen)
    shared.look(run, max_age=0.0)  # a caller that needs a newer answer than the last one asks again
    assert len(calls) == 2

    def broken(command: str) -> tuple[int, str]:
        raise OSError("connection reset")

    failed = SharedQueue().look(broken, max_age=5.0)
    assert failed.error is not None and "connection reset" in failed.error  # no answer: never "gone"


def test_pools_of_one_process_waiting_together_share_their_looks_at_the_queue(site: Site) -> None:
    squeue = BrokenSqueue(site)  # (not broken: only counting the login node's squeue calls)
    blocker = site.cluster.run(["sbatch", "--parsable", "--exclusive", f"-N{len(site.compute)}", "--chdir=/",
                                "-o", "/dev/null", "--job-name=someone-else", "--wrap", "sleep 300"]).stdout.strip()
    errors: list[BaseException] = []

    def wait_in_the_queue() -> None:
        try:
            with sky.Compute(provider=site.provider(pending_timeout=12), nodes=1, options=QUIET):
                pass
        except BaseException as exc:
            errors.append(exc)

    try:
        wait_for(lambda: {j["id"]: j["state"] for j in site.cluster.jobs()}.get(blocker) == "RUNNING", 30)
        before = squeue.calls()
        pools = [threading.Thread(target=wait_in_the_queue) for _ in range(3)]
        for t in pools:
            t.start()
        for t in pools:
            t.join(120)
        calls = squeue.calls() - before
        assert len(errors) == 3 and all("pending_timeout" in str(e) for e in errors), errors
        # One pool alone looks about 15 times in 12 s (0.25 s apart for 2 s, then 1 and 2 s apart);
        # three looking on their own would be about 45.
        assert calls <= 24, calls
    finally:
        site.cluster.run(["scancel", blocker], check=False)
    wait_for(lambda: not live(site), 30, "for the jobs to end")
    site.cluster.wait_idle()


# -- item 7: a failed environment build on the login node ----------------------------------------------
def test_a_failed_build_on_the_login_node_fails_the_waiting_pool_at_once_with_its_cause(site: Site) -> None:
    blocker = site.cluster.run(["sbatch", "--parsable", "--exclusive", f"-N{len(site.compute)}", "--chdir=/",
                                "-o", "/dev/null", "--job-name=someone-else", "--wrap", "sleep 300"]).stdout.strip()
    try:
        started = time.monotonic()
        # The hosts have no internet: no Python 3.13 (nor any package index) on the login node.
        image = sky.Image(python="3.13")
        with pytest.raises(sky.ProviderError) as info, \
                sky.Compute(provider=site.provider(pending_timeout=90, install="index"), nodes=1, image=image,
                            options=QUIET):
            pass
        took = time.monotonic() - started
        message = str(info.value)
        assert "login node failed" in message and "was cancelled" in message, message
        assert took < 60, (took, message)
    finally:
        site.cluster.run(["scancel", blocker], check=False)
    wait_for(lambda: not live(site), 30, "for the jobs to end")
    site.cluster.wait_idle()


# -- item 9: flags in options= --------------------------------------------------------------------------
def test_short_flags_with_their_value_and_flags_the_spec_sets_are_refused_in_options() -> None:
    for flag in ("-N2", "-t1", "-pgpu", "-n4"):
        with pytest.raises(sky.ConfigError, match="sets"):
            q.check_options([flag])
    assert q.check_options(["--mem=64G", "-c4", "--exclusive"]) == ("--mem=64G", "-c4", "--exclusive")
    provider = sky.Slurm("me@login", options=["--mem=64G", "-c4"])
    assert provider.check(sky.Spec(provider=provider)) is None  # the flags alone are the user's
    why = provider.check(sky.Spec(provider=provider, vcpus=8))
    assert why is not None and "-c4" in why and "vcpus=" in why, why
    gres = sky.Slurm("me@login", options=["--gres=gpu:2"])
    assert "accelerator=" in (gres.check(sky.Spec(provider=gres, accelerator="A100:2")) or "")


# -- item 6: GPU types as the site spells them -----------------------------------------------------------
def test_the_gpu_request_takes_the_sites_spelling_of_its_gres_type() -> None:
    spec = sky.Spec(provider=sky.Slurm("h"), accelerator="A100:4")
    assert q.gpu_flag(spec, None, ["A100", "v100"]) == "--gpus-per-node=A100:4"
    assert q.gpu_flag(spec, None, ["a100"]) == "--gpus-per-node=a100:4"
    assert q.gpu_flag(spec, None, []) == "--gpus-per-node=a100:4"  # sinfo unknown: lowercased
    assert q.gpu_flag(spec, "nvidia_a100", ["A100"]) == "--gpus-per-node=nvidia_a100:4"  # gres= wins
    assert sky.Slurm("h").flags(spec, ["A100"]) == ("--gpus-per-node=A100:4",)
    parts = q.parse_sinfo("gpu*|n1|64|512000|gpu:A100:4(S:0-1)|idle|1-00:00:00|up\n")
    assert q.fitting(parts, spec) and parts[0].gpus == (("A100", 4),)
