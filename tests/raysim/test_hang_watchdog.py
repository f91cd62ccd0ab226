"""The hang sentinel's watchdog in real Ray Train workers: two CPU workers of a TorchTrainer joined
by gloo, on the simulated slice of a TPUTorchJob with spec.hangDetection; at step 3 rank 1 sleeps
before the all_reduce, so rank 0 blocks inside it. Each worker's watchdog (armed by
tputorch.train.report()) prints its stacks within the (here short) timeout, in the worker's output
that Ray forwards to the job driver's log, and the operator's parser (status/hang.py) names the
blocking frames: torch's all_reduce on rank 0, the training function's sleep on rank 1.
"""

from __future__ import annotations

import glob
import json
import sys
import time
from pathlib import Path

import pytest

import slicesim
from tputorch import render, watchdog
from tputorch.api import spec
from tputorch.status import hang


pytestmark = pytest.mark.ray
torch = pytest.importorskip("torch", reason="the training tests need torch (pip install -e '.[torch]')")

TIMEOUT_S = 2  # spec.hangDetection allows 60 s at least; the contract (the env's JSON) is what runs here
SLEEP_S = 6  # rank 1's stall: past the timeout, well within gloo's own


JOB = {
    "apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob",
    "metadata": {"name": "hang", "namespace": "default", "uid": "5e1f0c2a-1111-2222-3333-444455556666"},
    "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.invalid/img:1",
             "entrypoint": "python train.py", "hangDetection": {"timeoutSeconds": 60}},
}


def train_func(config):
    import os as _os
    import time as _time

    import ray.train
    import torch as _torch
    import torch.distributed as dist

    from tputorch import train as _train

    _os.environ[config["env_name"]] = config["env_value"]  # as the operator renders it on every Ray container
    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"pid-{rank}").write_text(str(_os.getpid()))
    for step in range(1, 4):
        value = _torch.ones(1)
        if step == 3 and rank == 1:
            _time.sleep(config["sleep"])  # rank 1 stalls: rank 0 waits inside the collective
        dist.all_reduce(value)
        _train.report({"loss": 1.0 / step}, step=step)


def worker_output(pid: int, stream: str = "out") -> str:
    """What one worker process printed (stdout, or "err"), as Ray's log monitor forwards it to the
    job driver's log."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    return "".join(Path(p).read_text(errors="replace") for p in glob.glob(str(logs / f"worker-*-{pid}.{stream}")))


def test_a_rank_blocked_in_a_gloo_all_reduce_is_named_by_the_watchdog(slice_hosts, tmp_path):
    from ray.train import RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from tputorch import train
    from ray import cloudpickle

    job = spec.parse(JOB)
    sim = slice_hosts.attach(slicesim.slice_from_rayjob(render.rayjob(job), slice_name="v6e-2x2"))
    rendered = json.loads(sim.head_env[watchdog.ENV_HANG_DETECTION])
    assert rendered["timeoutSeconds"] == 60
    short = json.dumps({**rendered, "timeoutSeconds": TIMEOUT_S, "firstStepTimeoutSeconds": 30})
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    out = tmp_path / "out"
    out.mkdir()
    result = TorchTrainer(
        train_func,
        train_loop_config={"env_name": watchdog.ENV_HANG_DETECTION, "env_value": short, "out": str(out), "sleep": SLEEP_S},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=train.cpu_scaling_config(sim.head_env, num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "storage"), name="hang"),
    ).fit()
    assert result.error is None, result.error  # rank 1 woke, the collective completed, step 3 ended

    pids = {rank: int((out / f"pid-{rank}").read_text()) for rank in (0, 1)}
    found: dict[int, hang.Dump] = {}
    deadline = time.monotonic() + 10  # the worker's file is written as it prints
    while len(found) < 2 and time.monotonic() < deadline:
        found = {d.rank: d for rank, pid in pids.items() for d in hang.parse(worker_output(pid)) if d.rank == rank}
        time.sleep(0.2)
    assert set(found) == {0, 1}, {rank: worker_output(pid)[-2000:] for rank, pid in pids.items()}
    blocked, stalled = found[0], found[1]
    assert (blocked.step, stalled.step) == (2, 2)  # after step 2, no step ended in time
    assert TIMEOUT_S <= blocked.waited_s < SLEEP_S and blocked.limit_s == TIMEOUT_S
    # rank 0: inside torch's all_reduce, called from this training function
    assert blocked.frames[0].endswith(" in all_reduce") and "distributed_c10d.py" in blocked.frames[0], blocked.frames
    assert any(f.startswith(f"{__file__}:") and f.endswith(" in train_func") for f in blocked.frames), blocked.frames
    # rank 1: in the training function's sleep (time.sleep has no Python frame of its own)
    assert stalled.frames[0].startswith(f"{__file__}:") and stalled.frames[0].endswith(" in train_func"), stalled.frames
    where = hang.where(tuple(found.values()))
    assert "rank 0 (after step 2" in where and "in all_reduce" in where
    # once per rank, not again: step 3 re-arms it, then the training function returns (its thread ends)
    # while the worker lives on past the timeout, shutting down: nothing is due then
    for pid in pids.values():
        assert len([line for line in worker_output(pid).splitlines() if watchdog.HANG_MARKER in line]) == 1
    # and every thread's stack, for the user, on stderr: the training thread's with this function in it
    stacks = worker_output(pids[0], "err")
    assert "tputorch hang watchdog: rank 0: no step ended" in stacks and " (training):" in stacks, stacks[-2000:]
