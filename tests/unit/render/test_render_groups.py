"""spec.groups rendered: each group the GKE way, the Ray labels naming it, the training slice's fence,
and the group shapes a script reads back through tputorch.train."""

from __future__ import annotations

import pytest

from tputorch import render, train
from tputorch.render.cluster import TPU_TOLERATION
from tputorch.render.groups import shape
from tputorch.render.groups import shape
from tputorch.render.names import WORKER_GROUP
from tputorch.api import spec, topology

from ..jobs import body
from .test_render import CASES, container, env_of


def rendered(case: str) -> dict:
    return render.rayjob(spec.parse(body(name=case, **CASES[case])))


def groups_of(rayjob: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}


def test_without_groups_the_training_slice_is_the_only_group_and_unchanged():
    rj = render.rayjob(spec.parse(body(name="plain")))
    (group,) = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert "labels" not in group and "resources" not in group
    assert train.ENV_GROUPS not in env_of(container(group["template"]))


def test_every_groups_nodes_carry_the_ray_label_naming_it():
    for case in ("groups-tpu-tpu", "groups-tpu-gpu", "groups-tpu-cpu"):
        groups = groups_of(rendered(case))
        assert list(groups)[0] == WORKER_GROUP
        for name, g in groups.items():
            assert g["labels"] == {train.GROUP_LABEL: name}, (case, name)
            assert g["rayStartParams"] == {}  # KubeRay refuses rayStartParams['labels']: top-level labels only


def test_only_the_training_slice_has_the_fence_resource_one_per_chip():
    groups = groups_of(rendered("groups-tpu-tpu"))
    train_group = groups[WORKER_GROUP]
    assert train_group["resources"] == {train.TRAIN_RESOURCE: "4"}
    assert container(train_group["template"])["resources"]["limits"][topology.TPU_RESOURCE] == "4"
    assert all("resources" not in g for n, g in groups.items() if n != WORKER_GROUP)


def test_tpu_group_is_a_whole_slice_per_replica_on_its_own_pool():
    rollout = groups_of(rendered("groups-tpu-cpu"))["rollout"]
    assert (rollout["replicas"], rollout["minReplicas"], rollout["maxReplicas"], rollout["numOfHosts"]) == (1, 1, 1, 4)
    pod = rollout["template"]["spec"]
    assert pod["nodeSelector"] == {topology.GKE_ACCELERATOR_LABEL: "tpu-v6e-slice", topology.GKE_TOPOLOGY_LABEL: "4x4",
                                   topology.GKE_INSTANCE_TYPE_LABEL: "ct6e-standard-4t", topology.GKE_RESERVATION_LABEL: "rl-res"}
    assert TPU_TOLERATION in pod["tolerations"]
    res = container(rollout["template"])["resources"]
    assert res["requests"] == res["limits"] and res["limits"][topology.TPU_RESOURCE] == "4"


def test_gpu_group_the_gke_way():
    rj = rendered("groups-tpu-gpu")
    rollout = groups_of(rj)["rollout"]
    pod = rollout["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["serviceAccountName"] == "trainer"
    c = container(rollout["template"])
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert c["image"] == "example.com/ray-vllm-cuda:2.60.0"  # its own image; the others keep the job's
    assert (rollout["replicas"], rollout["numOfHosts"]) == (2, 1)
    assert container(groups_of(rj)["reward"]["template"])["image"] == "example.com/ray-torch-tpu:2.60.0"


def test_cpu_group_has_no_accelerator_and_keeps_the_jobs_tolerations():
    verifier = groups_of(rendered("groups-tpu-cpu"))["verifier"]
    pod = verifier["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "sandbox"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    assert container(verifier["template"])["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert verifier["replicas"] == 3


@pytest.mark.parametrize("case", ["groups-tpu-tpu", "groups-tpu-gpu", "groups-tpu-cpu"])
def test_script_reads_every_groups_shape_and_the_fenced_training_shape(case):
    rj = rendered(case)
    head_env = env_of(container(rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]))
    shapes = train.groups(head_env)
    job = spec.parse(body(name=case, **CASES[case]))
    assert list(shapes) == [g.name for g in job.groups]
    for g in job.groups:
        s = shapes[g.name]
        assert (s.kind, s.replicas, s.labels) == (g.kind, g.replicas, {train.GROUP_LABEL: g.name})
        assert s.hosts == g.replicas * g.hosts
        if g.kind == "tpu":
            assert (s.topology, s.chips_per_host, s.accelerator_type, s.pod_type) == (
                g.slice.topology, g.slice.chips_per_host, g.slice.generation.ray_accelerator_type, g.slice.ray_pod_type)
        if g.kind == "gpu":
            assert (s.gpu_type, s.gpus_per_host) == (g.gpu_type, g.gpus)
    kwargs = train.slice_shape(head_env).scaling_config_kwargs()
    assert kwargs["resources_per_worker"] == {"TPU": job.chips_per_worker, train.TRAIN_RESOURCE: job.chips_per_worker}
    # every container of the job (head, training slice, groups) gets the same environment
    envs = [env_of(container(g["template"])) for g in groups_of(rj).values()]
    assert all(e == head_env for e in envs)


@pytest.mark.parametrize("case", ["groups-tpu-tpu", "groups-tpu-gpu", "groups-tpu-cpu"])
def test_group_pods_share_the_workers_security_token_and_volumes(case):
    groups = groups_of(rendered(case))
    trainer = groups.pop(WORKER_GROUP)["template"]
    for name, g in groups.items():
        pod = g["template"]
        assert container(pod)["securityContext"] == container(trainer)["securityContext"], name
        assert pod["spec"]["automountServiceAccountToken"] == trainer["spec"]["automountServiceAccountToken"], name
        assert pod["spec"].get("volumes") == trainer["spec"].get("volumes"), name
        assert container(pod).get("volumeMounts") == container(trainer).get("volumeMounts"), name
        assert pod["metadata"].get("annotations") == trainer["metadata"].get("annotations"), name


def test_a_tpu7x_groups_pod_type_is_rays_v7x_spelling():
    # The device plugin says tpu7x-16; Ray's resources and labels say v7x-16 (TPU-v7x-16-head), and
    # the script matches on Ray's.
    group = {"name": "rollout", "tpu": {"accelerator": "tpu7x", "topology": "2x2x2"}}
    (g,) = spec.parse(body(groups=[group])).groups
    assert shape(g)["podType"] == "v7x-16" and g.slice.pod_type == "tpu7x-16"
