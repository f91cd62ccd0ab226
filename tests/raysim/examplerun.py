"""Run an example script's real training function under Ray Train on CPU, on the simulated slice
of its rendered TPUTorchJob, and record what every worker ended up with.

The example module is loaded from its file and shipped to the workers by value (they cannot import
it, nor this helper). Its ``run(args)`` is called as ``main`` would call it, with ``--cpu`` and the
head container's environment of the rendered RayJob (where ``TPUTORCH_NUM_WORKERS`` comes from);
only ``train_func`` is wrapped, through its ``inspect`` argument, to write one record per worker.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "ddp": (ROOT / "examples/ddp/train_ddp.py", ROOT / "examples/ddp/tputorchjob.yaml"),
    "fsdp": (ROOT / "examples/fsdp/train_fsdp.py", ROOT / "examples/fsdp/tputorchjob.yaml"),
    "dtensor": (ROOT / "examples/dtensor/train_dtensor.py", ROOT / "examples/dtensor/tputorchjob.yaml"),
}


def load(name: str) -> ModuleType:
    """The example script as a module, registered so that cloudpickle ships it by value."""
    from ray import cloudpickle

    module_name = f"example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, EXAMPLES[name][0])
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def manifest(name: str, topology: str | None = None) -> dict:
    """The example's TPUTorchJob, on another topology of the same accelerator if asked."""
    body = yaml.safe_load(EXAMPLES[name][1].read_text())
    body["metadata"].setdefault("namespace", "default")
    if topology:
        body["spec"]["tpu"]["topology"] = topology
    return body


def entrypoint_args(job) -> list[str]:
    """The script's arguments in the job's entrypoint (``python <script> ...``)."""
    argv = shlex.split(job.entrypoint)
    assert argv[0] == "python", argv
    return argv[2:]


def record_worker(out_dir: str, model) -> None:
    """``inspect`` callback, in every worker: this rank's view of the trained model."""
    import ray
    import ray.train
    import torch
    from torch.distributed.tensor import DTensor

    ctx = ray.train.get_context()
    params = {}
    for name, p in model.named_parameters():
        entry = {"shape": list(p.shape), "dtensor": isinstance(p, DTensor)}
        local = p
        if isinstance(p, DTensor):
            local = p.to_local()
            entry.update(
                placements=[repr(pl) for pl in p.placements],
                mesh_dims=list(p.device_mesh.mesh_dim_names or ()),
                mesh_size=p.device_mesh.size(),
            )
        entry.update(local_shape=list(local.shape), local_sum=float(local.detach().double().sum()))
        params[name] = entry
    record = {
        "rank": ctx.get_world_rank(),
        "world": ctx.get_world_size(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "torch_threads": torch.get_num_threads(),
        "params": params,
    }
    Path(out_dir, f"rank-{record['rank']}.json").write_text(json.dumps(record, sort_keys=True))


@dataclass
class Run:
    result: object  # ray.train.Result
    records: list[dict]  # one per worker, by rank

    def history(self) -> list[dict]:
        """Metrics of the checkpoints kept, oldest first."""
        return sorted((m for _, m in self.result.best_checkpoints), key=lambda m: m["step"])


def run_cpu(module: ModuleType, argv: list[str], head_env: dict[str, str], out_dir: Path, monkeypatch) -> Run:
    """``module.run(parse_args(argv + ["--cpu"]))`` with the job's head environment; every worker
    records the trained model into ``out_dir``."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this helper
    out_dir.mkdir(parents=True, exist_ok=True)
    for key, value in head_env.items():
        monkeypatch.setenv(key, value)
    real = module.train_func
    monkeypatch.setattr(module, "train_func", partial(real, inspect=partial(record_worker, str(out_dir))))
    try:
        result = module.run(module.parse_args([*argv, "--cpu"]))
    finally:
        monkeypatch.setattr(module, "train_func", real)
    assert result.error is None, result.error
    records = sorted((json.loads(p.read_text()) for p in out_dir.glob("rank-*.json")), key=lambda r: r["rank"])
    return Run(result, records)
