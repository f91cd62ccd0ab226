"""GRPO-style reinforcement learning on a TPU slice, with rollouts and rewards on spec.groups.

Runs as the entrypoint of a TPUTorchJob with groups (tpu-tpu.yaml: rollouts on a second TPU
slice; tpu-gpu.yaml: rollouts on GPUs). One Ray cluster holds them all:

- the policy trains with Ray Train's TorchTrainer on the job's own slice (``scaling_config()``
  keeps its workers there, never on a rollout slice of the same shape);
- rollout actors, one per host of the rollout group (placed by the group's Ray label), sample
  answers with the current weights, which rank 0 puts into Ray's object store after every step;
- a reward actor on the CPU group scores the answers;
- GRPO: each prompt gets ``--group-size`` answers, the advantage is the reward minus the mean of
  its group (over the group's std), the loss is ``-advantage * log p(answer)``, data-parallel (DDP).

The task is a toy one (answer ``(3 * prompt + 1) mod V`` for a prompt token), so the reward
rises within a few steps. In production the rollout actor would hold a vLLM engine (vLLM on TPU
on a TPU group, CUDA vLLM on a GPU group) and load the weights the same way; see docs/rl.md.

``--cpu`` runs everything on CPUs (gloo, device cpu) while keeping the TPU placement: Ray Train
still reserves the training slice's chips (TPU_VISIBLE_CHIPS per worker), rollout actors still
take their host's chips or GPUs (see ``trainer()``). ``--out DIR`` makes every Train worker and rollout actor record
where it ran and what it saw (for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

VOCAB, HIDDEN = 8, 32


def target(prompt: int) -> int:
    return (3 * prompt + 1) % VOCAB


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="answers sampled per prompt (GRPO group)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rollout-group", default="rollout", help="spec.groups entry the rollout actors run on")
    p.add_argument("--reward-group", default="reward", help="spec.groups entry the reward actor runs on")
    p.add_argument("--storage-path", default=os.environ.get("STORAGE_PATH", "/tmp/tputorch-rl"))
    p.add_argument("--name", default="grpo-example")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and gloo, on the same TPU placement")
    p.add_argument("--out", default=None, help="directory for per-worker / per-actor records")
    return p.parse_args(argv)


def make_policy():
    import torch

    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, VOCAB))


def _record(out: str | None, name: str, record: dict) -> None:
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(record, sort_keys=True))


def _where() -> dict:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "TPU_VISIBLE_CHIPS": os.environ.get("TPU_VISIBLE_CHIPS"),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "accelerators": {k: list(v) for k, v in ray.get_runtime_context().get_accelerator_ids().items()}}


class Rollout:
    """A rollout engine: the policy at the latest weights it was sent, sampling answers."""

    def __init__(self, index: int, device: str, out: str | None):
        import torch

        torch.manual_seed(1000 + index)
        self.index, self.device, self.out = index, device, out
        self.policy = make_policy().to(device)
        self.version = -1
        self.seen: list[int] = []

    def load(self, state: dict, version: int) -> int:
        # `state` arrives from the object store (rank 0's ray.put), resolved by Ray for this call.
        self.policy.load_state_dict(state)
        self.version = version
        self.seen.append(version)
        return version

    def generate(self, prompts: list[int], group_size: int) -> dict:
        import torch

        with torch.no_grad():
            logits = self.policy(torch.tensor(prompts, device=self.device))
            answers = torch.multinomial(torch.softmax(logits, -1), group_size, replacement=True)
        _record(self.out, f"rollout-{self.index}", {**_where(), "index": self.index, "versions_seen": self.seen})
        return {"answers": answers.cpu().tolist(), "version": self.version}


class Reward:
    """The reward model / verifier: 1 for the right answer, 0 otherwise."""

    def __init__(self, out: str | None):
        self.out = out

    def score(self, prompts: list[int], answers: list[list[int]]) -> list[list[float]]:
        _record(self.out, "reward", _where())
        return [[1.0 if a == target(p) else 0.0 for a in group] for p, group in zip(prompts, answers)]


def _init_gloo(rank: int, world: int) -> None:
    """--cpu: a gloo process group among the Train workers, rendezvous at rank 0's address."""
    import socket

    import ray.train.collective
    import torch.distributed as dist

    address = None
    if rank == 0:
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:  # a free port on this node (released just before gloo binds it)
            s.bind((ip, 0))
            address = f"tcp://{ip}:{s.getsockname()[1]}"
    address = ray.train.collective.broadcast_from_rank_zero(address)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)


def train_func(config: dict) -> None:
    import random

    import ray
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if not dist.is_initialized():  # --cpu: the process group is ours (see trainer() below)
        _init_gloo(rank, world)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    device = torch.device(config["device"])  # "tpu" (torch_tpu) on the slice, "cpu" with --cpu
    model = DistributedDataParallel(make_policy().to(device))  # no device_ids: one device per process
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    rollouts, reward = config["rollouts"], config["reward"]
    rng = random.Random(42)
    _record(config["out"], f"train-rank-{rank}", {**_where(), "rank": rank, "world": world})
    history: dict[str, list] = {"reward": [], "weight_version": []}

    for step in range(config["steps"]):
        batch = [None]
        if rank == 0:
            # The weights go to every rollout engine through the object store: one put, one copy per node.
            state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
            ref = ray.put(state)
            ray.get([r.load.remote(ref, step) for r in rollouts])
            prompts = [rng.randrange(VOCAB) for _ in range(config["prompts"])]
            chunks = [prompts[i::len(rollouts)] for i in range(len(rollouts))]
            outs = ray.get([r.generate.remote(c, config["group_size"]) for r, c in zip(rollouts, chunks) if c])
            prompts = [p for c in chunks if c for p in c]
            answers = [a for o in outs for a in o["answers"]]
            rewards = ray.get(reward.score.remote(prompts, answers))
            batch = [{"prompts": prompts, "answers": answers, "rewards": rewards,
                      "versions": [o["version"] for o in outs]}]
        dist.broadcast_object_list(batch, src=0)
        b = batch[0]
        r = torch.tensor(b["rewards"])
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
        mine = list(range(rank, len(b["prompts"]), world))  # this rank's share of the prompts
        logits = model(torch.tensor([b["prompts"][i] for i in mine], device=device))
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor([b["answers"][i] for i in mine], device=device))
        loss = -(adv[mine].to(device) * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history["reward"].append(float(r.mean()))
        history["weight_version"].append(min(b["versions"]))
        ray.train.report({"step": step, "reward": history["reward"][-1], "weight_version": min(b["versions"]),
                          "loss": float(loss.detach().cpu())})
    if rank == 0:
        _record(config["out"], "history", history)
        print(f"reward by step: {' '.join(f'{x:.2f}' for x in history['reward'])}")


def run(args: argparse.Namespace):
    import ray
    from ray.train import RunConfig

    from tputorch import train

    groups = train.groups()
    rollout, reward = groups[args.rollout_group], groups[args.reward_group]
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    # One rollout engine per host of the rollout group, holding that host's accelerators.
    if rollout.kind == "tpu":
        accel, device = {"resources": {"TPU": rollout.chips_per_host}}, "tpu"
    elif rollout.kind == "gpu":
        accel, device = {"num_gpus": rollout.gpus_per_host}, "cuda"
    else:
        accel, device = {}, "cpu"
    engines = [
        ray.remote(Rollout).options(num_cpus=1, label_selector=rollout.labels, **accel)
        .remote(i, "cpu" if args.cpu else device, args.out)
        for i in range(rollout.hosts)
    ]
    scorer = ray.remote(Reward).options(num_cpus=1, label_selector=reward.labels).remote(args.out)
    config = {"steps": args.steps, "prompts": args.prompts, "group_size": args.group_size, "lr": args.lr,
              "rollouts": engines, "reward": scorer, "out": args.out, "device": "cpu" if args.cpu else "tpu"}
    return trainer(args.cpu, config, RunConfig(storage_path=args.storage_path, name=args.name)).fit()


# ---- Where the policy trains: the only lines that differ between a TPU slice and --cpu ---------
# Both: one worker per chip of the training slice (train.scaling_config(), which keeps them there).
# TPU: TorchTrainer, device "tpu", process group tpu_dist (TorchTrainer's choice with use_tpu=True).
# --cpu: the same placement (each worker still owns its chip: TPU_VISIBLE_CHIPS), device "cpu" and a
# gloo group the script sets up itself: TorchTrainer would ask torch_tpu for the workers' device.
def trainer(cpu: bool, config: dict, run_config):
    from tputorch import train

    if cpu:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer(train_func, train_loop_config=config, scaling_config=train.scaling_config(),
                                   run_config=run_config)
    from ray.train.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config, scaling_config=train.scaling_config(), run_config=run_config)
# -----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    args = parse_args(argv)
    ray.init()
    result = run(args)
    print(f"final metrics: {result.metrics}")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
