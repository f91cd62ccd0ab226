"""Sharded training (FSDP v2, ``fully_shard``) on one TPU slice with Ray Train's TorchTrainer.

Parameters, gradients and optimizer state are sharded over every worker of the slice (one TPU
chip each); checkpoints are sharded too (torch.distributed.checkpoint), each worker reporting
its own shard files to Ray Train, which gathers them into one checkpoint directory.

Image: Ray 2.60.0 with PyTorch (>= 2.6 for ``torch.distributed.fsdp.fully_shard``) and TorchTPU
(``torch_tpu``); see examples/Dockerfile. Only the training function imports torch.

Not verified on TPU hardware by this project: FSDP v2 over ``tpu_dist`` depends on TorchTPU's
support for DeviceMesh and DTensor collectives (see docs/cuda-to-tpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Sequence

DEFAULT_NAME = "fsdp-example"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per worker")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
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
    for name in ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % args.heads:
        p.error("--d-model must be a multiple of --heads")
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
    keys = ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "heads", "lr")
    return {k: getattr(args, k) for k in keys}


def train_func(config: dict) -> None:
    """Runs in every Ray Train worker; Ray has already joined the ``tpu_dist`` process group."""
    import tempfile

    import ray.train
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("tpu")  # was torch.device("cuda")
    mesh = init_device_mesh("tpu", (world,))  # was init_device_mesh("cuda", ...)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config["vocab"], config["d_model"])
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(
                    config["d_model"], config["heads"], 4 * config["d_model"], batch_first=True, norm_first=True
                )
                for _ in range(config["layers"])
            )
            self.head = torch.nn.Linear(config["d_model"], config["vocab"], bias=False)

        def forward(self, tokens):
            n = tokens.shape[1]
            causal = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h, src_mask=causal)
            return self.head(h)

    model = LM().to(device)
    for block in model.blocks:  # shard block by block, then the rest (embedding, head)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])

    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()  # set when Ray restarts the run after a failure
    if checkpoint:
        with checkpoint.as_directory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            dcp.load(state, checkpoint_id=d)  # each rank reads its own shards
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            with open(os.path.join(d, "epoch.txt")) as f:
                start_epoch = int(f.read()) + 1

    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1234 + rank)
    for epoch in range(start_epoch, config["epochs"]):
        model.train()
        total = torch.zeros((), device=device)
        for _ in range(config["steps_per_epoch"]):
            tokens = torch.randint(
                0, config["vocab"], (config["batch_size"], config["seq_len"] + 1), generator=generator
            ).to(device)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, config["vocab"]), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # FSDP reduce-scatters gradients over tpu_dist
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        metrics = {"epoch": epoch, "loss": (total / (world * config["steps_per_epoch"])).item()}

        # Every rank writes its shards (file names carry the rank) into its own directory and
        # reports it; Ray Train gathers all of them into the one checkpoint of this report.
        with tempfile.TemporaryDirectory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=d)
            if rank == 0:
                with open(os.path.join(d, "epoch.txt"), "w") as f:
                    f.write(str(epoch))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


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
