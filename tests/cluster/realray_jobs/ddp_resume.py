"""A small DDP job for the real-Ray resume test (tests/cluster/test_real_ray.py): the DDP example's
pattern (TorchTrainer, DistributedDataParallel, rank 0 checkpoints the model and optimizer, a
restart resumes from ray.train.get_checkpoint()) with a tiny model on CPU, so that two attempts fit
in a test.

    python ddp_resume.py --steps 8 --pause-at 3

The workers run on CPU with gloo, as the DDP example's --cpu does (tputorch.train.cpu_scaling_config():
a worker that holds TPU chips gets Ray's TPU device manager, which needs torch_tpu), each pinned to
its host of the slice by the host's Ray label ray.io/tpu-worker-id, so that a lost host takes
its workers with it. The run's name and
storage come from the operator through tputorch.train.run_config() (spec.checkpoint), so a new
attempt of the same TPUTorchJob finds the last checkpoint. A checkpoint is written every step.

--pause-at N: a run that did not resume stops after its checkpoint of step N and waits until it
is killed; the test kills a host there, so the kill always lands mid-run whatever the machine's
load. A resumed run starts after N and never pauses, and checkpoints only even steps (so that an
attempt that fails after an odd step has lost work).

--hang-attempt A --hang-at S: in attempt A (TPUTORCH_ATTEMPT), before step S's collective, rank 1
sleeps for ever: every other rank blocks inside torch.distributed.all_reduce (gloo), which the
hang sentinel's watchdog (spec.hangDetection, armed by tputorch.train.report()) names.

Rank 0 prints `tputorch-resume: resumed from step N` (N = 0 on a fresh start) and, at the end,
`tputorch-resume: done at step M`; Ray Train streams the workers' output to the driver's log.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

FEATURES, CLASSES = 8, 2


def train_func(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tputorch import train

    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    checkpoint = ray.train.get_checkpoint()  # an earlier attempt's, or this attempt's before a restart
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    resumed = step
    if rank == 0:
        print(f"tputorch-resume: resumed from step {resumed}", flush=True)
    model = DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(1000 * step + rank)
    while step < config["steps"]:
        if train.attempt() == config["hang_attempt"] and step + 1 == config["hang_at"] and rank == 1:
            while True:  # a rank that never reaches the collective: the others wait inside it
                time.sleep(1)
        dist.all_reduce(torch.ones(1))  # the step's collective (DDP's own all-reduce runs inside autograd)
        x = torch.randn(16, FEATURES, generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), (x.sum(dim=1) > 0).long())
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo
        optimizer.step()
        step += 1
        time.sleep(config["sleep"])
        metrics = {"step": step, "loss": loss.item()}
        saves = resumed == 0 or step % 2 == 0
        with tempfile.TemporaryDirectory() as d:
            if rank == 0 and saves:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(state, os.path.join(d, "state.pt"))
                train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            else:
                train.report(metrics)
        if rank == 0:
            print(f"tputorch-resume: step {step} loss {metrics['loss']:.4f}", flush=True)
        if resumed == 0 and step == config["pause_at"]:
            if rank == 0:
                print(f"tputorch-resume: paused at step {step}", flush=True)
            train.pause_hang_watchdog()  # the pause is the test's, not a hang
            while True:  # until a host of the slice is killed
                time.sleep(1)
    if rank == 0:
        print(f"tputorch-resume: done at step {step}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--pause-at", type=int, default=0, help="0: never pause")
    p.add_argument("--sleep", type=float, default=0.2, help="seconds per step")
    p.add_argument("--hang-attempt", type=int, default=0, help="the attempt that hangs (0: none)")
    p.add_argument("--hang-at", type=int, default=0, help="the step whose collective rank 1 never joins")
    args = p.parse_args(argv)

    from ray.train.torch import TorchConfig, TorchTrainer

    from tputorch.train import ENV_NUM_HOSTS, cpu_scaling_config, run_config

    scaling = cpu_scaling_config()
    per_host = scaling.num_workers // int(os.environ[ENV_NUM_HOSTS])
    scaling = cpu_scaling_config(label_selector=[{"ray.io/tpu-worker-id": str(rank // per_host)}
                                                 for rank in range(scaling.num_workers)])
    run = run_config()
    print(f"tputorch-resume: run {run.name} in {run.storage_path}", flush=True)
    trainer = TorchTrainer(train_func, train_loop_config={"steps": args.steps, "pause_at": args.pause_at,
                                                          "sleep": args.sleep, "hang_attempt": args.hang_attempt,
                                                          "hang_at": args.hang_at},
                           torch_config=TorchConfig(backend="gloo"), scaling_config=scaling,
                           run_config=run)
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    return 0


if __name__ == "__main__":
    sys.exit(main())
