"""The DDP, FSDP and DTensor examples: they compile, their TPUTorchJobs are valid, and everything
outside the training function runs for real with Ray's classes (no torch needed, none imported).
The training functions themselves run in test_training.py."""

from __future__ import annotations

import importlib.util
import py_compile
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.util.tpu import get_tpu_num_slices_for_workers

from tputorch import render, train
from tputorch.api import spec

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "ddp": (ROOT / "examples/ddp/train_ddp.py", ROOT / "examples/ddp/tputorchjob.yaml"),
    "fsdp": (ROOT / "examples/fsdp/train_fsdp.py", ROOT / "examples/fsdp/tputorchjob.yaml"),
    "dtensor": (ROOT / "examples/dtensor/train_dtensor.py", ROOT / "examples/dtensor/tputorchjob.yaml"),
}


def load(name: str):
    script = EXAMPLES[name][0]
    module_spec = importlib.util.spec_from_file_location(f"example_{name}", script)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def head_env(job) -> dict[str, str]:
    container = render.rayjob(job)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.fixture(params=sorted(EXAMPLES))
def example(request):
    torch_loaded = "torch" in sys.modules
    module = load(request.param)
    job = spec.parse(yaml.safe_load(EXAMPLES[request.param][1].read_text()))
    yield request.param, module, job
    assert ("torch" in sys.modules) == torch_loaded, "the example imported torch outside its training function"


def entrypoint_args(job) -> list[str]:
    argv = shlex.split(job.entrypoint)
    assert argv[0] == "python"
    return argv


def test_scripts_compile(tmp_path):
    for name, (script, _) in EXAMPLES.items():
        py_compile.compile(str(script), cfile=str(tmp_path / f"{name}.pyc"), doraise=True)


def test_yaml_is_a_valid_tputorchjob_running_its_script(example):
    name, _, job = example
    manifest = yaml.safe_load(EXAMPLES[name][1].read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("tputorch.io/v1alpha1", "TPUTorchJob")
    argv = entrypoint_args(job)
    assert (ROOT / argv[1]) == EXAMPLES[name][0]  # entrypoint paths are relative to the repo root
    assert "ray-torch-tpu:2.60.0" in job.image


def test_entrypoint_arguments_parse(example):
    _, module, job = example
    args = module.parse_args(entrypoint_args(job)[2:])
    assert args.storage_path.startswith("gs://")
    config = module.train_loop_config(args)
    assert config["epochs"] == args.epochs and "storage_path" not in config


def test_storage_path_is_required(example, monkeypatch, capsys):
    _, module, _ = example
    monkeypatch.delenv("STORAGE_PATH", raising=False)
    monkeypatch.delenv("TPUTORCH_STORAGE_PATH", raising=False)
    with pytest.raises(SystemExit):
        module.parse_args([])
    assert "--storage-path" in capsys.readouterr().err
    monkeypatch.setenv("STORAGE_PATH", "/mnt/shared/ckpt")
    assert module.parse_args([]).storage_path == "/mnt/shared/ckpt"


def test_scaling_config_from_the_rendered_job(example):
    _, module, job = example
    args = module.parse_args(entrypoint_args(job)[2:])
    assert not args.cpu  # the TPUTorchJobs run on the slice's TPUs
    assert (module.device_type(args.cpu), module.backend(args.cpu)) == ("tpu", None)  # None: tpu_dist
    assert module.train_loop_config(args)["device"] == "tpu"
    scaling = module.build_scaling_config(args.cpu, head_env(job))
    assert isinstance(scaling, ScalingConfig)
    assert scaling.use_tpu and not scaling.use_gpu
    assert (scaling.num_workers, scaling.topology, scaling.accelerator_type) == (16, "4x4", "TPU-V6E")
    assert scaling.resources_per_worker == {"TPU": 1}  # one chip per process, as tpu_dist wants
    assert get_tpu_num_slices_for_workers("4x4", "TPU-V6E", 16, {"TPU": 1}) == 1


def test_cpu_switch_replaces_device_backend_and_scaling_config(example):
    _, module, job = example
    args = module.parse_args(entrypoint_args(job)[2:] + ["--cpu"])
    assert (module.device_type(args.cpu), module.backend(args.cpu)) == ("cpu", "gloo")
    assert module.train_loop_config(args)["device"] == "cpu"
    scaling = module.build_scaling_config(args.cpu, head_env(job))
    assert isinstance(scaling, ScalingConfig)
    assert not scaling.use_tpu and not scaling.use_gpu
    assert scaling.num_workers == 16  # the slice's worker count
    assert scaling.topology is None and scaling.accelerator_type is None
    assert "TPU" not in scaling._resources_per_worker_not_none


@pytest.mark.parametrize("cpu", [False, True])
def test_scaling_config_outside_a_tputorchjob_says_why(example, cpu):
    _, module, _ = example
    with pytest.raises(train.MissingSliceEnvironment, match="TPUTORCH_NUM_WORKERS"):
        module.build_scaling_config(cpu, {})


def test_run_config(example, tmp_path):
    name, module, job = example
    args = module.parse_args(entrypoint_args(job)[2:] + ["--storage-path", str(tmp_path), "--name", f"{name}-run"])
    run = module.build_run_config(args)
    assert isinstance(run, RunConfig)
    assert run.storage_path == str(tmp_path) and run.name == f"{name}-run"
    assert isinstance(run.checkpoint_config, CheckpointConfig) and run.checkpoint_config.num_to_keep == 2
    assert isinstance(run.failure_config, FailureConfig) and run.failure_config.max_failures == 1


def test_cpu_scaling_config_refuses_accelerators():
    env = head_env(spec.parse(yaml.safe_load(EXAMPLES["ddp"][1].read_text())))
    assert train.cpu_scaling_config(env).num_workers == 16
    for accelerator in ("use_tpu", "use_gpu"):
        with pytest.raises(ValueError, match="CPUs only"):
            train.cpu_scaling_config(env, **{accelerator: True})


def test_dtensor_mesh_must_divide_the_workers(capsys):
    module = load("dtensor")
    assert module.mesh_shape(16, 4) == (4, 4) and module.mesh_shape(4, 2) == (2, 2)
    for world, tp in ((16, 3), (4, 8)):
        with pytest.raises(ValueError, match=f"--tp {tp} must divide the number of workers \\({world}\\)"):
            module.mesh_shape(world, tp)
    with pytest.raises(SystemExit):
        module.parse_args(["--storage-path", "/tmp/x", "--d-model", "6", "--tp", "5"])
    assert "--tp 5 must divide the feed-forward width 4 x --d-model = 24" in capsys.readouterr().err
