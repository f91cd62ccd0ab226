"""A small Ray Train V2 job for the real-Ray tests (tests/cluster/test_real_ray.py): the entrypoint
of a TPUTorchJob, run by the local cluster's real Ray head.

    python train_record.py --out DIR             train on the slice; each worker writes what it saw
    python train_record.py --fail MESSAGE        fail in the driver with RuntimeError(MESSAGE)
    python train_record.py --hold-until FILE     run until FILE exists (to stop, suspend, delete)

The slice's shape comes only from the environment the operator rendered, through
tputorch.train.scaling_config(), as in a user's script.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def train_loop(config: dict) -> None:
    import ray
    import ray.train

    ctx = ray.train.get_context()
    runtime = ray.get_runtime_context()
    record = {
        "world_rank": ctx.get_world_rank(),
        "world_size": ctx.get_world_size(),
        "node_id": runtime.get_node_id(),
        "assigned_tpu_ids": runtime.get_accelerator_ids().get("TPU", []),
        **{k: os.environ.get(k) for k in ("TPU_VISIBLE_CHIPS", "TPU_WORKER_ID", "TPU_NAME", "TPUTORCH_JOB_NAME")},
    }
    Path(config["out"], f"rank-{record['world_rank']}.json").write_text(json.dumps(record))
    ray.train.report({"world_rank": record["world_rank"]})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--fail")
    p.add_argument("--hold-until")
    args = p.parse_args()
    if args.fail:
        raise RuntimeError(args.fail)
    if args.hold_until:
        print(f"tputorch-realray: holding until {args.hold_until} exists", flush=True)
        while not os.path.exists(args.hold_until):
            time.sleep(0.5)
        print("tputorch-realray: released", flush=True)
        return

    from ray.train import RunConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from tputorch.train import scaling_config

    scaling = scaling_config()
    print(f"tputorch-realray: {scaling}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    trainer = DataParallelTrainer(train_loop, train_loop_config={"out": args.out}, scaling_config=scaling,
                                  run_config=RunConfig(storage_path=str(Path(args.out).parent / "storage"),
                                                       name=os.environ.get("TPUTORCH_JOB_NAME", "job")))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    print(f"tputorch-realray: {scaling.num_workers} workers done", flush=True)


if __name__ == "__main__":
    main()
