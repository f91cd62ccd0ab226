"""Tensor-parallel training with DTensor on one TPU slice: a 2-D device mesh (data x tensor).

The workers of the slice (one TPU chip each) form a mesh of shape (dp, tp). Within each row of
``tp`` workers the feed-forward weights are DTensors sharded with
``torch.distributed.tensor.parallel`` (the first projection column-wise, ``Shard(0)``; the second
row-wise, ``Shard(1)``), so each worker holds 1/tp of them; the ``dp`` rows see different data and
average their gradients. Checkpoints are sharded too (torch.distributed.checkpoint).

Image: Ray 2.60.0 with PyTorch (>= 2.6, ``torch.distributed.tensor``) and TorchTPU
(``torch_tpu``); see examples/Dockerfile. Only the training function imports torch.

``--cpu`` runs the same loop on CPUs (device ``cpu``, process group ``gloo``, as many workers as
the slice has); the lines that differ are in one block below. A run with the same ``--name`` and
``--storage-path`` resumes from the last checkpoint, as does a restart after a failure.

Not verified on TPU hardware by this project: DTensor collectives over ``tpu_dist`` depend on
TorchTPU's support for DeviceMesh and DTensor (see docs/tasks/cuda-to-tpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Mapping, Sequence

DEFAULT_NAME = "dtensor-example"


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
    p.add_argument("--batch-size", type=int, default=8, help="sequences per data-parallel row")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tp", type=int, default=4, help="tensor-parallel degree; must divide the workers")
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
    for name in ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "tp"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if (4 * args.d_model) % args.tp:
        p.error(f"--tp {args.tp} must divide the feed-forward width 4 x --d-model = {4 * args.d_model}")
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
    keys = ("epochs", "steps_per_epoch", "batch_size", "seq_len", "vocab", "d_model", "layers", "tp", "lr")
    return {"device": device_type(args.cpu), **{k: getattr(args, k) for k in keys}}


def mesh_shape(world: int, tp: int) -> tuple[int, int]:
    """(dp, tp): ``tp`` workers share each weight, ``world // tp`` rows of them see different data."""
    if tp > world or world % tp:
        raise ValueError(f"--tp {tp} must divide the number of workers ({world})")
    return world // tp, tp


# The placements of each feed-forward block: column-wise then row-wise, the Megatron pairing that
# needs one all-reduce per block in the forward pass and one in the backward pass.
TP_PLAN = {"up": "colwise", "down": "rowwise"}


def train_func(config: dict, inspect: Callable | None = None) -> None:
    """Runs in every Ray Train worker; Ray has already joined the process group.

    ``inspect``, if given, is called with the trained model on every worker (the project's tests
    check the placements through it).
    """
    import tempfile

    import ray.train
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device(config["device"])  # was torch.device("cuda")
    dp, tp = mesh_shape(world, config["tp"])
    mesh = init_device_mesh(config["device"], (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()

    class Block(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm = torch.nn.LayerNorm(d)
            self.up = torch.nn.Linear(d, 4 * d)
            self.down = torch.nn.Linear(4 * d, d)

        def forward(self, h):
            return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config["vocab"], config["d_model"])
            self.blocks = torch.nn.ModuleList(Block(config["d_model"]) for _ in range(config["layers"]))
            self.head = torch.nn.Linear(config["d_model"], config["vocab"], bias=False)

        def forward(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = LM().to(device)
    styles = {"colwise": ColwiseParallel(), "rowwise": RowwiseParallel()}
    for block in model.blocks:  # up, down: DTensors sharded over the "tp" dimension of the mesh
        parallelize_module(block, mesh["tp"], {name: styles[style] for name, style in TP_PLAN.items()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])

    start_epoch, step = 0, 0
    # Set when Ray restarts the run after a failure, or on a new run with the same name and storage.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            dcp.load(state, checkpoint_id=d)  # each rank reads the shards it holds
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            with open(os.path.join(d, "progress.txt")) as f:
                last_epoch, step = (int(v) for v in f.read().split())
            start_epoch = last_epoch + 1

    def average_gradients_over_dp():
        # Every rank of a tp group computed the same gradients for its shards; the dp rows saw
        # different data: average over each column of the mesh (gloo has no AVG, so SUM / dp).
        if dp == 1:
            return
        group = mesh["dp"].get_group()
        with torch.no_grad():
            for p in model.parameters():
                grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad  # this rank's shard
                dist.all_reduce(grad, group=group)
                grad.div_(dp)

    # Synthetic text a model can learn: each token is followed by a fixed random successor (the
    # same table on every rank). The workers of one tp group must see the same batch: seed by dp row.
    successor = torch.randperm(config["vocab"], generator=torch.Generator().manual_seed(0))
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1234 + 1000 * step + dp_rank)
    for epoch in range(start_epoch, config["epochs"]):
        model.train()
        total = torch.zeros((), device=device)
        for _ in range(config["steps_per_epoch"]):
            first = torch.randint(0, config["vocab"], (config["batch_size"], 1), generator=generator)
            tokens = first.expand(-1, config["seq_len"] + 1).clone()
            for i in range(1, config["seq_len"] + 1):
                tokens[:, i] = successor[tokens[:, i - 1]]
            tokens = tokens.to(device)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, config["vocab"]), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # the DTensor layers all-reduce over "tp"
            average_gradients_over_dp()
            optimizer.step()
            total += loss.detach()
            step += 1
        dist.all_reduce(total)
        metrics = {"epoch": epoch, "step": step, "loss": (total / (world * config["steps_per_epoch"])).item()}

        # Every rank writes the shards it holds (replicated ones once); Ray Train gathers the
        # ranks' directories into the one checkpoint of this report.
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
