"""The public surface: one sorted __all__, everything reachable, a light import."""

from __future__ import annotations

import json
import subprocess
import sys

import skyward as sky


def test_all_is_sorted_and_resolvable() -> None:
    assert sky.__all__ == sorted(sky.__all__)
    for name in sky.__all__:
        assert getattr(sky, name) is not None


def test_import_is_light() -> None:
    code = (
        "import sys, time, json; t = time.perf_counter(); import skyward; "
        "ms = (time.perf_counter() - t) * 1000; "
        "heavy = [m for m in ('pulumi', 'fabric', 'paramiko', 'torch', 'pydantic', 'numpy', 'rich') if m in sys.modules]; "
        "print(json.dumps({'ms': ms, 'heavy': heavy}))"
    )
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)]
    assert all(r["heavy"] == [] for r in runs), runs
    assert min(r["ms"] for r in runs) < 150, runs


def test_marking_a_function_loads_no_logging_or_futures() -> None:
    """A script marks its functions before it builds its pool, and the pool's fork server starts
    only then: @sky.function loads neither concurrent.futures nor logging (15 ms), which load
    with the pool, beside the server's start."""
    code = ("import sys, skyward as sky\n"
            "@sky.function\n"
            "def one() -> int:\n"
            "    return 1\n"
            "print(sorted(m for m in ('concurrent.futures', 'logging') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_accelerator_factories_are_public() -> None:
    assert sky.accelerators.A100().name == "A100"
    assert sky.accelerators.H100(count=8).count == 8


def test_cli_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "skyward", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and sky.__version__ in out.stdout


def test_the_reference_apis_last_names_are_public_and_load_lazily() -> None:
    code = (
        "import sys, json, skyward as sky; before = 'skyward.containers' in sys.modules; "
        "print(json.dumps([before, sky.containers.__name__, sky.DockerImage is sky.containers.DockerImage, "
        "sky.DEFAULT_IMAGE == sky.Image(), [issubclass(getattr(sky, n), sky.Event) for n in "
        "('InstanceRequested', 'ShutdownRequested', 'ShutdownCompleted')], sky.RunPod.kind, sky.VastAI.kind]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, "skyward.containers", True, True, [True, True, True], "runpod", "vastai"]
