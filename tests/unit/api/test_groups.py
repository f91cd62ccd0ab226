"""spec.groups of a TPUTorchJob: parsed into groups, every error named (path, value, what is allowed)."""

from __future__ import annotations

import pytest

from tputorch import train
from tputorch.api import groups as groups_api
from tputorch.api import spec

from ..jobs import body


def parse(groups, **spec_overrides):
    return spec.parse(body(groups=groups, **spec_overrides))


def errors(groups, **spec_overrides) -> dict[str, str]:
    with pytest.raises(spec.InvalidSpec) as info:
        parse(groups, **spec_overrides)
    return {e.path: e.message for e in info.value.errors}


def test_no_groups_is_the_empty_tuple():
    assert spec.parse(body()).groups == ()
    assert parse([]).groups == ()


def test_three_kinds_with_their_defaults():
    job = parse([
        {"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "4x4"}, "replicas": 2},
        {"name": "gen", "gpu": {"type": "nvidia-h100-80gb", "count": 8}, "image": "cuda:1"},
        {"name": "reward"},
    ])
    rollout, gen, reward = job.groups
    assert (rollout.kind, rollout.replicas, rollout.hosts, rollout.slice.chips_per_host) == ("tpu", 2, 4, 4)
    assert rollout.image == job.image  # the job's image unless the group names its own
    assert (gen.kind, gen.gpu_type, gen.gpus, gen.image, gen.hosts) == ("gpu", "nvidia-h100-80gb", 8, "cuda:1", 1)
    assert (reward.kind, reward.replicas, reward.cpu, reward.memory) == ("cpu", 1, "8", "32Gi")


def test_every_error_is_named_at_once():
    found = errors([
        {"name": "tpu-slice"},
        {"name": "Bad_Name"},
        {"name": "a", "tpu": {"accelerator": "v6e", "topology": "3x3"}},
        {"name": "b", "gpu": {"type": "nvidia-k80", "count": 1}},
        {"name": "c", "gpu": {"type": "nvidia-h200-141gb", "count": 2}, "tpu": {"accelerator": "v6e", "topology": "2x2"}},
    ])
    assert "reserved" in found["spec.groups[0].name"]
    assert "DNS-1035" in found["spec.groups[1].name"]
    assert "allowed: 1x1, 2x2" in found["spec.groups[2].tpu.topology"]
    assert "nvidia-l4" in found["spec.groups[3].gpu.type"]  # the message lists GKE's GPU types
    assert found["spec.groups[4].gpu.count"].startswith("must be one of 8")
    assert "must not be set together" in found["spec.groups[4].gpu"]


def test_duplicate_names_unknown_fields_and_selector_labels():
    found = errors([
        {"name": "r", "colour": "red"},
        {"name": "r", "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
    ])
    assert "must be unique" in found["spec.groups[1].name"]
    assert "not a known field" in found["spec.groups[0].colour"]
    assert "derives it" in found["spec.groups[1].nodeSelector.cloud.google.com/gke-accelerator"]


def test_the_crds_own_bound_on_groups_is_not_below_the_newest_kueues_cap():
    """Kueue or not, at most MAX_GROUPS; never below what Kueue 0.19 admits (15), so that a queued job
    meets the installed Kueue's cap (controller), not a constant for an older Kueue."""
    from tputorch.api import crd

    assert groups_api.MAX_GROUPS >= groups_api.max_groups_under_kueue(18) == 15
    ok = [{"name": f"g{i}"} for i in range(groups_api.MAX_GROUPS)]
    assert len(parse(ok).groups) == groups_api.MAX_GROUPS
    found = errors(ok + [{"name": "one-too-many"}])
    assert f"at most {groups_api.MAX_GROUPS} groups" in found["spec.groups"]
    schema = crd.job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["groups"]
    assert schema["maxItems"] == groups_api.MAX_GROUPS


def podsets_of(rayjob: dict) -> int:
    """Pod sets of the Workload Kueue makes for this RayJob (its rayjob PodSets()): the head, one per
    worker group, and the submitter Job in K8sJobMode."""
    spec = rayjob["spec"]
    return 1 + len(spec["rayClusterSpec"]["workerGroupSpecs"]) + (spec.get("submissionMode") == "K8sJobMode")


@pytest.mark.parametrize("max_podsets,cap", [(8, 5), (18, 15)])  # Kueue 0.17, 0.19
def test_a_queued_jobs_groups_fit_the_kueue_caps_pod_sets_as_rendered(max_podsets, cap):
    from tputorch import render
    from tputorch.render.names import WORKER_GROUP
    from tputorch.api.job import kueue_errors

    kueue = groups_api.KueuePodSets(max_podsets, "the installed Kueue's Workload CRD")
    fits = spec.parse(body(queueName="tpu", groups=[{"name": f"g{i}"} for i in range(cap)]))
    assert podsets_of(render.rayjob(fits)) == max_podsets  # the rule counts what the operator renders
    assert kueue_errors(fits, kueue) == []
    over = spec.parse(body(queueName="tpu", groups=[{"name": f"g{i}"} for i in range(cap + 1)]))
    assert podsets_of(render.rayjob(over)) == max_podsets + 1
    (error,) = kueue_errors(over, kueue)
    assert (error.path, error.value) == ("spec.groups", f"{cap + 1} groups")
    for part in (f"at most {cap} groups while spec.queueName is set", f"at most {max_podsets} pod sets",
                 "(the installed Kueue's Workload CRD)", "the head, the submitter and the training slice take 3"):
        assert part in error.message
    # not queued, or no Kueue installed: no Kueue cap
    unqueued = spec.parse(body(groups=[{"name": f"g{i}"} for i in range(cap + 1)]))
    assert kueue_errors(unqueued, kueue) == [] and kueue_errors(over, None) == []


@pytest.mark.parametrize("gpu_type,counts", sorted(groups_api.GPU_TYPES.items()))
def test_each_gpu_type_takes_exactly_its_counts(gpu_type, counts):
    for count in (1, 2, 4, 8, 16):
        group = [{"name": "g", "gpu": {"type": gpu_type, "count": count}}]
        if count in counts:
            assert parse(group).groups[0].gpus == count
        else:
            assert "spec.groups[0].gpu.count" in errors(group)


def test_train_group_is_the_training_slices_kuberay_group():
    from tputorch import render
    from tputorch.render.names import WORKER_GROUP

    assert train.TRAIN_GROUP == WORKER_GROUP == groups_api.TRAIN_GROUP
    assert train.TRAIN_GROUP in groups_api.RESERVED_NAMES


# --- a group's pods follow the main slice's resource rules; a job's pods are bounded ------------

@pytest.mark.parametrize("field,value,fragment", [
    ("cpu", "0", "must be greater than zero"),
    ("cpu", 0, "must be greater than zero"),
    ("cpu", "0.0m", "must be greater than zero"),
    ("memory", "0", "must be greater than zero"),
    ("memory", "1.5", "must be at least 256Mi (a number without a unit is bytes"),
    ("memory", 8, "must be at least 256Mi"),
    ("memory", "255Mi", "must be at least 256Mi"),
    ("memory", "lots", "must be a Kubernetes quantity"),
])
def test_group_resources_follow_the_main_slices_rules(field, value, fragment):
    found = errors([{"name": "reward", field: value}])
    assert fragment in found[f"spec.groups[0].{field}"]
    # the same rule, the same words, as the main slice's
    with pytest.raises(spec.InvalidSpec) as info:
        spec.parse(body(worker={field: value}))
    assert {e.path: e.message for e in info.value.errors}[f"spec.worker.{field}"] == found[f"spec.groups[0].{field}"]


def test_group_resources_at_the_floor_pass():
    (group,) = parse([{"name": "reward", "cpu": "500m", "memory": "256Mi"}]).groups
    assert (group.cpu, group.memory) == ("500m", "256Mi")


def test_pods_per_job_are_bounded_and_the_bound_is_the_callers():
    # the case: 5 groups x 16 slices of the largest v5p slice (1,536 hosts each)
    big = [{"name": f"g{i}", "tpu": {"accelerator": "v5p", "topology": "16x16x24"}, "replicas": 16} for i in range(5)]
    with pytest.raises(spec.InvalidSpec) as info:
        parse(big)
    (error,) = info.value.errors
    assert error.path == "spec.groups" and error.value == f"{2 + 4 + 5 * 16 * 1536} pods"  # head, submitter, v6e 4x4: 4 hosts
    assert f"must make at most {spec.MAX_PODS_DEFAULT} pods per job" in error.message
    assert "--max-pods-per-job" in error.message and "maxPodsPerJob" in error.message
    # 2 head/submitter + 4 slice hosts + 3 CPU pods = 9
    three = [{"name": "reward", "replicas": 3}]
    assert spec.parse(body(groups=three), max_pods=9).groups
    with pytest.raises(spec.InvalidSpec) as info:
        spec.parse(body(groups=three), max_pods=8)
    assert [(e.path, e.value) for e in info.value.errors] == [("spec.groups", "9 pods")]
    # no groups: the slice alone is counted, and the error names the topology
    with pytest.raises(spec.InvalidSpec) as info:
        spec.parse(body(), max_pods=5)
    assert [(e.path, e.value) for e in info.value.errors] == [("spec.tpu.topology", "6 pods")]


def test_the_largest_slice_alone_fits_the_default_bound():
    job = spec.parse(body(tpu={"accelerator": "v5p", "topology": "16x16x24"}))
    assert 2 + job.slice.hosts <= spec.MAX_PODS_DEFAULT


@pytest.mark.parametrize("text", ["1.5", "256Mi", "500m", "8", "0.5Gi", "1E", "2Ei", "16Gi", "1k", "123456789", "512Ki"])
def test_quantity_value_agrees_with_the_kubernetes_clients_parser(text):
    from kubernetes.utils import parse_quantity

    from tputorch.api.quantity import quantity_value
    assert quantity_value(text) == parse_quantity(text)
