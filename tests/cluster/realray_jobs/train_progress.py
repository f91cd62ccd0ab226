"""A Ray Train V2 job that reports its progress through tputorch.train.report(), one step at a time
when the test says so: the entrypoint of the progress tests (tests/cluster/test_real_ray.py) and of
the recording of Ray's driver-log answer (record_driver_log.py).

    python train_progress.py --steps 3 --gate DIR     step k > 1 starts once DIR/step-<k> exists

Each worker fits y = 3x by gradient descent on its own shard, so the loss falls step by step; every
step reports {"loss", "step", "epoch"} and a checkpoint (rank 0's) to the run's storage
(tputorch.train.run_config(): spec.checkpoint.storagePath).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def train_loop(config: dict) -> None:
    import ray.train

    from tputorch.train import report

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    xs = [(rank + 1) * 0.1 * i for i in range(1, 9)]
    w = 0.0
    for step in range(1, config["steps"] + 1):
        gate = Path(config["gate"], f"step-{step}")
        while step > 1 and not gate.exists():
            time.sleep(0.2)
        w -= 0.02 * sum(2 * (w * x - 3 * x) * x for x in xs) / len(xs)
        loss = sum((w * x - 3 * x) ** 2 for x in xs) / len(xs)
        checkpoint = None
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                Path(d, "state.json").write_text(json.dumps({"w": w, "step": step}))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            report({"loss": loss, "step": step, "epoch": 0}, checkpoint=checkpoint)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gate", required=True)
    args = p.parse_args()

    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from tputorch.train import run_config, scaling_config

    trainer = DataParallelTrainer(train_loop, train_loop_config={"steps": args.steps, "gate": args.gate},
                                  scaling_config=scaling_config(), run_config=run_config())
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    print(f"tputorch-realray: progress done after {args.steps} steps", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    main()
