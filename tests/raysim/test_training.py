"""The examples train for real: each script's own training function runs under Ray Train's
TorchTrainer, on CPU (``--cpu``: gloo, a CPU ScalingConfig with the slice's worker count), on the
simulated slice of its rendered TPUTorchJob; then what a user would check is checked: the loss
goes down, every rank took part, the sharding is what the script intends, a checkpoint lands in
the storage path and a second run resumes from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.train import Checkpoint

import examplerun
import slicesim
from tputorch import render, train
from tputorch.api import spec

pytestmark = pytest.mark.ray
torch = pytest.importorskip("torch", reason="the training tests need torch (pip install -e '.[torch]')")

# Small models and few steps: 2 cores run up to 16 worker processes.
SMALL = {
    "ddp": ["--hidden", "32", "--batch-size", "32", "--lr", "0.01"],
    "fsdp": ["--vocab", "64", "--d-model", "32", "--heads", "2", "--layers", "2", "--seq-len", "16",
             "--batch-size", "8", "--lr", "0.01"],
    # tp 2 on 4 workers: a 2 x 2 mesh, so both the tensor-parallel and the data-parallel dimension act
    "dtensor": ["--vocab", "64", "--d-model", "32", "--layers", "2", "--seq-len", "16", "--batch-size", "8",
                "--lr", "0.01", "--tp", "2"],
}
STEPS = 4


def on_slice(slice_hosts, name: str, topology: str):
    """Render the example's TPUTorchJob (on ``topology``), attach its simulated slice, return the
    job's head environment and the script's arguments from its entrypoint."""
    job = spec.parse(examplerun.manifest(name, topology))
    rayjob = render.rayjob(job)
    sim = slice_hosts.attach(slicesim.slice_from_rayjob(rayjob, slice_name=f"v6e-{topology}"))
    return sim.head_env, examplerun.entrypoint_args(job)


def train_example(name, slice_hosts, tmp_path, monkeypatch, topology, epochs, run_name="run", out="records"):
    head_env, argv = on_slice(slice_hosts, name, topology)
    argv = [*argv, *SMALL[name], "--epochs", str(epochs), "--steps-per-epoch", str(STEPS),
            "--storage-path", str(tmp_path / "storage"), "--name", run_name]
    run = examplerun.run_cpu(examplerun.load(name), argv, head_env, tmp_path / out, monkeypatch)
    workers = int(head_env[train.ENV_NUM_WORKERS])
    return run, workers


def assert_every_rank_trained(run, workers):
    assert [r["rank"] for r in run.records] == list(range(workers))
    assert {r["world"] for r in run.records} == {workers}
    assert {r["torch_threads"] for r in run.records} == {1}  # Ray's OMP_NUM_THREADS for 1-CPU workers


def assert_learns_and_checkpoints(run, storage: Path, run_name: str, epochs: int):
    history = run.history()
    assert [m["epoch"] for m in history] == list(range(epochs))[-2:]
    assert [m["step"] for m in history] == [STEPS * (e + 1) for e in range(epochs)][-2:]
    assert history[-1]["loss"] < history[0]["loss"], history
    checkpoint = Path(run.result.checkpoint.path)
    assert checkpoint.parent == storage / run_name and checkpoint.is_dir(), checkpoint
    return checkpoint


def assert_resumes(run, first, epochs: int):
    """A second run of the same name and storage: it starts at the next epoch, with the weights."""
    history = run.history()
    assert history[-1]["epoch"] == epochs - 1
    assert history[-1]["step"] == STEPS * epochs  # the step count continues
    assert run.result.metrics["step"] == STEPS * epochs
    # Restored weights: the resumed epoch beats the first run's first epoch (a fresh model would not).
    assert history[-1]["loss"] < first.history()[0]["loss"]


def test_ddp_trains_checkpoints_and_resumes_on_v6e_2x2(slice_hosts, tmp_path, monkeypatch):
    first, workers = train_example("ddp", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=2)
    assert workers == 4
    assert_every_rank_trained(first, workers)
    checkpoint = assert_learns_and_checkpoints(first, tmp_path / "storage", "run", epochs=2)
    assert (checkpoint / "state.pt").is_file()
    # tputorch.train.report() stamped it with the attempt that wrote it (train.checkpoint() reads it)
    assert Checkpoint(str(checkpoint)).get_metadata()[train.STAMP_ATTEMPT] == 1
    # DDP keeps the replicas identical: every rank ends with the same weights.
    for name, entry in first.records[0]["params"].items():
        assert {r["params"][name]["local_sum"] for r in first.records} == {entry["local_sum"]}, name
        assert entry["local_shape"] == entry["shape"] and not entry["dtensor"]

    second, _ = train_example("ddp", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=3, out="records-2")
    assert_every_rank_trained(second, workers)
    assert_resumes(second, first, epochs=3)


def test_fsdp_shards_every_parameter_and_resumes_on_v6e_2x2(slice_hosts, tmp_path, monkeypatch):
    first, workers = train_example("fsdp", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=2)
    assert workers == 4
    assert_every_rank_trained(first, workers)
    checkpoint = assert_learns_and_checkpoints(first, tmp_path / "storage", "run", epochs=2)

    # fully_shard: every parameter is a DTensor sharded on dim 0 over all workers; each rank holds 1/N.
    params = first.records[0]["params"]
    assert len(params) > 10
    for name, entry in params.items():
        assert entry["dtensor"] and entry["placements"] == ["Shard(dim=0)"] and entry["mesh_size"] == workers, name
        for r in first.records:
            local = r["params"][name]["local_shape"]
            assert local == [entry["shape"][0] // workers, *entry["shape"][1:]], (name, r["rank"], local)
    # Each rank wrote its own shards into the one checkpoint.
    assert (checkpoint / ".metadata").is_file()
    assert {p.name for p in checkpoint.glob("*.distcp")} == {f"__{r}_0.distcp" for r in range(workers)}

    second, _ = train_example("fsdp", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=3, out="records-2")
    assert_every_rank_trained(second, workers)
    assert_resumes(second, first, epochs=3)


def test_dtensor_tensor_parallel_placements_and_resume_on_v6e_2x2(slice_hosts, tmp_path, monkeypatch):
    first, workers = train_example("dtensor", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=2)
    assert workers == 4
    assert_every_rank_trained(first, workers)
    assert_learns_and_checkpoints(first, tmp_path / "storage", "run", epochs=2)

    tp, dp = 2, 2
    intended = {"up.weight": ["Shard(dim=0)"], "up.bias": ["Shard(dim=0)"],
                "down.weight": ["Shard(dim=1)"], "down.bias": ["Replicate()"]}
    params = first.records[0]["params"]
    blocks = sorted({n.split(".")[1] for n in params if n.startswith("blocks.")})
    assert blocks == ["0", "1"]
    for name, entry in params.items():
        suffix = ".".join(name.split(".")[2:]) if name.startswith("blocks.") else None
        if suffix not in intended:  # embedding, layer norms, head: plain replicated tensors
            assert not entry["dtensor"], name
            continue
        assert entry["dtensor"] and entry["placements"] == intended[suffix], name
        assert entry["mesh_dims"] == ["tp"] and entry["mesh_size"] == tp, name
        placement = intended[suffix][0]
        for r in first.records:
            local = r["params"][name]["local_shape"]
            expected = list(entry["shape"])
            if placement.startswith("Shard"):
                dim = int(placement[len("Shard(dim="):-1])
                expected[dim] //= tp
            assert local == expected, (name, r["rank"], local)

    # Mesh (dp, tp), row-major: ranks 0,1 are one tp group, 2,3 the other. Within a group the
    # shards differ; across the dp rows the same shard is the same (gradients were averaged).
    for name, entry in params.items():
        sums = [r["params"][name]["local_sum"] for r in first.records]
        for t in range(tp):
            column = {round(sums[d * tp + t], 4) for d in range(dp)}
            assert len(column) == 1, (name, t, sums)
        if entry.get("placements", [""])[0].startswith("Shard"):
            assert sums[0] != sums[1], (name, sums)

    second, _ = train_example("dtensor", slice_hosts, tmp_path, monkeypatch, "2x2", epochs=3, out="records-2")
    assert_every_rank_trained(second, workers)
    assert_resumes(second, first, epochs=3)


# Last: the other tests share the 2x2 slice's nodes (conftest keeps one slice attached).
def test_ddp_trains_with_16_workers_on_v6e_4x4(slice_hosts, tmp_path, monkeypatch):
    run, workers = train_example("ddp", slice_hosts, tmp_path, monkeypatch, "4x4", epochs=2)
    assert workers == 16
    assert_every_rank_trained(run, workers)
    checkpoint = assert_learns_and_checkpoints(run, tmp_path / "storage", "run", epochs=2)
    assert (checkpoint / "state.pt").is_file()
