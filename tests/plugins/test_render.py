"""GPU and launcher plugins, checked on what they render (no GPU here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import skyward as sky
from skyward.plugins import LaunchCommand, LaunchContext
from skyward.plugins.compose import prepare


class FakeCluster:
    def __init__(self, spec: sky.Spec) -> None:
        self.spec = spec


def render(*plugins, **spec_kwargs):
    spec = sky.Spec(plugins=list(plugins), **spec_kwargs)
    return prepare(spec, FakeCluster(spec))  # type: ignore[arg-type]


def test_transforms_and_ops_compose_in_plugin_order() -> None:
    image, ops = render(sky.plugins.mps(active_thread_percentage=50), sky.plugins.huggingface(token="hf_secret123"))
    assert image.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert image.env["HF_TOKEN"] == "hf_secret123"
    assert ops[0].startswith("mkdir -p") and "nvidia-cuda-mps-control -d" in ops[1]
    assert "huggingface_hub.login" in ops[2] and "hf_secret123" not in "".join(ops)
    assert {"transformers", "datasets", "tokenizers", "huggingface_hub"} <= set(image.pip)
    from skyward.observe import secrets

    assert "hf_secret123" not in secrets.redact("token hf_secret123")


def test_torch_picks_the_wheel_index_by_accelerator() -> None:
    cpu, _ = render(sky.plugins.torch(version="2.4.1", vision=True))
    assert cpu.pip == ("torch==2.4.1", "torchvision")
    assert cpu.pip_indexes[0].url.endswith("/whl/cpu")
    assert cpu.pip_indexes[0].packages == ("torch", "torchvision")
    gpu_spec = sky.Spec(plugins=[sky.plugins.torch(cuda="cu121")], provider=sky.Local(), accelerator=None)
    object.__setattr__(gpu_spec, "accelerator", sky.accelerators.A100())
    gpu, _ = prepare(gpu_spec, FakeCluster(gpu_spec))  # type: ignore[arg-type]
    assert gpu.pip_indexes[0].url == "https://download.pytorch.org/whl/cu121"


def test_cuml_mig_keras_jax() -> None:
    image, _ = render(sky.plugins.cuml())
    assert image.pip == ("cuml-cu12",) and image.pip_indexes[0].url == "https://pypi.nvidia.com"
    image, ops = render(sky.plugins.mig("3g.40gb"))
    assert image.env["SKYWARD_MIG_INSTANCES"] == "2"
    assert ops[-1] == "sudo nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C"
    with pytest.raises(sky.ConfigError, match="MIG profile"):
        sky.plugins.mig("big")
    image, _ = render(sky.plugins.jax(), sky.plugins.keras(backend="jax"))
    assert image.env["KERAS_BACKEND"] == "jax" and image.pip == ("jax", "keras")
    with pytest.raises(sky.ConfigError, match="backend"):
        sky.plugins.keras(backend="mxnet")
    with pytest.raises(sky.ConfigError, match="1-100"):
        sky.plugins.mps(active_thread_percentage=0)


def test_accelerate_launch_command() -> None:
    plugin = sky.plugins.accelerate({"num_processes": 8, "mixed_precision": "bf16",
                                     "fsdp": {"sharding_strategy": "FULL_SHARD"}})
    ctx = LaunchContext(node_id=1, num_nodes=4, head_addr="10.0.0.1", casty_port=29500,
                        private_ip="10.0.0.2", python_bin="/venv/bin/python", venv_dir="/venv",
                        concurrency=1, executor="thread")
    cmd = plugin.launcher(LaunchCommand(entrypoint="/venv/bin/python -m skyward.bootstrap.worker"), ctx)
    assert cmd.render() == (
        "/venv/bin/python -m accelerate.commands.launch --num_machines 4 --machine_rank 1 "
        "--main_process_ip 10.0.0.1 --main_process_port 29500 --num_processes 8 --use_fsdp "
        "--mixed_precision bf16 --fsdp_sharding_strategy FULL_SHARD -m skyward.bootstrap.worker"
    )
    with pytest.raises(sky.ConfigError, match="unknown key"):
        sky.plugins.accelerate({"num_proc": 2})  # type: ignore[typeddict-unknown-key]


def test_import_skyward_and_plugins_stays_light() -> None:
    code = ("import sys, skyward as sky; sky.plugins.torch(); sky.plugins.sklearn(); sky.plugins.jax(); "
            "print([m for m in ('torch', 'jax', 'sklearn', 'joblib', 'keras') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_huggingface_takes_the_reference_parameters_too() -> None:
    # The reference's huggingface(*, models, token): models are downloaded at bootstrap.
    image, ops = render(sky.plugins.huggingface(models=["gpt2", "org/model-1.5"], token="hf_abc987"))
    assert image.env["HF_TOKEN"] == "hf_abc987" and "huggingface_hub" in image.pip
    assert "huggingface_hub.login" in ops[0]
    assert "snapshot_download" in ops[1] and ops[1].endswith(" gpt2 org/model-1.5")
    assert "hf_abc987" not in "".join(ops)
    # Ours still works as before: a token positionally, no models, no download op.
    _, ops = render(sky.plugins.huggingface("hf_abc987"))
    assert len(ops) == 1 and "snapshot_download" not in ops[0]


def test_huggingface_download_op_runs_and_passes_ids_as_arguments(tmp_path) -> None:
    # Run the rendered op with a stand-in huggingface_hub that records what it was asked for.
    fake = tmp_path / "huggingface_hub.py"
    fake.write_text("import sys\nasked = []\ndef snapshot_download(r):\n    print('GOT', r)\n")
    _, ops = render(sky.plugins.huggingface(models=["a/b", "c"], token=None))
    op = ops[-1].replace("python -c", f"{sys.executable} -c", 1)
    out = subprocess.run(["bash", "-c", op], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["GOT a/b", "GOT c"]


@pytest.mark.parametrize("models", ["gpt2", ["bad id; rm -rf /"], [3]])
def test_huggingface_refuses_models_that_are_not_repo_ids(models: object) -> None:
    with pytest.raises(sky.ConfigError, match="models"):
        sky.plugins.huggingface(models=models)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("accelerator", "package"),
    [(sky.accelerators.TPUv5e_4(), "jax[tpu]"), (sky.accelerators.L4(), "jax[cuda12]"),
     (sky.accelerators.MI300X(), "jax"), (None, "jax")],
)
def test_jax_installs_the_build_for_the_pools_accelerator(accelerator, package: str) -> None:
    spec = sky.Spec(plugins=[sky.plugins.jax()])
    object.__setattr__(spec, "accelerator", accelerator)  # Local refuses accelerators it lacks
    image, _ = prepare(spec, FakeCluster(spec))  # type: ignore[arg-type]
    assert image.pip == (package,)
