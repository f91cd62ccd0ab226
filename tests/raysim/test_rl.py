"""The RL example (examples/rl/grpo.py) with real Ray 2.60 on the simulated hosts of its rendered
TPUTorchJobs: the training slice, a rollout slice of the same shape (v6e 2x2 + v6e 2x2), two
simulated GPU nodes (Ray nodes with GPUs and the rollout group's labels) and a CPU node for the
reward group, all attached at once.

The example's own ``run()`` is the driver (as the Ray job's entrypoint would be), with the head
container's environment of the rendered RayJob, ``--engine torch`` (the example's small torch policy:
this venv has no vLLM; tests/serving/test_weight_sync.py runs its vLLM engine) and ``--cpu`` (gloo, CPU
tensors) on the real TPU placement: Ray Train reserves chips on the training slice (TPU_VISIBLE_CHIPS per worker), rollout
actors take their host's chips or GPUs. Every Train worker and actor records where it ran.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import ray
import yaml
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

import slicesim
from tputorch import render, train
from tputorch.api import spec

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples/rl/grpo.py"
MANIFESTS = {"tpu": ROOT / "examples/rl/tpu-tpu.yaml", "gpu": ROOT / "examples/rl/tpu-gpu.yaml"}


def rendered(which: str) -> dict:
    body = yaml.safe_load(MANIFESTS[which].read_text())
    body["metadata"]["namespace"] = "default"
    return render.rayjob(spec.parse(body))


def load_example():
    from ray import cloudpickle

    if "example_grpo" not in sys.modules:
        module_spec = importlib.util.spec_from_file_location("example_grpo", SCRIPT)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["example_grpo"] = module
        module_spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)  # workers and actors cannot import it
    return sys.modules["example_grpo"]


@pytest.fixture(scope="module")
def rl_hosts(slice_hosts):
    """Training slice, rollout slice (same shape), GPU nodes and the reward node, attached together."""
    tpu_job, gpu_job = rendered("tpu"), rendered("gpu")
    training = slicesim.slice_from_rayjob(tpu_job, slice_name="rl-train-slice")
    rollout_slice = slicesim.slice_from_rayjob(tpu_job, slice_name="rl-rollout-slice", group_name="rollout")
    gpus = slicesim.nodes_from_group(gpu_job, "rollout")
    reward = slicesim.nodes_from_group(tpu_job, "reward", cpus_per_host=2)
    assert (training.topology, training.pod_type) == (rollout_slice.topology, rollout_slice.pod_type) == ("2x2", "v6e-4")
    slice_hosts.attach(training, extra=(rollout_slice, gpus, reward))
    return {"train": training, "rollout-tpu": rollout_slice, "rollout-gpu": gpus, "reward": reward,
            "jobs": {"tpu": tpu_job, "gpu": gpu_job}}


def head_env(rayjob: dict) -> dict[str, str]:
    container = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def run_example(rl_hosts, which: str, tmp_path: Path, monkeypatch, steps: int) -> dict[str, dict]:
    module = load_example()
    for key, value in head_env(rl_hosts["jobs"][which]).items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "records"
    args = module.parse_args(["--engine", "torch", "--cpu", "--steps", str(steps), "--out", str(out),
                              "--storage-path", str(tmp_path / "storage"), "--name", f"rl-{which}"])
    result = module.run(args)
    assert result.error is None, result.error  # the driver's run ended as a Succeeded Ray job would
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def nodes(sim: slicesim.SimSlice) -> set[str]:
    return set(sim.node_ids.values())


def assert_training_on_its_slice(rl_hosts, records: dict) -> None:
    ranks = sorted((r for k, r in records.items() if k.startswith("train-rank-")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world"] for r in ranks} == {4}
    assert {r["node_id"] for r in ranks} <= nodes(rl_hosts["train"]), "a Train worker left the training slice"
    assert not {r["node_id"] for r in ranks} & nodes(rl_hosts["rollout-tpu"])
    chips = [r["TPU_VISIBLE_CHIPS"] for r in ranks]
    assert sorted(chips) == ["0", "1", "2", "3"], f"one chip of the training host per worker: {chips}"
    assert all(r["accelerators"]["TPU"] == [r["TPU_VISIBLE_CHIPS"]] for r in ranks)


def assert_weights_advanced_and_reward_rose(records: dict, steps: int, rollouts: list[dict]) -> list[float]:
    history = records["history"]
    assert history["weight_version"] == list(range(steps)), "each step's rollouts used that step's weights"
    for r in rollouts:
        assert r["versions_seen"] == list(range(steps)), r  # one new version per step, none skipped
    reward = history["reward"]
    first, last = sum(reward[:3]) / 3, sum(reward[-3:]) / 3
    assert last > first + 0.2, f"reward did not rise: {reward}"
    return reward


STEPS = 6  # the reward rises within a few steps (0.1 -> 0.6-0.9 by step 4 in runs here)
SEEN: dict[str, list[float]] = {}


def test_tpu_rollouts_on_a_slice_of_the_same_shape(rl_hosts, tmp_path, monkeypatch):
    records = run_example(rl_hosts, "tpu", tmp_path, monkeypatch, STEPS)
    assert_training_on_its_slice(rl_hosts, records)
    rollouts = [r for k, r in records.items() if k.startswith("rollout-")]
    assert len(rollouts) == 1  # one engine per host of the rollout slice
    (engine,) = rollouts
    assert engine["node_id"] in nodes(rl_hosts["rollout-tpu"]), "the rollout engine left the rollout slice"
    assert sorted(engine["accelerators"]["TPU"]) == ["0", "1", "2", "3"]  # the whole rollout host
    assert records["reward"]["node_id"] in nodes(rl_hosts["reward"])
    SEEN["tpu"] = assert_weights_advanced_and_reward_rose(records, STEPS, rollouts)


def test_gpu_rollouts_beside_tpu_training(rl_hosts, tmp_path, monkeypatch):
    records = run_example(rl_hosts, "gpu", tmp_path, monkeypatch, STEPS)
    assert_training_on_its_slice(rl_hosts, records)
    rollouts = sorted((r for k, r in records.items() if k.startswith("rollout-")), key=lambda r: r["index"])
    assert len(rollouts) == 2  # replicas: 2, one GPU each
    assert {r["node_id"] for r in rollouts} == nodes(rl_hosts["rollout-gpu"]), "one engine on each GPU node"
    for r in rollouts:
        assert r["accelerators"].get("GPU") == ["0"] and r["CUDA_VISIBLE_DEVICES"] == "0", r
    assert records["reward"]["node_id"] in nodes(rl_hosts["reward"])
    SEEN["gpu"] = assert_weights_advanced_and_reward_rose(records, STEPS, rollouts)


def test_without_the_fence_ray_train_takes_the_rollout_slice(rl_hosts, tmp_path):
    """The control for the tests above: Ray Train's own TPU placement (no fence resource) uses a
    rollout slice of the same shape as soon as the training slice is busy, so nothing but the fence
    kept the example's workers on the training slice."""
    env = head_env(rl_hosts["jobs"]["tpu"])
    unfenced = {k: v for k, v in env.items() if k != train.ENV_GROUPS}
    assert train.TRAIN_RESOURCE not in train.scaling_config(unfenced).resources_per_worker
    assert train.scaling_config(env).resources_per_worker[train.TRAIN_RESOURCE] == 1

    train_node = next(iter(nodes(rl_hosts["train"])))
    # Hold the training host's chips, as a long rollout or another job would: a placement group
    # (no worker process needed) on the training slice's label.
    busy = placement_group([{"TPU": 4}], bundle_label_selector=[{train.GROUP_LABEL: train.TRAIN_GROUP}])
    try:
        assert busy.wait(120)
        assert placement_group_table(busy)["bundles_to_node_id"][0] == train_node
        records = slicesim.run_recording_trainer(train.scaling_config(unfenced), tmp_path / "a", tmp_path / "s", "unfenced")
        assert {r["node_id"] for r in records} <= nodes(rl_hosts["rollout-tpu"]), "unfenced Train should spill"
    finally:
        remove_placement_group(busy)
