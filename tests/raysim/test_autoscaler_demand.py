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

import raysource
from tputorch import render
from tputorch.render.serveconfig import INGRESS_DEPLOYMENT_NAME, accelerator_resource, slice_head_resource
from tputorch.api import spec

pytestmark = pytest.mark.ray
pytest.importorskip("ray.autoscaler.v2.scheduler", reason="Ray's autoscaler v2 (pip install ray)")

from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr  # noqa: E402
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig  # noqa: E402
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest  # noqa: E402
from ray.core.generated.autoscaler_pb2 import GangResourceRequest, ResourceRequest, ResourceRequestByCount  # noqa: E402
from ray.core.generated.common_pb2 import LabelSelectorOperator  # noqa: E402
from ray.serve._private.config import ReplicaConfig  # noqa: E402

TPU_GROUP = "tpu-slice"


def service(topology: str, low: int, high: int, routing: str = "PowerOfTwo") -> spec.ServiceSpec:
    return spec.parse_service({
        "apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "ml"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": topology}, "image": "example.com/ray-vllm:2.60.0",
                 "model": {"source": "Qwen/Qwen3-0.6B"}, "replicas": {"min": low, "max": high},
                 "serve": {"routing": routing}}})


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


def schedule(svc: spec.ServiceSpec, demand: ResourceRequest | None, gangs=()):
    """Ray's autoscaler v2 on the service's rendered cluster, before any slice runs."""
    rayservice = render.rayservice(svc)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "svc", "namespace": "ml"},
               "spec": rayservice["spec"]["rayClusterConfig"]}
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(cluster))
    return ResourceDemandScheduler().schedule(SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=[ResourceRequestByCount(request=demand, count=1)] if demand is not None else [],
        gang_resource_requests=list(gangs)))


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
    monkeypatch.setattr("tputorch.render.serveconfig.autoscaler_visible_resources", lambda _svc: None)
    svc = service("2x2", 1, 3)  # rendered (and cached by render) after the patch
    reply = schedule(svc, replica_demand(deployment_options(svc, "LLMServer")))
    assert [dict(r.resources_bundle) for r in reply.infeasible_resource_requests] == [
        {"CPU": 1, "accelerator_type:TPU-V6E": 0.001}]


def test_the_scale_to_zero_ingress_is_a_replica_serve_accepts_and_asks_only_for_the_head():
    demand = replica_demand(deployment_options(service("2x2", 0, 2), INGRESS_DEPLOYMENT_NAME))
    assert dict(demand.resources_bundle) == {"node:__internal_head__": 0.001}  # no CPU: the head has none


def llm_config(svc: spec.ServiceSpec) -> dict:
    """The rendered llm_config, its request router left out (Serve imports it; it imports vLLM)."""
    import yaml

    (app,) = yaml.safe_load(render.rayservice(svc)["spec"]["serveConfigV2"])["applications"]
    (cfg,) = app["args"]["llm_configs"]
    cfg["deployment_config"].pop("request_router_config", None)
    return cfg


def gang_demand(bundles: list[dict], label_selectors: list[dict] | None = None) -> GangResourceRequest:
    """A pending placement group as GCS hands it to the autoscaler (GcsAutoscalerStateManager::
    GetPendingGangResourceRequests: one request per unplaced bundle, its label selector; a
    constraint only for STRICT_PACK / STRICT_SPREAD, so none for SPREAD). Zero quantities are left
    out: Ray's resource sets hold none."""
    gang = GangResourceRequest()
    selector = gang.bundle_selectors.add()
    for i, bundle in enumerate(bundles):
        request = selector.resource_requests.add(resources_bundle={k: v for k, v in bundle.items() if v})
        for key, value in ((label_selectors or [{}] * len(bundles))[i]).items():
            request.label_selectors.add().label_constraints.add(
                label_key=key, operator=LabelSelectorOperator.LABEL_OPERATOR_IN, label_values=[value])
    return gang


def one_busy_slice(svc: spec.ServiceSpec, node_types: dict) -> list:
    """The head and one running slice of the service whose every chip the first replica holds
    (and its worker 0's head resource): Ray's own view of the running hosts, labels and all."""
    from ray.autoscaler.v2.schema import AutoscalerInstance
    from ray.core.generated.autoscaler_pb2 import NodeState, NodeStatus
    from ray.core.generated.instance_manager_pb2 import Instance, NodeKind

    def instance(name: str, node_type: str, kind, labels: dict, held: tuple[str, ...]) -> AutoscalerInstance:
        total = dict(node_types[node_type].resources)
        if kind == NodeKind.WORKER and labels["ray.io/tpu-worker-id"] != "0":
            total.pop(slice_head_resource(svc), None)  # only worker 0 has it at run time
        available = {k: v for k, v in total.items() if k not in held}
        return AutoscalerInstance(
            im_instance=Instance(instance_id=name, instance_type=node_type, status=Instance.RAY_RUNNING,
                                 node_kind=kind, node_id=name.encode().hex()),
            ray_node=NodeState(node_id=name.encode(), ray_node_type_name=node_type, status=NodeStatus.RUNNING,
                               total_resources=total, available_resources=available, labels=labels))

    head = instance("head", "headgroup", NodeKind.HEAD, {}, ())
    slice_labels = {"ray.io/tpu-slice-name": "slice-a", "ray.io/tpu-pod-type": svc.slice.ray_pod_type,
                    "ray.io/accelerator-type": svc.slice.generation.ray_accelerator_type}
    hosts = [instance(f"slice-a-{i}", TPU_GROUP, NodeKind.WORKER, {**slice_labels, "ray.io/tpu-worker-id": str(i)},
                      ("TPU", slice_head_resource(svc))) for i in range(svc.slice.hosts)]
    return [head, *hosts]


def schedule_on_running(svc: spec.ServiceSpec, requests=(), gangs=()):
    """Ray's autoscaler v2 on the service's rendered cluster with one busy slice running."""
    rayservice = render.rayservice(svc)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "svc", "namespace": "ml"},
               "spec": rayservice["spec"]["rayClusterConfig"]}
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(cluster))
    node_types = config.get_node_type_configs()
    return ResourceDemandScheduler().schedule(SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=node_types, max_num_nodes=config.get_max_num_nodes(),
        current_instances=one_busy_slice(svc, node_types),
        resource_requests=[ResourceRequestByCount(request=r, count=1) for r in requests],
        gang_resource_requests=list(gangs)))


def slices_added(svc: spec.ServiceSpec, hosts: int) -> int:
    """What Ray 2.60's KubeRay provider (the autoscaler's cloud provider in the head pod) writes
    into the RayCluster for ``hosts`` new hosts of the group, with one slice running: the slices
    it adds (KubeRayProvider.launch: replicas = (running + new hosts) // numOfHosts)."""
    from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.cloud_provider import KubeRayProvider

    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "svc", "namespace": "ml"},
               "spec": render.rayservice(svc)["spec"]["rayClusterConfig"]}
    running = {"containerStatuses": [{"state": {"running": {}}}]}

    def pod(name: str, kind: str, group: str) -> dict:
        return {"metadata": {"name": name, "labels": {"ray.io/node-type": kind, "ray.io/group": group}},
                "status": running}

    pods = [pod("svc-head", "head", "headgroup")] + [
        pod(f"svc-{TPU_GROUP}-a-{i}", "worker", TPU_GROUP) for i in range(svc.slice.hosts)]
    patches: list = []

    class ApiServer:  # the Kubernetes API as the provider reads and patches it
        def get(self, path):
            return cluster if path.startswith("rayclusters/") else {"metadata": {"resourceVersion": "1"}, "items": pods}

        def patch(self, path, payload):
            patches.extend(payload)
            return cluster

    provider = KubeRayProvider("svc", {"namespace": "ml"}, gcs_client=None, k8s_api_client=ApiServer())
    provider.launch({TPU_GROUP: hosts}, "launch-1")
    assert not provider.poll_errors()
    replicas = [op["value"] for op in patches if op["path"].endswith("/replicas")]
    return (replicas[-1] if replicas else cluster["spec"]["workerGroupSpecs"][0]["replicas"]) - 1


def test_a_new_multi_host_replica_brings_a_whole_slice():
    """Issue 56: the reference shape (v6e 4x4, 4 hosts) with one busy slice and a second replica
    wanted. Its placement group as Serve creates it from the rendered serve config (Ray's own
    get_deployment_options: 4 bundles of 4 TPU, the replica merged into bundle 0 with the slice's
    head resource, SPREAD) is pending as one gang: the autoscaler plans 4 hosts in one pass and
    the KubeRay provider makes them one more slice."""
    svc = service("4x4", 1, 3)
    options = raysource.deployment_options(llm_config(svc))
    bundles = options["placement_group_bundles"]
    assert options["placement_group_strategy"] == "SPREAD"
    assert [b["TPU"] for b in bundles] == [4, 4, 4, 4] and bundles[0]["TPU-v6e-16-head"] == 1
    # Serve accepts it: the replica's own resources fit in bundle 0, where Serve starts it.
    ReplicaConfig.create(lambda: None, ray_actor_options=dict(options["ray_actor_options"]),
                         placement_group_bundles=bundles, placement_group_strategy="SPREAD")
    reply = schedule_on_running(svc, gangs=[gang_demand(bundles)])
    assert not reply.infeasible_gang_resource_requests
    assert launched(reply) == {TPU_GROUP: 4}
    assert slices_added(svc, 4) == 1


def test_a_multi_host_slice_comes_back_from_zero():
    """Scale to zero on the multi-host shape: with no slice, the first request's replica brings one."""
    svc = service("4x4", 0, 2)
    bundles = raysource.deployment_options(llm_config(svc))["placement_group_bundles"]
    reply = schedule(svc, None, gangs=[gang_demand(bundles)])
    assert not reply.infeasible_gang_resource_requests
    assert launched(reply) == {TPU_GROUP: 4}


def test_what_the_operator_rendered_before_never_adds_a_slice():
    """Before issue 56: the replica pinned by ray.io/tpu-worker-id (a label only a running host
    has) and Serve LLM's topology path, whose replica reserves a slice through
    reserve_tpu_slice (ray/_private/accelerators/tpu.py: one bundle of TPU-<pod type>-head with a
    worker-0 and pod-type label selector). The replica itself fits on the running worker 0; its
    reservation matches no node type (no planned host has those labels): 0 hosts, 0 slices, and
    Serve's replica waits for ever. Even a plain one-host demand adds no slice of 4 hosts."""
    from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology

    svc = service("4x4", 1, 3)
    pod_type = infer_tpu_pod_type_from_topology(svc.slice.topology, svc.slice.generation.ray_accelerator_type)
    pinned = replica_demand({"resources": {accelerator_resource(svc): 0.001},
                             "label_selector": {"ray.io/tpu-worker-id": "0"}})
    reservation = gang_demand([{f"TPU-{pod_type}-head": 1}],
                              [{"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type}])
    reply = schedule_on_running(svc, requests=[pinned], gangs=[reservation])
    assert launched(reply) == {}
    assert len(reply.infeasible_gang_resource_requests) == 1
    assert slices_added(svc, 1) == 0 and slices_added(svc, 3) == 0


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


@pytest.mark.parametrize("topology", ["2x2", "4x4"])
def test_a_prefix_routed_services_slices_take_its_replicas_but_never_a_cpu_actor(topology):
    """PrefixAware (issue 56): the TPU hosts' node type has no CPU, so Ray's autoscaler never adds a
    slice for a CPU demand such as Ray Serve LLM's prefix-tree actor (1 CPU to be scheduled), which
    only the head can take (with Serve's own routing, which leaves the hosts their CPUs, such a
    demand launches a whole slice); the LLM replica, which asks no CPU, still gets a slice."""
    tree = ResourceRequest(resources_bundle={"CPU": 1})
    routed = service(topology, 0, 2, routing="PrefixAware")
    assert "tpu-slice" not in launched(schedule(routed, tree))
    assert launched(schedule(service(topology, 0, 2), tree)) == {"tpu-slice": 1}
    assert deployment_options(routed, "LLMServer")["num_cpus"] == 0
    if topology == "2x2":  # the single-host replica is one actor (the multi-host one a gang: above)
        reply = schedule(routed, replica_demand(deployment_options(routed, "LLMServer")))
        assert launched(reply) == {"tpu-slice": 1} and not reply.infeasible_resource_requests, reply
