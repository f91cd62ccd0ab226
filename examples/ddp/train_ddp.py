"""Data-parallel (DDP) training on one TPU slice: Ray Train's TorchTrainer + PyTorch on TPU.

Runs as the entrypoint of a TPUTorchJob (see tputorchjob.yaml next to this file). The operator
puts the slice's shape into the environment; ``tputorch.train.scaling_config()`` turns it into
Ray Train's ScalingConfig, so nothing here names a topology or a chip count.

Image: Ray 2.60.0 with PyTorch and TorchTPU (``torch_tpu``, which provides the ``tpu`` device
and the ``tpu_dist`` process-group backend) and this project's ``tputorch`` package; see
examples/Dockerfile. Only the training function imports torch: the argument parsing and config
building below import without it (the project's CI tests them with real Ray classes).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Sequence

DEFAULT_NAME = "ddp-example"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument(
        "--storage-path",
        default=os.environ.get("STORAGE_PATH"),
        help="where Ray Train writes checkpoints: a bucket (gs://...) or a filesystem every host "
        "mounts; default: $STORAGE_PATH",
    )
    p.add_argument("--name", default=os.environ.get("TPUTORCH_JOB_NAME", DEFAULT_NAME), help="run name")
    p.add_argument("--max-failures", type=int, default=1, help="restarts from the last checkpoint")
    args = p.parse_args(argv)
    if not args.storage_path:
        p.error("--storage-path (or $STORAGE_PATH) is required: every host of a multi-host slice must reach it")
    for name in ("epochs", "steps_per_epoch", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def build_scaling_config(environ: Mapping[str, str] | None = None):
    """Workers, TPU chips per worker, topology and accelerator type of this job's slice."""
    from tputorch.train import scaling_config

    return scaling_config(environ)


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
        "epochs": args.epochs,
        "steps_per_epoch": args.steps_per_epoch,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "hidden": args.hidden,
    }


def train_func(config: dict) -> None:
    """Runs in every Ray Train worker; Ray has already joined the ``tpu_dist`` process group."""
    import tempfile

    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("tpu")  # was torch.device("cuda") / "cuda:{local_rank}"

    model = torch.nn.Sequential(
        torch.nn.Linear(128, config["hidden"]),
        torch.nn.GELU(),
        torch.nn.Linear(config["hidden"], 10),
    )
    state = None
    checkpoint = ray.train.get_checkpoint()  # set when Ray restarts the run after a failure
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), map_location="cpu")
        model.load_state_dict(state["model"])

    # Move first, then build the optimizer: it must hold the on-device parameters.
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    start_epoch = 0
    if state:
        optimizer.load_state_dict(state["optimizer"])  # moved to the parameters' device
        start_epoch = state["epoch"] + 1
    model = DistributedDataParallel(model)  # no device_ids: one device per process
    loss_fn = torch.nn.CrossEntropyLoss()

    # Synthetic data, different per rank (a real job would shard a dataset by rank / world).
    generator = torch.Generator().manual_seed(1234 + rank)
    for epoch in range(start_epoch, config["epochs"]):
        model.train()
        total = torch.zeros((), device=device)
        for _ in range(config["steps_per_epoch"]):
            x = torch.randn(config["batch_size"], 128, generator=generator).to(device)
            y = torch.randint(0, 10, (config["batch_size"],), generator=generator).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP all-reduces gradients over tpu_dist
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        metrics = {"epoch": epoch, "loss": (total / (world * config["steps_per_epoch"])).item()}

        with tempfile.TemporaryDirectory() as d:
            if rank == 0:  # DDP replicas are identical: one copy is the checkpoint
                state = {
                    "model": {k: v.cpu() for k, v in model.module.state_dict().items()},
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                }
                torch.save(state, os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            else:
                ray.train.report(metrics)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from ray.train.torch import TorchTrainer  # imports torch

    trainer = TorchTrainer(
        train_func,
        train_loop_config=train_loop_config(args),
        scaling_config=build_scaling_config(),  # use_tpu=True: TorchTrainer picks tpu_dist
        run_config=build_run_config(args),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}; checkpoint: {result.checkpoint}")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
