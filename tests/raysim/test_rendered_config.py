"""For every slice the operator supports: the rendered environment never switches chip isolation
off, and the ScalingConfig built from it asks for exactly what that slice's Ray nodes advertise.

No Ray cluster here: Ray's own classes (ScalingConfig, the TPU accelerator manager that computes a
node's resources, the topology table SlicePlacementGroup checks) decide.
"""

from __future__ import annotations

import pytest
import yaml
from ray._private.accelerators.tpu import TPUAcceleratorManager
from ray.util.tpu import get_tpu_num_slices_for_workers, get_tpu_version_from_type

from tputorch import render, train
from tputorch.api import spec, topology

pytestmark = pytest.mark.ray

ISOLATION_BREAKERS = ("RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "TPU_VISIBLE_CHIPS")

def body(accelerator: str, topology_: str, chips_per_worker: int, chips_per_host: int) -> dict:
    return {
        "apiVersion": "tputorch.io/v1alpha1",
        "kind": "TPUTorchJob",
        "metadata": {"name": "cfg", "namespace": "default"},
        "spec": {
            "tpu": {
                "accelerator": accelerator,
                "topology": topology_,
                "chipsPerWorker": chips_per_worker,
                "chipsPerHost": chips_per_host,
            },
            "image": "example.invalid/img:1",
            "entrypoint": "python train.py",
        },
    }


def supported_jobs():
    for s in topology.all_slices():
        for cpw in topology.VALID_CHIPS_PER_WORKER:
            try:
                job = spec.parse(body(s.generation.name, s.topology, cpw, s.chips_per_host))
            except spec.InvalidSpec:
                continue
            yield pytest.param(job, id=f"{s.generation.name}-{s.topology}-h{s.chips_per_host}-c{cpw}")


JOBS = list(supported_jobs())


def containers(rayjob: dict) -> list[dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def test_every_supported_slice_is_covered():
    shapes = {(p.values[0].slice.generation.name, p.values[0].slice.topology) for p in JOBS}
    assert {("v6e", "2x2"), ("v6e", "4x4"), ("v5p", "2x2x2"), ("v5e", "16x16")} <= shapes
    assert len(JOBS) > 50


@pytest.mark.parametrize("job", JOBS)
def test_rendered_job_keeps_isolation_and_matches_its_nodes(job, monkeypatch):
    rayjob = render.rayjob(job)
    for c in containers(rayjob):
        names = {e["name"] for e in c.get("env", [])}
        assert not names & set(ISOLATION_BREAKERS), c["name"]
    runtime_env = yaml.safe_load(rayjob["spec"].get("runtimeEnvYAML") or "{}")
    assert not set(runtime_env.get("env_vars", {})) & set(ISOLATION_BREAKERS)

    head_env = {e["name"]: e["value"] for e in containers(rayjob)[0]["env"] if "value" in e}
    scaling = train.scaling_config(head_env)  # Ray validates it here
    s = job.slice
    assert scaling.use_tpu and scaling.topology == s.topology
    assert scaling.num_workers == s.chips // job.chips_per_worker
    assert scaling.resources_per_worker == {"TPU": job.chips_per_worker}
    assert job.chips_per_worker <= s.chips_per_host  # a worker never spans hosts

    # The accelerator_type resource a node of this slice registers, computed by Ray from what the
    # TPU device plugin sets (TPU_ACCELERATOR_TYPE = pod type): the worker bundles ask for it.
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", s.pod_type)
    node_type = TPUAcceleratorManager.get_current_node_accelerator_type()
    assert scaling.accelerator_type == node_type, (scaling.accelerator_type, node_type)
    assert f"accelerator_type:{node_type}" in scaling._resources_per_worker_not_none

    # One slice, and a topology Ray's SlicePlacementGroup will reserve.
    assert get_tpu_num_slices_for_workers(s.topology, scaling.accelerator_type, scaling.num_workers, scaling.resources_per_worker) == 1
    version = get_tpu_version_from_type(scaling.accelerator_type)
    assert TPUAcceleratorManager.is_valid_tpu_accelerator_topology(version, s.topology)


@pytest.mark.parametrize("where", ["env", "runtimeEnv"])
@pytest.mark.parametrize("name", ISOLATION_BREAKERS)
def test_users_cannot_switch_isolation_off(where, name):
    b = body("v6e", "4x4", 1, 4)
    if where == "env":
        b["spec"]["env"] = [{"name": name, "value": "1"}]
        path = "spec.env[0].name"
    else:
        b["spec"]["runtimeEnv"] = {"env_vars": {name: "1"}}
        path = f"spec.runtimeEnv.env_vars.{name}"
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse(b)
    assert path in {e.path for e in err.value.errors}


def test_lowercase_accelerator_type_is_accepted_by_ray_but_matches_no_node(monkeypatch):
    """Why the operator writes TPU-V6E: Ray takes "v6e" without complaint, then asks for a resource
    that no v6e node has (the run in test_chip_isolation.py shows it never schedules)."""
    job = spec.parse(body("v6e", "4x4", 1, 4))
    head_env = {e["name"]: e["value"] for e in containers(render.rayjob(job))[0]["env"] if "value" in e}
    from ray.train import ScalingConfig

    wrong = ScalingConfig(**dict(train.slice_shape(head_env).scaling_config_kwargs(), accelerator_type="v6e"))
    with pytest.raises(ValueError, match="TPU-V6E"):
        train.scaling_config(head_env, accelerator_type="v6e")  # tputorch.train refuses it
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", job.slice.pod_type)
    assert TPUAcceleratorManager.get_current_node_accelerator_type() == "TPU-V6E"
    assert "accelerator_type:v6e" in wrong._resources_per_worker_not_none
    assert head_env[train.ENV_ACCELERATOR_TYPE] == "TPU-V6E"


@pytest.mark.parametrize("s", topology.all_slices(), ids=lambda s: f"{s.generation.name}-{s.topology}-h{s.chips_per_host}")
def test_every_supported_topology_is_in_rays_own_table(s):
    # Ray's SlicePlacementGroup rejects a topology missing from this table ("Invalid accelerator
    # topology"), so the trainer would fail when it reserves the slice: the operator must not offer it.
    assert TPUAcceleratorManager.is_valid_tpu_accelerator_topology(s.generation.ray_accelerator_type, s.topology)
