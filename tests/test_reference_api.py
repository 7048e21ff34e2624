"""The reference API's remaining names and details, on a real 2-node Local pool where they run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path

import pytest

import skyward as sky
from skyward.core.membership import NodeSnapshot, PoolSnapshot
from skyward.observe import console as console_mod


@sky.function
def info_two_ways() -> tuple[int, int, bool]:
    a = sky.InstanceInfo.current()
    return a.node, sky.instance_info().node, a == sky.instance_info()


@sky.function
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@sky.function
def double(x: int) -> int:
    return 2 * x


# --- errors ----------------------------------------------------------------------------------


def test_no_offers_error_is_the_same_class_under_both_names() -> None:
    assert sky.NoOffersError is sky.NoOfferError
    assert issubclass(sky.NoOfferError, sky.ProvisioningError)
    assert issubclass(sky.BootstrapError, sky.ProvisioningError)
    assert issubclass(sky.ProvisioningError, sky.ProviderError)
    assert issubclass(sky.ProvisioningError, sky.SkywardError)
    with pytest.raises(sky.NoOffersError):
        raise sky.NoOfferError("x")


@pytest.mark.parametrize(
    ("accelerator", "provider", "says"),
    [
        ("RTX_4090", sky.AWS(), "RTX 4090 is rented by GPU marketplaces"),
        ("GTX_1080_Ti", sky.GCP(), "not by AWS or GCP"),
        ("MI300X", sky.AWS(), "Azure"),
    ],
)
def test_no_offer_names_who_rents_the_accelerator(accelerator: str, provider: object, says: str) -> None:
    acc = getattr(sky.accelerators, accelerator)()
    spec = sky.Spec(provider=provider, accelerator=acc)
    with pytest.raises(sky.NoOffersError) as info:
        provider.offer(spec)  # type: ignore[attr-defined]
    assert says in str(info.value) and "sky.SSH" in str(info.value)


def test_no_offer_points_at_the_other_cloud_when_it_rents_it() -> None:
    # T4G (Graviton g5g) is an AWS-only card.
    with pytest.raises(sky.NoOfferError, match=r"T4G is rented by AWS, not by GCP: use provider=sky\.AWS\(\)"):
        sky.GCP().offer(sky.Spec(provider=sky.GCP(), accelerator=sky.accelerators.T4G()))


@pytest.mark.parametrize(("accelerator", "says"), [("Trainium3", "rented by AWS (Trn3"), ("GB200", "AWS (P6e-GB200")])
def test_no_offer_of_a_cloud_chip_the_catalogue_lacks_does_not_say_no_cloud_rents_it(accelerator: str,
                                                                                      says: str) -> None:
    acc = getattr(sky.accelerators, accelerator)()
    with pytest.raises(sky.NoOffersError) as info:
        sky.AWS().offer(sky.Spec(provider=sky.AWS(), accelerator=acc))
    message = str(info.value)
    assert says in message and "does not list yet" in message, message
    assert "not by AWS or GCP" not in message and "AWS only" not in message, message


def test_compute_with_an_accelerator_no_provider_rents_fails_before_provisioning() -> None:
    with pytest.raises(sky.NoOfferError, match="RTX 4090 is rented by"):
        sky.Compute(provider=sky.AWS(), accelerator=sky.accelerators.RTX_4090()).open()


# --- type aliases ----------------------------------------------------------------------------


def test_type_aliases_are_exported_and_used() -> None:
    assert typing.get_args(sky.AllocationStrategy) == ("spot-if-available", "spot", "on-demand", "cheapest")
    assert typing.get_args(sky.SelectionStrategy) == ("cheapest", "first")
    assert typing.get_args(sky.WorkerExecutor) == ("auto", "thread", "process")
    assert sky.PoolSpec is sky.Spec
    assert sky.InstanceType is sky.Offer
    assert set(typing.get_args(sky.NodeSpec)) == {int, tuple[int, int], sky.Nodes}
    assert set(sky.SpecKwargs.__annotations__) == {f.name for f in sky.Spec.__dataclass_fields__.values()}
    hints = typing.get_type_hints(sky.Spec, localns={"Accelerator": sky.accelerators.Accelerator})
    assert hints["allocation"] == sky.AllocationStrategy
    assert isinstance(sky.offers("T4")[0], sky.InstanceType)


# --- sky.App ---------------------------------------------------------------------------------


def test_app_is_the_console_for_every_pool_inside_it(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.App(console="log") as app:
        assert app.is_active
        with sky.Compute(nodes=1, options=sky.Options(console="log")) as a:
            assert a._console.mode == "silent"  # the pool opened no console of its own
            assert double(2) >> a == 4
        pool_id = a.id
    assert not app.is_active
    err = capsys.readouterr().err
    # One line per event, from the App's view: the pool it came from is in it.
    assert f"pool {pool_id}: ready" in err and f"pool {pool_id}: destroyed" in err
    assert err.count(f"pool {pool_id}: ready") == 1


def test_app_refuses_a_bad_console_and_a_second_entry() -> None:
    with pytest.raises(sky.ConfigError, match="console"):
        sky.App(console="fancy")  # type: ignore[arg-type]
    app = sky.App(console=False)
    with app, pytest.raises(sky.ConfigError, match="already entered"):
        app.__enter__()


def test_pools_outside_an_app_keep_their_own_console() -> None:
    from skyward.observe import app

    assert app.current() is None
    with sky.App(console=False):
        assert app.current() is not None
    assert app.current() is None


# --- the pool's state ------------------------------------------------------------------------


def test_snapshot_concurrency_and_is_active() -> None:
    options = sky.Options(console=False, worker=sky.Worker(concurrency=2))
    with sky.Compute(nodes=2, options=options) as pool:
        assert pool.is_active
        assert pool.concurrency == 4
        idle = pool.snapshot()
        assert isinstance(idle, PoolSnapshot) and idle.active and idle.pool == pool.id
        assert [n.rank for n in idle.nodes] == [0, 1]
        assert all(isinstance(n, NodeSnapshot) for n in idle.nodes)
        assert all(n.state == "ready" and n.slots == 2 and n.running == 0 for n in idle.nodes)
        assert all(n.host and n.private_ip for n in idle.nodes)
        assert idle.concurrency == 4 and idle.running == 0

        # Five sleeping tasks on four slots: four run, one waits on its node.
        futures = [nap(1.5) > pool for _ in range(5)]
        deadline = time.monotonic() + 10
        busy = pool.snapshot()
        while busy.running + busy.queued < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
            busy = pool.snapshot()
        assert busy.running == 4 and busy.queued == 1
        assert sorted(n.running for n in busy.nodes) == [2, 2]
        assert [f.result() for f in futures] == [1.5] * 5
    assert not pool.is_active
    assert not pool.snapshot().active


def test_session_is_active_until_closed() -> None:
    session = sky.Session(options=sky.Options(console=False))
    assert session.is_active
    session.close()
    assert not session.is_active
    with pytest.raises(sky.PoolClosedError, match="session is closed"):
        session.compute(nodes=1)


def test_session_takes_the_session_wide_options_as_keywords_like_the_reference(
        capfd: pytest.CaptureFixture[str]) -> None:
    # `sky.Session(console=False)` as written for the reference project.
    with sky.Session(console=False, logging=False, shutdown_timeout=30) as session:
        pool = session.compute(nodes=1)
        assert double(4) >> pool == 8
        assert (pool.options.console, pool.options.logging, pool.options.shutdown_timeout) == (False, False, 30)
        # A pool's own options= wins: the session's keywords do not apply to that pool.
        own = session.compute(nodes=1, options=sky.Options(console="silent", shutdown_timeout=10))
        assert (own.options.console, own.options.logging, own.options.shutdown_timeout) == ("silent", True, 10)
    err = capfd.readouterr().err
    assert pool.id not in err and "requesting" not in err, err  # the console was off
    # The keywords apply over a session's options= too, field by field.
    base = sky.Options(selection="first", console="log")
    assert sky.Session(options=base, console=False).options == sky.Options(selection="first", console=False)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"console": "loud"}, r"sky\.Session\(console='loud'\) is not valid: use 'rich', 'minimal', 'log', 'silent'"),
        ({"logging": "debug"}, r"sky\.Session\(logging='debug'\) is not valid: use True .* sky\.LogConfig"),
        ({"shutdown_timeout": -1}, r"sky\.Session\(shutdown_timeout=-1\) is not valid: .*positive number of seconds"),
    ],
)
def test_session_refuses_a_bad_option_as_options_does(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(sky.ConfigError, match=says):
        sky.Session(**kwargs)  # type: ignore[arg-type]
    name, value = next(iter(kwargs.items()))
    with pytest.raises(sky.ConfigError, match=rf"Options\({name}={value!r}\) is not valid"):
        sky.Options(**kwargs)  # type: ignore[arg-type]


# --- functions and groups --------------------------------------------------------------------


def test_instance_info_current_is_instance_info(pool: sky.Pool) -> None:
    assert sorted(info_two_ways() @ pool) == [(0, 0, True), (1, 1, True)]


def test_instance_info_current_outside_a_task_says_so() -> None:
    with pytest.raises(sky.NoActivePoolError):
        sky.InstanceInfo.current()


def test_group_with_timeout_applies_to_each_function(pool: sky.Pool) -> None:
    group = nap(0.01) & nap(2)
    timed = group.with_timeout(0.5)
    assert [p.timeout for p in timed.items] == [0.5, 0.5]
    assert [p.timeout for p in group.items] == [None, None]  # the group itself is unchanged
    assert sky.gather(nap(0.01), stream=True).with_timeout(1).stream is True
    with pytest.raises(sky.TaskTimeoutError):
        timed >> pool
    with pytest.raises(sky.ConfigError):
        group.with_timeout(0)


def test_group_timeout_is_a_field_beside_with_timeout(pool: sky.Pool) -> None:
    group = nap(0.01) & nap(2)
    assert group.timeout is None
    timed = group.with_timeout(0.5)
    assert timed.timeout == 0.5 and group.timeout is None
    joined = timed & nap(0.01)  # a function joined later runs under the group's timeout too
    assert joined.timeout == 0.5 and [p.timeout for p in joined.items] == [0.5, 0.5, 0.5]
    assert (nap(0.01) & timed).timeout == 0.5
    made = sky.PendingFunctionGroup((nap(0.01), nap(2)), timeout=0.5)  # as a field, it is in force
    assert [p.timeout for p in made.items] == [0.5, 0.5]
    with pytest.raises(sky.TaskTimeoutError):
        made >> pool
    with pytest.raises(sky.ConfigError, match="timeout=-1"):
        sky.PendingFunctionGroup((nap(0.01),), timeout=-1)


# --- small defects ---------------------------------------------------------------------------


def test_map_over_a_single_value_names_the_argument(pool: sky.Pool) -> None:
    with pytest.raises(sky.DispatchError) as info:
        pool.map(double, 5)  # type: ignore[call-overload]
    message = str(info.value)
    assert "pool.map(double, 5)" in message and "items must be an iterable" in message
    assert "not an int" in message
    assert "double(5) >> pool" in message
    assert isinstance(info.value, TypeError)  # code catching the old TypeError still works


@pytest.mark.parametrize(
    ("per_second", "shown"),
    [(1200.0, "1,200/s"), (12.4, "12/s"), (2.5, "2.5/s"), (0.5, "2.0 s each"), (0.01, "1.7 min each"),
     (0.0001, "2.8 h each"), (0.0, "-")],
)
def test_console_rates_slow_batches_as_time_per_item(per_second: float, shown: str) -> None:
    assert console_mod.rate(per_second) == shown


def test_batch_line_of_a_slow_batch_is_not_zero_per_second() -> None:
    event = sky.BatchFinished(pool="p", batch=1, ok=True, done=4, total=4, seconds=8.0)
    line = console_mod.describe(event, "pool p", {1: "map slow"})
    assert line is not None and "(2.0 s each)" in line and "0/s" not in line


# --- static types of the operators -----------------------------------------------------------

TYPED = """
    from concurrent.futures import Future
    import skyward as sky

    @sky.function
    def f(x: int) -> str:
        return str(x)

    @sky.function(timeout=5)
    def g(x: int) -> float:
        return 1.0

    def use(pool: sky.Pool) -> None:
        reveal_type(f(1))
        reveal_type(f(1) >> pool)
        reveal_type(f(1) @ pool)
        reveal_type(f(1) > pool)
        reveal_type(g(1).with_timeout(3) >> sky)
        reveal_type(pool.map(f, [1, 2]))
        reveal_type(pool.map(len, ["a"]))
        reveal_type(pool.snapshot().nodes[0].running)
        f("not an int")
"""


def test_a_type_checker_sees_the_operators_result_types(tmp_path: Path) -> None:
    script = tmp_path / "typed.py"
    script.write_text(textwrap.dedent(TYPED))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-incremental",
         "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
    ).stdout
    revealed = [line.split("Revealed type is ", 1)[1].strip('"') for line in out.splitlines() if "Revealed type" in line]
    assert revealed == [
        "skyward.core.function.PendingFunction[str]",
        "str",
        "list[str]",
        "concurrent.futures._base.Future[str]",
        "float",
        "list[str]",
        "list[int]",
        "int",
    ], out
    # ... and a wrong argument is an error, with the function's own parameter type.
    assert 'Argument 1 to "__call__" of "RemoteFunction" has incompatible type "str"; expected "int"' in out, out


def test_app_leaves_no_subscription_behind() -> None:
    from skyward.observe import events

    before = len(events.bus._subs)
    with sky.App(console="log"):
        assert len(events.bus._subs) == before + 1
    assert len(events.bus._subs) == before
