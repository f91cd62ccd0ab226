"""Ray's own autoscaler v2 decides, from the RayCluster the operator renders for a service, whether
it can add a slice for what a new LLM replica asks: Ray's KubeRay config reader turns the rendered
cluster into node types (as KubeRay's in-tree autoscaler does in the head pod), Serve's replica
config turns the rendered deployment options into the replica's resource demand, and Ray's v2
ResourceDemandScheduler answers with slices to launch or the demand it finds infeasible.

No Ray cluster runs: these are the autoscaler's and Serve's decision functions on rendered objects.
Why it matters: the autoscaler's node types come from the RayCluster alone, never from a running
host, so a replica asking for a resource that Ray gives a TPU host only once it runs
(accelerator_type:TPU-V6E) can never bring a slice: Serve stays UPSCALING for ever.
"""

from __future__ import annotations

import pytest

from tputorch import render
from tputorch.render.serveconfig import INGRESS_DEPLOYMENT_NAME, TPU_WORKER_ID_LABEL
from tputorch.api import spec

pytestmark = pytest.mark.ray
pytest.importorskip("ray.autoscaler.v2.scheduler", reason="Ray's autoscaler v2 (pip install ray)")

from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr  # noqa: E402
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig  # noqa: E402
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest  # noqa: E402
from ray.core.generated.autoscaler_pb2 import ResourceRequest, ResourceRequestByCount  # noqa: E402
from ray.core.generated.common_pb2 import LabelSelectorOperator  # noqa: E402
from ray.serve._private.config import ReplicaConfig  # noqa: E402

TPU_GROUP = "tpu-slice"


def service(topology: str, low: int, high: int) -> spec.ServiceSpec:
    return spec.parse_service({
        "apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "ml"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": topology}, "image": "example.com/ray-vllm:2.60.0",
                 "model": {"source": "Qwen/Qwen3-0.6B"}, "replicas": {"min": low, "max": high}}})


def deployment_options(svc: spec.ServiceSpec, name: str) -> dict:
    """A deployment's ray_actor_options as Serve gets them from the rendered serveConfigV2."""
    import yaml

    (app,) = yaml.safe_load(render.rayservice(svc)["spec"]["serveConfigV2"])["applications"]
    if name == "LLMServer":
        return app["args"]["llm_configs"][0]["deployment_config"]["ray_actor_options"]
    return next(d for d in app["deployments"] if d["name"] == name)["ray_actor_options"]


def replica_demand(options: dict) -> ResourceRequest:
    """What one replica asks Ray for: Serve's own replica config (its validation, its CPU default)."""
    config = ReplicaConfig.create(lambda: None, ray_actor_options=dict(options))
    request = ResourceRequest(resources_bundle={k: v for k, v in config.resource_dict.items() if v})
    for key, value in (options.get("label_selector") or {}).items():
        request.label_selectors.add().label_constraints.add(
            label_key=key, operator=LabelSelectorOperator.LABEL_OPERATOR_IN, label_values=[value])
    return request


def schedule(svc: spec.ServiceSpec, demand: ResourceRequest):
    """Ray's autoscaler v2 on the service's rendered cluster, before any slice runs."""
    rayservice = render.rayservice(svc)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "svc", "namespace": "ml"},
               "spec": rayservice["spec"]["rayClusterConfig"]}
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(cluster))
    return ResourceDemandScheduler().schedule(SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=[ResourceRequestByCount(request=demand, count=1)]))


def launched(reply) -> dict[str, int]:
    counts: dict[str, int] = {}
    for launch in reply.to_launch:
        counts[launch.instance_type] = counts.get(launch.instance_type, 0) + launch.count
    return counts


def test_scale_to_zero_brings_a_slice_back_for_the_first_request():
    svc = service("2x2", 0, 2)
    demand = replica_demand(deployment_options(svc, "LLMServer"))
    assert dict(demand.resources_bundle) == {"CPU": 1, "accelerator_type:TPU-V6E": 0.001}
    reply = schedule(svc, demand)
    assert not reply.infeasible_resource_requests
    assert launched(reply) == {TPU_GROUP: 1}  # min 0: nothing else starts a slice


def test_an_autoscaled_service_can_be_given_a_slice_for_a_new_replica():
    """Feasible: a node type can hold the replica, so once the running slices are busy the demand
    is met with a new one (and with min 0, above, a slice is launched for it alone)."""
    svc = service("2x2", 1, 3)
    assert not schedule(svc, replica_demand(deployment_options(svc, "LLMServer"))).infeasible_resource_requests


def test_without_the_groups_resources_the_demand_is_infeasible(monkeypatch):
    """What the rendered cluster had before: the autoscaler finds no node type for the replica."""
    monkeypatch.setattr("tputorch.render.service.autoscaler_visible_resources", lambda _svc: None)
    svc = service("2x2", 1, 3)  # rendered (and cached by render) after the patch
    reply = schedule(svc, replica_demand(deployment_options(svc, "LLMServer")))
    assert [dict(r.resources_bundle) for r in reply.infeasible_resource_requests] == [
        {"CPU": 1, "accelerator_type:TPU-V6E": 0.001}]


def test_the_scale_to_zero_ingress_is_a_replica_serve_accepts_and_asks_only_for_the_head():
    demand = replica_demand(deployment_options(service("2x2", 0, 2), INGRESS_DEPLOYMENT_NAME))
    assert dict(demand.resources_bundle) == {"node:__internal_head__": 0.001}  # no CPU: the head has none


def test_a_multi_host_replica_pinned_to_worker_0_is_infeasible_for_the_autoscaler():
    """Why scale to zero is refused on a multi-host slice (and why multi-host slice autoscaling is
    not ready): the replica's worker-0 label selector names a label that only a running host has,
    and no node type lists it."""
    svc = service("4x4", 1, 2)
    options = deployment_options(svc, "LLMServer")
    assert options["label_selector"] == {TPU_WORKER_ID_LABEL: "0"}
    reply = schedule(svc, replica_demand(options))
    assert len(reply.infeasible_resource_requests) == 1
    assert launched(reply) == {TPU_GROUP: 4}  # only the min count (one 4-host slice), nothing for the demand


def test_the_real_chains_autoscaler_is_told_which_pod_each_ray_node_stands_for():
    """tests/cluster/real_autoscaler.py: the local chain's Ray nodes carry no pod name (one real head
    for every head pod; the first slice attached before its pod exists), so Ray's autoscaler is told
    it by the stand-in's probe rule. A node goes to the oldest running pod it can stand for, a
    replica's own slice to that replica's pod; a pod not running has no node."""
    import importlib.util
    import pathlib

    from ray.core.generated.autoscaler_pb2 import NodeState

    path = pathlib.Path(__file__).resolve().parents[1] / "cluster" / "real_autoscaler.py"
    spec_ = importlib.util.spec_from_file_location("real_autoscaler", path)
    real_autoscaler = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(real_autoscaler)

    def pod(name, group, created, phase="Running", worker_id=None, replica=None):
        env = [{"name": "TPU_WORKER_ID", "value": worker_id}] if worker_id is not None else []
        labels = {"ray.io/cluster": "svc", "ray.io/group": group,
                  "ray.io/node-type": "head" if group == "headgroup" else "worker"}
        if replica:
            labels["ray.io/worker-group-replica-name"] = replica
        return {"metadata": {"name": name, "labels": labels, "creationTimestamp": created},
                "spec": {"containers": [{"name": "ray-worker", "env": env}]}, "status": {"phase": phase}}

    def node(node_id, head=False, **labels):
        n = NodeState(node_id=node_id, labels=labels)
        if head:
            n.total_resources["node:__internal_head__"] = 1
        return n

    class Pods:
        def get(self, path):
            assert path == "pods?labelSelector=ray.io/cluster=svc", path
            return {"items": [
                pod("svc-head-x", "headgroup", "2026-12-06T03:00:00Z"),
                pod("svc-tpu-slice-worker-b", TPU_GROUP, "2026-12-06T03:05:00Z", worker_id="0"),
                pod("svc-tpu-slice-worker-a", TPU_GROUP, "2026-12-06T03:00:01Z", worker_id="0"),
                pod("svc-tpu-slice-worker-c", TPU_GROUP, "2026-12-06T03:05:00Z", "Pending", worker_id="0")]}

    first, added, other = b"first", b"added", b"other"
    nodes = [node(b"head", head=True), node(first, **{"ray.io/tpu-worker-id": "0"}),
             node(other, **{"ray.io/tpu-worker-id": "0", "tputorch.local/pod-replica": "svc-tpu-slice-worker-z"})]
    assert real_autoscaler._pods_as_node_ids(Pods(), "svc", nodes) == {
        b"head": ("svc-head-x", "headgroup"), first: ("svc-tpu-slice-worker-a", TPU_GROUP)}
    # Once the second pod's slice is attached, its node is that pod's; the first slice stays the first pod's.
    nodes.append(node(added, **{"ray.io/tpu-worker-id": "0", "tputorch.local/pod-replica": "svc-tpu-slice-worker-b"}))
    assert real_autoscaler._pods_as_node_ids(Pods(), "svc", nodes) == {
        b"head": ("svc-head-x", "headgroup"), first: ("svc-tpu-slice-worker-a", TPU_GROUP),
        added: ("svc-tpu-slice-worker-b", TPU_GROUP)}
