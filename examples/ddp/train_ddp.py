"""Data-parallel (DDP) training on one TPU slice: Ray Train's TorchTrainer + PyTorch on TPU.

Runs as the entrypoint of a TPUTorchJob (see tputorchjob.yaml next to this file). The operator
puts the slice's shape into the environment; ``tputorch.train.scaling_config()`` turns it into
Ray Train's ScalingConfig, so nothing here names a topology or a chip count.

Image: Ray 2.60.0 with PyTorch and TorchTPU (``torch_tpu``, which provides the ``tpu`` device
and the ``tpu_dist`` process-group backend) and this project's ``tputorch`` package; see
examples/Dockerfile. Only the training function imports torch: the argument parsing and config
building below import without it.

``--cpu`` runs the same loop on CPUs (device ``cpu``, process group ``gloo``, as many workers as
the slice has); the lines that differ are in one block below. A run with the same ``--name`` and
``--storage-path`` resumes from the last checkpoint, as does a restart after a failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Mapping, Sequence

DEFAULT_NAME = "ddp-example"
FEATURES, CLASSES = 128, 10


# ---- Where the workers run: the only lines that differ between a TPU slice and --cpu ----------
# TPU (default): device "tpu"; TorchTrainer picks the tpu_dist process group itself (use_tpu=True);
# the slice's ScalingConfig. --cpu: device "cpu", process group "gloo", a CPU ScalingConfig with
# the same number of workers. Nothing falls back to CPU without --cpu.
def device_type(cpu: bool) -> str:
    return "cpu" if cpu else "tpu"


def backend(cpu: bool) -> str | None:
    return "gloo" if cpu else None  # None: TorchTrainer chooses (tpu_dist with use_tpu=True)


def build_scaling_config(cpu: bool = False, environ: Mapping[str, str] | None = None):
    """Workers (and, on TPU, chips per worker, topology and accelerator type) of this job's slice."""
    from tputorch.train import cpu_scaling_config, scaling_config

    return cpu_scaling_config(environ) if cpu else scaling_config(environ)
# -----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument(
        "--storage-path",
        default=os.environ.get("TPUTORCH_STORAGE_PATH") or os.environ.get("STORAGE_PATH"),
        help="where Ray Train writes checkpoints: a bucket (gs://...) or a filesystem every host "
        "mounts; default: the TPUTorchJob's spec.checkpoint.storagePath ($TPUTORCH_STORAGE_PATH), "
        "else $STORAGE_PATH",
    )
    # The operator's run name is the same on every attempt of one TPUTorchJob: a retried job
    # finds its checkpoints under it (ray.train.get_checkpoint() below).
    p.add_argument("--name", default=os.environ.get("TPUTORCH_RUN_NAME") or os.environ.get("TPUTORCH_JOB_NAME", DEFAULT_NAME),
                   help="run name; default: $TPUTORCH_RUN_NAME, which the operator sets")
    p.add_argument("--max-failures", type=int, default=int(os.environ.get("TPUTORCH_WORKER_RETRIES") or 1),
                   help="restarts from the last checkpoint inside one attempt; default: spec.checkpoint.workerRetries")
    p.add_argument("--cpu", action="store_true", help="run on CPUs with gloo instead of the slice's TPUs")
    args = p.parse_args(argv)
    if not args.storage_path:
        p.error("--storage-path (or spec.checkpoint.storagePath, or $STORAGE_PATH) is required: every host of a multi-host slice must reach it")
    for name in ("epochs", "steps_per_epoch", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def build_run_config(args: argparse.Namespace):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    return RunConfig(
        name=args.name,
        storage_path=args.storage_path,
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        failure_config=FailureConfig(max_failures=args.max_failures),
    )


def train_loop_config(args: argparse.Namespace) -> dict:
    return {
        "device": device_type(args.cpu),
        "epochs": args.epochs,
        "steps_per_epoch": args.steps_per_epoch,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "hidden": args.hidden,
    }


def train_func(config: dict, inspect: Callable | None = None) -> None:
    """Runs in every Ray Train worker; Ray has already joined the process group.

    ``inspect``, if given, is called with the trained model on every worker (the project's tests
    check the replicas through it).
    """
    import tempfile

    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tputorch.train import report, restoring

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device(config["device"])  # was torch.device("cuda") / "cuda:{local_rank}"

    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, config["hidden"]),
        torch.nn.GELU(),
        torch.nn.Linear(config["hidden"], CLASSES),
    )
    state = None
    # Set when Ray restarts the run after a failure, or on a new run with the same name and storage:
    # ray.train.get_checkpoint(), never one an earlier attempt wrote after this one started. The
    # time inside restoring() is the goodput ledger's restore (docs/tasks/goodput.md).
    with restoring() as checkpoint:
        if checkpoint:
            with checkpoint.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"), map_location="cpu")
            model.load_state_dict(state["model"])

    # Move first, then build the optimizer: it must hold the on-device parameters.
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    start_epoch, step = 0, 0
    if state:
        optimizer.load_state_dict(state["optimizer"])  # moved to the parameters' device
        start_epoch, step = state["epoch"] + 1, state["step"]
    model = DistributedDataParallel(model)  # no device_ids: one device per process
    loss_fn = torch.nn.CrossEntropyLoss()

    # Synthetic data a model can learn: the labels come from a fixed random linear "teacher"
    # (the same on every rank); the inputs differ per rank, as a sharded dataset would.
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1234 + 1000 * step + rank)
    for epoch in range(start_epoch, config["epochs"]):
        model.train()
        total = torch.zeros((), device=device)
        for _ in range(config["steps_per_epoch"]):
            x = torch.randn(config["batch_size"], FEATURES, generator=generator)
            y = (x @ teacher).argmax(dim=1)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()  # DDP all-reduces gradients over the process group
            optimizer.step()
            total += loss.detach()
            step += 1
        dist.all_reduce(total)
        metrics = {"epoch": epoch, "step": step, "loss": (total / (world * config["steps_per_epoch"])).item()}

        # tputorch.train.report is ray.train.report plus one line for the operator: the job's
        # status then shows the step, the loss and the checkpoint (`tputorch describe`).
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:  # DDP replicas are identical: one copy is the checkpoint
                state = {
                    "model": {k: v.cpu() for k, v in model.module.state_dict().items()},
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "step": step,
                }
                torch.save(state, os.path.join(d, "state.pt"))
                report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            else:
                report(metrics)
    if inspect:
        inspect(model)


def run(args: argparse.Namespace):
    from ray.train.torch import TorchConfig, TorchTrainer  # imports torch

    trainer = TorchTrainer(
        train_func,
        train_loop_config=train_loop_config(args),
        torch_config=TorchConfig(backend=backend(args.cpu)),
        scaling_config=build_scaling_config(args.cpu),
        run_config=build_run_config(args),
    )
    return trainer.fit()


def main(argv: Sequence[str] | None = None) -> int:
    result = run(parse_args(argv))
    print(f"final metrics: {result.metrics}; checkpoint: {result.checkpoint}")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
