"""Sharded training (FSDP v2, ``fully_shard``) on one TPU slice with Ray Train's TorchTrainer.

Parameters, gradients and optimizer state are sharded over every worker of the slice (one TPU
chip each); checkpoints are sharded too (torch.distributed.checkpoint), each worker reporting
its own shard files to Ray Train, which gathers them into one checkpoint directory.

Image: Ray 2.60.0 with PyTorch (>= 2.6 for ``torch.distributed.fsdp.fully_shard``) and TorchTPU
(``torch_tpu``); see examples/Dockerfile. Only the training function imports torch.

``--cpu`` runs the same loop on CPUs (device ``cpu``, process group ``gloo``, as many workers as
the slice has); the lines that differ are in one block below. A run with the same ``--name`` and
``--storage-path`` resumes from the last checkpoint, as does a restart after a failure.

Not verified on TPU hardware by this project: FSDP v2 over ``tpu_dist`` depends on TorchTPU's
support for DeviceMesh and DTensor collectives (see docs/tasks/cuda-to-tpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Mapping, Sequence

DEFAULT_NAME = "fsdp-example"


# ---- Where the workers run: the only lines that differ between a TPU slice and --cpu ----------
# TPU (default): device and device mesh "tpu"; TorchTrainer picks the tpu_dist process group itself
# (use_tpu=True); the slice's ScalingConfig. --cpu: "cpu", process group "gloo", a CPU ScalingConfig
# with the same number of workers. Nothing falls back to CPU without --cpu.
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
    for name in ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % args.heads:
        p.error("--d-model must be a multiple of --heads")
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
    keys = ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "heads", "lr")
    return {"device": device_type(args.cpu), **{k: getattr(args, k) for k in keys}}


def train_func(config: dict, inspect: Callable | None = None) -> None:
    """Runs in every Ray Train worker; Ray has already joined the process group.

    ``inspect``, if given, is called with the trained model on every worker (the project's tests
    check the sharding through it).
    """
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
    device = torch.device(config["device"])  # was torch.device("cuda")
    mesh = init_device_mesh(config["device"], (world,))  # was init_device_mesh("cuda", ...)

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

    torch.manual_seed(0)  # the same initial weights on every rank
    model = LM().to(device)
    for block in model.blocks:  # shard block by block, then the rest (embedding, head)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])

    start_epoch, step = 0, 0
    # Set when Ray restarts the run after a failure, or on a new run with the same name and storage.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            dcp.load(state, checkpoint_id=d)  # each rank reads its own shards
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            with open(os.path.join(d, "progress.txt")) as f:
                last_epoch, step = (int(v) for v in f.read().split())
            start_epoch = last_epoch + 1

    # Synthetic text a model can learn: each token is followed by a fixed random successor (the
    # same table on every rank); the sequences differ per rank, as a sharded dataset would.
    successor = torch.randperm(config["vocab"], generator=torch.Generator().manual_seed(0))
    positions = torch.arange(config["seq_len"] + 1)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1234 + 1000 * step + rank)
    for epoch in range(start_epoch, config["epochs"]):
        model.train()
        total = torch.zeros((), device=device)
        for _ in range(config["steps_per_epoch"]):
            first = torch.randint(0, config["vocab"], (config["batch_size"], 1), generator=generator)
            tokens = first.expand(-1, positions.numel()).clone()
            for i in range(1, positions.numel()):
                tokens[:, i] = successor[tokens[:, i - 1]]
            tokens = tokens.to(device)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, config["vocab"]), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # FSDP reduce-scatters gradients over the process group
            optimizer.step()
            total += loss.detach()
            step += 1
        dist.all_reduce(total)
        metrics = {"epoch": epoch, "step": step, "loss": (total / (world * config["steps_per_epoch"])).item()}

        # Every rank writes its shards (file names carry the rank) into its own directory and
        # reports it; Ray Train gathers all of them into the one checkpoint of this report.
        with tempfile.TemporaryDirectory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=d)
            if rank == 0:
                with open(os.path.join(d, "progress.txt"), "w") as f:
                    f.write(f"{epoch} {step}")
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
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
