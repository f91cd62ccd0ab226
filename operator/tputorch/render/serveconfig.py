"""ServiceSpec -> Ray Serve's config (serveConfigV2, templates/serveconfig.json.j2): vLLM's engine
arguments, Serve's autoscaling, routing and ingress, and where the LLMServer replica may start."""

from __future__ import annotations

import json

from ..api import topology
from ..api.spec import ServiceSpec
from . import output
from .names import SERVE_APP

def engine_kwargs(svc: ServiceSpec) -> dict:
    """vLLM's engine arguments: the user's extra args, then the first-class fields (parse_service
    refuses args that repeat them)."""
    kwargs = dict(svc.engine_args)
    kwargs["tensor_parallel_size"] = svc.tensor_parallel_size
    kwargs["pipeline_parallel_size"] = svc.pipeline_parallel_size
    if svc.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    if svc.max_model_len is not None:
        kwargs["max_model_len"] = svc.max_model_len
    if svc.lora is not None:
        # vLLM's LoRA slots: as many as Serve keeps adapters on the replica, so none waits for a slot.
        kwargs.update(enable_lora=True, max_loras=svc.lora.max_adapters, max_lora_rank=svc.lora.max_rank)
    return kwargs


# Serve's HTTP proxy closes an idle client connection after keep_alive_timeout_s (Ray 2.60's default
# 90 s). Google's Application Load Balancers (a GKE Gateway in front of <name>-serve-svc) keep an idle
# connection to a backend for a fixed 600 s and reuse it: a backend that closes first makes the next
# request on that connection fail with a 502. Above 600 s, the load balancer always closes first.
# Serve takes it from the first config KubeRay PUTs (which starts Serve on the head).
SERVE_KEEP_ALIVE_S = 620


# spec.serve.routing -> the request router Serve loads for the LLMServer deployment (Ray 2.60's
# public import path); PowerOfTwo is Serve's default router, so nothing is written for it.
REQUEST_ROUTERS = {"PrefixAware": "ray.serve.llm.request_router:PrefixCacheAffinityRouter"}


def serve_config(svc: ServiceSpec) -> dict:
    """Ray Serve's config (serveConfigV2, before it becomes YAML) for the service's model."""
    return json.loads(output.template("serveconfig.json.j2").render({
        "keep_alive_timeout_s": SERVE_KEEP_ALIVE_S,
        "app_name": SERVE_APP,
        "model_id": svc.model_name,
        "model_source": svc.model_source,
        # Ray's TPU-V6E form: Ray Serve LLM refuses v6e and TPU-V6E-16.
        "accelerator_type": svc.slice.generation.ray_accelerator_type,
        "engine_kwargs": engine_kwargs(svc),
        "runtime_env": svc.runtime_env,
        "lora_config": {"dynamic_lora_loading_path": svc.lora.path,
                        "max_num_adapters_per_replica": svc.lora.max_adapters} if svc.lora else None,
        "llm_deployment_name": llm_deployment_name(svc.model_name),
        # JSON in the override's own key order (tojson would sort it).
        "ingress_override": json.dumps(ingress_override(svc)),
        "min_replicas": svc.min_replicas,
        "max_replicas": svc.max_replicas,
        "target_ongoing_requests": svc.target_ongoing_requests,
        "downscale_to_zero_delay_s": svc.scale_to_zero_delay_s,
        "downscale_delay_s": svc.downscale_delay_s,
        "max_ongoing_requests": svc.max_ongoing_requests,
        "health_check_period_s": svc.health_check_period_s,
        "health_check_timeout_s": svc.health_check_timeout_s,
        "graceful_shutdown_timeout_s": svc.graceful_shutdown_timeout_s,
        "request_router_config": request_router_config(svc),
        **placement_context(svc),
    }))


def placement_context(svc: ServiceSpec) -> dict:
    """replica_placement as the serve config's template takes it: the replica's pin inside its actor options."""
    placement = replica_placement(svc)
    options = replica_actor_options(svc, placement.pop("replica_resources"))
    return {**placement, "replica_actor_options": options}


def request_router_config(svc: ServiceSpec) -> dict | None:
    """The LLMServer deployment's request_router_config for PrefixAware routing (Ray 2.60's
    PrefixCacheAffinityRouter and its initialize_state kwargs), None for Serve's default router.
    Ray's own defaults ignore load (imbalanced_threshold inf: a hot
    prefix piles onto one replica while others idle) and never evict (the detached tree actor grows
    without bound). Here: a replica more than serve.targetOngoingRequests (what Serve's autoscaler
    aims at per replica) behind another makes Serve route by power of two choices instead, and
    eviction is on with Ray's own sizes (400,000 characters per replica down to 360,000, every 10 s)."""
    if svc.routing not in REQUEST_ROUTERS:
        return None
    return {"request_router_class": REQUEST_ROUTERS[svc.routing],
            "request_router_kwargs": {"imbalanced_threshold": svc.target_ongoing_requests, "do_eviction": True}}


# Ray 2.60's PrefixCacheAffinityRouter keeps its prefix tree in one detached actor
# (LlmPrefixTreeActor) that the router creates, in the ingress's process, with Ray's actor defaults:
# 1 CPU to be scheduled (none held once it runs), never restarted. Ray places it on any node with a
# CPU free, not on its caller's (measured with Ray 2.60: 5 of 15 such actors on the head from a
# caller pinned there, two 2-CPU nodes beside it). On a TPU host the tree keeps that slice from
# idling and dies with it, leaving every routed request waiting for it until the router's timeout
# (issue 56). So under PrefixAware routing the head's CPU is the only one of the cluster: the head
# gets one, the TPU hosts none (Ray num-cpus 0), and the LLMServer replica, the only Serve actor on
# a TPU host, asks none (its placement group holds the chips; vLLM's Ray workers ask none either).
HEAD_CPUS_FOR_PREFIX_TREE = "1"


def tree_on_head(svc: ServiceSpec) -> bool:
    """The service routes through Ray Serve LLM's router and its tree actor, whose only CPU is the head's."""
    return svc.routing in REQUEST_ROUTERS


def head_num_cpus(svc: ServiceSpec) -> str:
    """The head's Ray num-cpus: none (no Serve replica or vLLM worker on it, as Google's sample),
    but one for the prefix tree's actor under PrefixAware routing."""
    return HEAD_CPUS_FOR_PREFIX_TREE if tree_on_head(svc) else "0"


def tpu_host_ray_resources(svc: ServiceSpec) -> dict[str, str] | None:
    """The TPU worker group's Ray resources (KubeRay's group `resources`: it passes CPU to `ray start`
    as --num-cpus and the others as --resources, Ray's autoscaler reads them as the group's node type,
    and KubeRay refuses a group that also sets them in rayStartParams): CPU 0 under PrefixAware
    routing, so the prefix tree's actor can only be scheduled on the head (otherwise KubeRay's default,
    the container's CPUs), and what the autoscaler must see (autoscaler_visible_resources)."""
    resources = {"CPU": "0"} if tree_on_head(svc) else {}
    return {**resources, **(autoscaler_visible_resources(svc) or {})} or None


def replica_actor_options(svc: ServiceSpec, resources: dict) -> dict:
    """The LLMServer replica's ray_actor_options: its pin (``resources``), and under PrefixAware routing
    no CPU (Ray Serve LLM merges Ray's default 1 into the replica's bundle, which a TPU host without
    CPUs could never hold)."""
    return {"num_cpus": 0, "resources": resources} if tree_on_head(svc) else {"resources": resources}


def autoscaler_visible_resources(svc: ServiceSpec) -> dict[str, str] | None:
    """The worker group's Ray resources (KubeRay's group `resources`) that Ray's autoscaler must see
    to add a slice for a new replica. Its node types come from the RayCluster alone (CPU, TPU,
    memory, TPU-<pod type>-head), never from a running host, and a replica's demand for a resource
    no node type lists is infeasible: the LLMServer replica asks for accelerator_type:<type> (the
    pin in serve_config, and Serve LLM's slice bundles), which Ray gives a TPU host only once it
    runs. So an autoscaled service lists it (Ray sets the same value on the host). A service with a
    fixed count (min == max) writes nothing: its cluster is as before."""
    if not svc.autoscaling:  # queued or not: Kueue's elastic jobs autoscale too
        return None
    return {accelerator_resource(svc): "1"}


def accelerator_resource(svc: ServiceSpec) -> str:
    """Ray's resource of every TPU host of the service's generation (accelerator_type:TPU-V6E)."""
    return f"accelerator_type:{svc.slice.generation.ray_accelerator_type}"


# Ray 2.60 Serve LLM's ingress deployment (build_openai_app's OpenAiIngress): min = max = 1 replica
# of its own; ingress_override sets both to spec.serve.ingressReplicas.
INGRESS_DEPLOYMENT_NAME = "OpenAiIngress"


# The ingress (Serve LLM's OpenAiIngress, 1 CPU by default) on the head in every mode (issue 56):
# the head's num-cpus is 0, so with Ray's defaults it runs on a TPU host, which then never idles:
# under scale to zero a slice held for ever, under autoscaling every slice an ingress replica sits
# on kept after the load is gone. On the head with no CPU, beside the Serve proxy Serve always runs
# there (0 CPU), it outlives the slices, and takes the first request and holds it while Serve's
# LLMServer scales up from zero. node:__internal_head__ is Ray's resource of the head node (the one
# Serve pins its own controller with).
INGRESS_ON_HEAD = {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}
# Serve LLM's ingress answers 408 once a request has waited RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT (600 s
# in Ray 2.60); a request that wakes a service waits for a slice to be provisioned, the image, the
# weights and the compile (a cold XLA compile alone can take 10-30 min).
ROUTER_TIMEOUT_ENV = "RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT"
SCALE_FROM_ZERO_TIMEOUT_S = 1800


def ingress_override(svc: ServiceSpec) -> dict:
    """The OpenAiIngress deployments override: spec.serve.ingressReplicas replicas on the head
    (INGRESS_ON_HEAD), and under scale to zero the longer router timeout. Keys in the order a
    scale-to-zero service's override always had, so its serveConfigV2 text stays the same."""
    count = svc.ingress_replicas
    options: dict = dict(INGRESS_ON_HEAD)
    if svc.min_replicas == 0:
        options["runtime_env"] = {"env_vars": {ROUTER_TIMEOUT_ENV: str(SCALE_FROM_ZERO_TIMEOUT_S)}}
    return {"name": INGRESS_DEPLOYMENT_NAME, "autoscaling_config": {"min_replicas": count, "max_replicas": count},
            "ray_actor_options": options}


def llm_deployment_name(model_id: str) -> str:
    """The name Ray 2.60 Serve LLM's build_openai_app gives the model's LLMServer deployment (the
    class name, then the model id with '/' and '.' replaced), which a Serve config's deployments
    override must name: Serve refuses an override of a deployment the application does not have."""
    return "LLMServer:" + model_id.replace("/", "--").replace(".", "_")


def replica_placement(svc: ServiceSpec) -> dict:
    """Where Ray Serve LLM puts an LLMServer replica and its slice: the serve config's
    accelerator topology, placement_group_config and the replica actor's own resources.

    Single host: Serve LLM's TPU topology path (the replica reserves its host's slice at start),
    the replica pinned to a TPU host with a sliver of the resource Ray gives every TPU host (as
    Google's vLLM TorchTPU sample), which the autoscaler turns into one host, a whole slice.

    Multi-host (issue 56): the replica's own placement group of one bundle per host, SPREAD,
    created by Serve before the replica starts, with the replica actor merged into bundle 0 (Ray
    2.60 LLMServer.get_deployment_options) and pinned there by TPU-<pod type>-head, which only
    worker 0 of a slice has. Ray's autoscaler v2 sees the pending group's bundles in one pass and
    plans one host for each, and its KubeRay provider turns numOfHosts new hosts into one more
    slice (replicas = hosts // numOfHosts). Neither Serve LLM's topology path (reserve_tpu_slice:
    one head bundle with worker-0 labels no planned host has) nor a label of a running host
    (ray.io/tpu-worker-id) can ever add a slice (tests/raysim/test_autoscaler_demand.py)."""
    s = svc.slice
    per_host = s.chips_per_host * (topology.ray_tpu_resource_per_chip(s.generation, serving=True) or 1)
    if not s.multi_host:
        # The slice Serve LLM reserves asks 1 CPU per bundle unless its bundle names CPU (Ray 2.60
        # ray.util.tpu get_tpu_worker_resources): under PrefixAware the host has none (tpu_host_ray_resources).
        no_cpu = {"bundles": [{"TPU": per_host, "CPU": 0}]} if tree_on_head(svc) else None
        return {"topology": s.topology, "placement_group_config": no_cpu,
                "replica_resources": {accelerator_resource(svc): 0.001}}
    return {"topology": None,
            "placement_group_config": {"bundles": [{"TPU": per_host} for _ in range(s.hosts)], "strategy": "SPREAD"},
            "replica_resources": {slice_head_resource(svc): 1}}


def slice_head_resource(svc: ServiceSpec) -> str:
    """Ray's resource of a slice's worker 0 alone (TPU-v6e-16-head); the autoscaler's node types
    list it for every planned host of the group (Ray's KubeRay config reader)."""
    return f"TPU-{svc.slice.ray_pod_type}-head"
