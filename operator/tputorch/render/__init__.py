"""JobSpec -> KubeRay RayJob, ServiceSpec -> KubeRay RayService. Pure and deterministic.

Decisions live here; the objects' shapes live in templates/ (the RayCluster both kinds run on is
one macro, templates/_cluster.json.j2).
"""

from __future__ import annotations

import hashlib
import json
import math
import weakref
from dataclasses import dataclass
from functools import lru_cache

import jinja2
import yaml

from ..api import storage, topology
from ..api.network import Peer, ServeService
from .. import timestamps, train
from ..api.service import cache_env
from ..api.spec import HF_TOKEN_ENV, SERVICE_DEFAULTS, FieldError, InvalidSpec, JobSpec, ServiceSpec
from . import groups as _groups

MANAGED_BY = "tputorch-operator"
JOB_LABEL = "tputorch.io/job"
SERVICE_LABEL = "tputorch.io/service"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Kueue's labels on the child: the LocalQueue and the WorkloadPriorityClass. They come from the spec
# alone (spec.queueName, spec.priorityClassName): one from metadata.labels would let a user pick any
# queue or cluster-wide priority past the spec's rules.
KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"
QUEUE_LABEL = KUEUE_LABEL_PREFIX + "queue-name"
PRIORITY_CLASS_LABEL = KUEUE_LABEL_PREFIX + "priority-class"
# The labels of metadata.labels that pass on to the child: the user's own (no prefix) and these.
# A prefixed label is some controller's interface (Kueue's queue and priority class, ...): set on
# the child it would act for the user beyond what the spec allows, so it stays on the object.
PASSED_LABELS = frozenset({
    "app.kubernetes.io/part-of", "app.kubernetes.io/component", "app.kubernetes.io/version",
    "app.kubernetes.io/instance",
})
SPEC_HASH_ANNOTATION = "tputorch.io/spec-hash"
# KubeRay 1.5: a RayService not Ready this long after creation is failed for good and its RayClusters
# deleted (Ready=False, reason InitializingTimeout).
INITIALIZING_TIMEOUT_ANNOTATION = "ray.io/initializing-timeout"
# The annotations the operator writes on a RayService (a RayJob gets none but its stamp, render/stamp.py).
RAYSERVICE_ANNOTATIONS = (SPEC_HASH_ANNOTATION, INITIALIZING_TIMEOUT_ANNOTATION)
WORKER_GROUP = "tpu-slice"
SERVE_APP = "llm"  # the one Serve application of a service (KubeRay reports it under this name)
SERVE_PORT = 8000
# Ray's token authentication on every cluster (KubeRay 1.6 `authOptions`): KubeRay starts every Ray
# container, the submitter and its own dashboard calls with the token of the cluster's Secret. A
# service's Secret is KubeRay's own (one per RayCluster, owned by it). A job's is the operator's,
# which needs the token for its progress reads: named on the RayJob when it is created
# (with_ray_token_secret), made right after it and owned by it (ray_token_secret), so it outlives
# the RayJob's deletion, whose finalizer still calls the head. A head without auth runs whatever
# reaches its ports with the pods' ServiceAccount, Workload Identity and Secrets.
RAY_AUTH = {"mode": "token"}
RAY_AUTH_TOKEN_KEY = "auth_token"  # the Secret's key KubeRay reads


def ray_token_secret_name(rayjob: dict) -> str | None:
    """The Secret a RayJob's cluster takes its token from, when the operator named one."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    return (cluster.get("authOptions") or {}).get("secretName")


def new_ray_token_secret_name(rayjob_name: str, suffix: str) -> str:
    """A name of one RayJob's alone (the suffix is random): never one a deleted RayJob still holds."""
    return f"{rayjob_name}-ray-token-{suffix}"


def is_ray_token_secret_of(rayjob: dict, secret_name: str | None) -> bool:
    """The name is one the operator gives this RayJob's token Secret (not any Secret of the namespace)."""
    return bool(secret_name) and secret_name.startswith(new_ray_token_secret_name(rayjob["metadata"]["name"], ""))


def with_ray_token_secret(rayjob: dict, secret_name: str) -> None:
    rayjob["spec"]["rayClusterSpec"]["authOptions"] = {**RAY_AUTH, "secretName": secret_name}


def ray_token_secret(rayjob: dict, token: str) -> dict:
    """The Secret with a RayJob's token, owned by the RayJob (deleted after it, not before)."""
    meta = rayjob["metadata"]
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": ray_token_secret_name(rayjob), "namespace": meta["namespace"],
                     "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in (JOB_LABEL, MANAGED_BY_LABEL)},
                     "ownerReferences": [{"apiVersion": rayjob.get("apiVersion", "ray.io/v1"), "kind": "RayJob",
                                          "name": meta["name"], "uid": meta["uid"]}]},
        "stringData": {RAY_AUTH_TOKEN_KEY: token},
    }


TPU_TOLERATION = {"key": topology.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": topology.GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
HEAD_PORTS = [
    {"name": "gcs-server", "containerPort": 6379},
    {"name": "dashboard", "containerPort": 8265},
    {"name": "client", "containerPort": 10001},
]
# KubeRay's serve Service targets the head's port named "serve".
SERVICE_HEAD_PORTS = HEAD_PORTS + [{"name": "serve", "containerPort": SERVE_PORT}]

Spec = JobSpec | ServiceSpec
# etcd keeps objects up to 1.5 MiB; a child also gets KubeRay's status and managedFields, so its spec
# as rendered must leave room for them. Over this it could never be created: refused as invalid.
MAX_CHILD_BYTES = 1024 * 1024


@lru_cache(maxsize=None)
def _template(name: str) -> jinja2.Template:
    return _environment().get_template(name)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tputorch.render", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty string
        autoescape=False,
        auto_reload=False,  # templates ship with the package: no stat() of the macro file per render
        keep_trailing_newline=True,
    )
    # Plain JSON for tojson: Jinja's default also HTML-escapes <>&' (useless here, the output is
    # parsed by json.loads at once) and was half of the rendering time.
    env.filters["tojson"] = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode
    return env


def slice_env(job: JobSpec) -> list[dict]:
    """The environment that hands the Ray Train shape to the user's script (read by train.py)."""
    s = job.slice
    return [
        {"name": train.ENV_JOB_NAME, "value": job.name},
        {"name": train.ENV_NUM_WORKERS, "value": str(job.workers)},
        {"name": train.ENV_TOPOLOGY, "value": s.topology},
        {"name": train.ENV_ACCELERATOR_TYPE, "value": s.generation.ray_accelerator_type},
        {"name": train.ENV_CHIPS_PER_WORKER, "value": str(job.chips_per_worker)},
        {"name": train.ENV_NUM_HOSTS, "value": str(s.hosts)},
        {"name": train.ENV_CHIPS_PER_HOST, "value": str(s.chips_per_host)},
        {"name": train.ENV_RUN_NAME, "value": job.run_name},
        {"name": train.ENV_WORKER_RETRIES, "value": str(job.worker_retries)},
    ] + ([{"name": train.ENV_STORAGE_PATH, "value": job.storage_path}] if job.storage_path else []) + _groups.groups_env(job)


def serving_env(svc: ServiceSpec) -> list[dict]:
    """What vLLM on a TPU slice needs in the environment of every Ray node."""
    # vllm-torchtpu 0.29 picks its executor from this on every slice, one host or many: "ray" runs
    # the engine on the slice's per-host bundles; unset, it runs inside the Serve replica's process.
    env = [{"name": "TPU_MULTIHOST_BACKEND", "value": "ray"},
           # and builds its mesh from this (the Ray executor's own table lacks some slices).
           {"name": "TORCH_TPU_TOPOLOGY", "value": topology.torch_tpu_topology(svc.slice)}]
    per_chip = topology.ray_tpu_resource_per_chip(svc.slice.generation, serving=True)
    if per_chip is not None:
        env.append({"name": topology.RAY_TPU_RESOURCE_PER_CHIP, "value": str(per_chip)})
    if svc.hf_token_secret:
        name, key = svc.hf_token_secret
        env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    if svc.cache_path:
        env += [{"name": k, "value": v} for k, v in cache_env(svc.cache_path, svc.slice).items()]
    return env


def worker_node_selector(spec: Spec) -> dict[str, str]:
    selector = dict(spec.node_selector)
    selector.update(spec.slice.node_selector)
    if spec.spot:
        selector[topology.GKE_SPOT_LABEL] = "true"
    if spec.reservation:
        selector[topology.GKE_RESERVATION_LABEL] = spec.reservation
    return selector


def pod_labels(spec: Spec) -> dict[str, str]:
    # Never app.kubernetes.io/name: KubeRay sets it to kuberay and GKE's TPU webhook looks for it.
    owner = SERVICE_LABEL if isinstance(spec, ServiceSpec) else JOB_LABEL
    return {MANAGED_BY_LABEL: MANAGED_BY, owner: spec.name}


def passed_labels(labels: dict[str, str]) -> dict[str, str]:
    """The object's labels that the child carries too (PASSED_LABELS)."""
    return {k: v for k, v in labels.items() if "/" not in k or k in PASSED_LABELS}


def kueue_labels(spec: Spec) -> dict[str, str]:
    """Kueue's labels on the child: from spec fields only, the one place they are made."""
    labels = {}
    if spec.queue_name:
        labels[QUEUE_LABEL] = spec.queue_name
    if spec.priority_class_name:
        labels[PRIORITY_CLASS_LABEL] = spec.priority_class_name
    return labels


def object_labels(spec: Spec) -> dict[str, str]:
    """Labels of the RayJob / RayService: the user's that may pass, ours, and Kueue's from the spec."""
    return {**passed_labels(spec.labels), **pod_labels(spec), **kueue_labels(spec)}


def container_resources(cpu: str, memory: str, ephemeral: tuple[dict, dict], extra: dict | None = None) -> dict:
    """A Ray container's requests and limits: cpu, memory and ``extra`` both (requests = limits), and
    the ephemeral-storage storage.ephemeral_storage decided (requested alone when derived)."""
    requests, limits = ephemeral
    return {"requests": {"cpu": cpu, "memory": memory, **requests, **(extra or {})},
            "limits": {"cpu": cpu, "memory": memory, **limits, **(extra or {})}}


def _resources(spec: Spec, role: str, extra: dict | None = None) -> dict:
    r = spec.head if role == "head" else spec.worker
    disk = storage.ephemeral_storage(r.ephemeral_storage, storage.node_disk(spec.volumes, role))
    return container_resources(r.cpu, r.memory, disk, extra)


# The API token of KubeRay's autoscaler: the volume the ServiceAccount admission plugin would inject
# into every container of the head pod (token, the cluster's CA, the namespace), mounted into the
# autoscaler container alone. The Ray container beside it runs whatever a holder of the cluster's
# Ray token submits, and needs no Kubernetes API.
AUTOSCALER_TOKEN_VOLUME = "autoscaler-api-token"
AUTOSCALER_TOKEN_MOUNT = {"name": AUTOSCALER_TOKEN_VOLUME, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}


def autoscaler_token_volume() -> dict:
    return {"name": AUTOSCALER_TOKEN_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}


# An autoscaled cluster runs Ray's autoscaler v2 (KubeRay 1.4+ autoscalerOptions.version; unset, it
# is v1 whatever the Ray version): v1's KubeRay provider writes a pod count into a multi-host
# group's replicas (over-provisioning slices on scale-up), v2 counts slices (numOfHosts). A slice
# idle this long is given back: above a TPU slice's provisioning time (minutes for a multi-host
# node pool), so that a short lull does not cost a whole new provisioning.
AUTOSCALER_VERSION = "v2"
SLICE_IDLE_TIMEOUT_S = 1800
# A slice asked for and not yet running Ray (its pod Pending for capacity, or still provisioning)
# that no demand has needed this long is cancelled: Ray's default (-1) keeps it until the 60 min
# allocation timeout, and a slice that arrives after its load has gone then sits idle for
# SLICE_IDLE_TIMEOUT_S more. Long enough that a lull in a burst does not cancel a slice about to come.
PENDING_SLICE_IDLE_TIMEOUT_ENV = "RAY_AUTOSCALER_PENDING_NODE_IDLE_TIMEOUT_S"
PENDING_SLICE_IDLE_TIMEOUT_S = 600


def cluster_context(spec: Spec, env: list[dict], head_ports: list[dict], min_replicas: int = 1, max_replicas: int = 1,
                    autoscaling: bool | None = None, head_start_params: dict | None = None) -> dict:
    """The RayCluster of either kind (templates/_cluster.json.j2): one slice per worker replica."""
    autoscaling = max_replicas > min_replicas if autoscaling is None else autoscaling
    token_in_autoscaler = autoscaling and not spec.automount_service_account_token  # else pod-wide, or none
    head_storage = storage.pod_storage(spec.volumes, spec.gcs_fuse_sidecar, "head", spec.security_context,
                                       spec.head.ephemeral_storage)
    return {
        "ray_version": spec.ray_version,
        "auth_options": RAY_AUTH,
        "autoscaling": autoscaling,
        "head_start_params": {"dashboard-host": "0.0.0.0", **(head_start_params or {})},
        "security_context": spec.security_context,
        # KubeRay's autoscaler runs in the head pod and scales the RayCluster through the API: it
        # alone gets the API token (autoscaler_token), not the Ray container beside it.
        "head_automount": spec.automount_service_account_token,
        "autoscaler_options": {"securityContext": spec.security_context,
                               **({"version": AUTOSCALER_VERSION, "idleTimeoutSeconds": SLICE_IDLE_TIMEOUT_S,
                                   "env": [{"name": PENDING_SLICE_IDLE_TIMEOUT_ENV,
                                            "value": str(PENDING_SLICE_IDLE_TIMEOUT_S)}]}
                                  if autoscaling else {}),
                               **({"volumeMounts": [AUTOSCALER_TOKEN_MOUNT]} if token_in_autoscaler else {})},
        "head_volumes": head_storage["volumes"] + ([autoscaler_token_volume()] if token_in_autoscaler else []),
        "worker_automount": spec.automount_service_account_token,
        "pod_labels": pod_labels(spec),
        "service_account_name": spec.service_account_name,
        "head_node_selector": spec.head_node_selector,
        "head_tolerations": list(spec.tolerations),
        "accelerator_label": topology.GKE_ACCELERATOR_LABEL,
        "image": spec.image,
        "env": env + list(spec.env),
        "head_ports": head_ports,
        "head_resources": _resources(spec, "head"),
        "head_storage": head_storage,
        "worker_storage": storage.pod_storage(spec.volumes, spec.gcs_fuse_sidecar, "worker", spec.security_context,
                                              spec.worker.ephemeral_storage),
        "group_name": WORKER_GROUP,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "num_hosts": spec.slice.hosts,
        "worker_node_selector": worker_node_selector(spec),
        "worker_tolerations": [TPU_TOLERATION] + ([SPOT_TOLERATION] if spec.spot else []) + list(spec.tolerations),
        "worker_resources": _resources(spec, "worker", {topology.TPU_RESOURCE: str(spec.slice.chips_per_host)}),
        # spec.groups (a job's only): render/groups.py
        "groups": [],
        "train_ray_labels": None,
        "worker_ray_resources": None,
    }


def job_cluster_context(job: JobSpec) -> dict:
    """A job's RayCluster: the training slice, then its spec.groups."""
    cluster = cluster_context(job, slice_env(job), HEAD_PORTS)
    if job.groups:
        cluster.update(_groups.train_slice_extras(job))
        cluster["groups"] = _groups.group_contexts(job, cluster)
    return cluster


# KubeRay's own default for the submitter pod of K8sJobMode, which the operator writes out so that
# the pod also gets the securityContext (KubeRay's default has none: refused by `restricted`).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
SUBMITTER_CONTAINER = "ray-job-submitter"


def context(job: JobSpec) -> dict:
    return {
        "name": job.name,
        # Not the managed-by label: the submitter is no Ray node (the pods informer lists those).
        "submitter_labels": {JOB_LABEL: job.name},
        "submitter_container": SUBMITTER_CONTAINER,
        "submitter_resources": SUBMITTER_RESOURCES,
        "namespace": job.namespace,
        "rayjob_labels": object_labels(job),
        "entrypoint": job.entrypoint,
        "runtime_env_yaml": yaml.safe_dump(job.runtime_env, sort_keys=True) if job.runtime_env else "",
        "shutdown_after_job_finishes": job.shutdown_after_job_finishes,
        "ttl_seconds_after_finished": job.ttl_seconds_after_finished,
        "active_deadline_seconds": job.active_deadline_seconds,
        "backoff_limit": job.backoff_limit,
        "suspend": job.suspend,
        "cluster": job_cluster_context(job),
    }


def spec_hash(child_spec: dict) -> str:
    """A short stable hash of a rendered child's spec: equal specs, equal hashes."""
    text = json.dumps(child_spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _loaded(text: str, kind: str) -> dict:
    """The rendered child, refused (InvalidSpec) when it is larger than MAX_CHILD_BYTES."""
    size = len(text.encode())
    if size > MAX_CHILD_BYTES:
        raise InvalidSpec([FieldError(
            "spec", None, f"renders a {kind} of {size} bytes, over the {MAX_CHILD_BYTES} bytes a child may take "
            f"(Kubernetes stores objects up to 1.5 MiB): shorten spec.env, spec.runtimeEnv or the other large fields")])
    return json.loads(text)


def rayjob(job: JobSpec) -> dict:
    """The RayJob the operator creates for ``job`` (without ownerReferences, added on create).

    No spec hash: a RayJob only ever gets suspend patched, and hashing the spec would slow the
    render of every job in a burst."""
    return _loaded(_template("rayjob.json.j2").render(context(job)), "RayJob")


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
    return json.loads(_template("serveconfig.json.j2").render({
        "keep_alive_timeout_s": SERVE_KEEP_ALIVE_S,
        "app_name": SERVE_APP,
        "model_id": svc.model_name,
        "model_source": svc.model_source,
        # Ray's TPU-V6E form: Ray Serve LLM refuses v6e and TPU-V6E-16.
        "accelerator_type": svc.slice.generation.ray_accelerator_type,
        "topology": svc.slice.topology,
        "engine_kwargs": engine_kwargs(svc),
        "runtime_env": svc.runtime_env,
        "lora_config": {"dynamic_lora_loading_path": svc.lora.path,
                        "max_num_adapters_per_replica": svc.lora.max_adapters} if svc.lora else None,
        "llm_deployment_name": llm_deployment_name(svc.model_name),
        # JSON in the override's own key order (tojson would sort it): the serveConfigV2 text of a
        # service that sets ingressReplicas stays the one it had.
        "ingress_override": json.dumps(ingress) if (ingress := ingress_override(svc)) else None,
        "min_replicas": svc.min_replicas,
        "max_replicas": svc.max_replicas,
        "target_ongoing_requests": svc.target_ongoing_requests,
        "downscale_to_zero_delay_s": svc.scale_to_zero_delay_s,
        "downscale_delay_s": svc.downscale_delay_s,
        "max_ongoing_requests": svc.max_ongoing_requests,
        "health_check_period_s": svc.health_check_period_s,
        "health_check_timeout_s": svc.health_check_timeout_s,
        "graceful_shutdown_timeout_s": svc.graceful_shutdown_timeout_s,
        "request_router_class": REQUEST_ROUTERS.get(svc.routing),
        # Google's vLLM TorchTPU sample pins the LLMServer replica to a TPU host with a sliver of
        # the resource Ray gives every TPU host; without it the replica may land on the head.
        "replica_resources": {accelerator_resource(svc): 0.001},
        "replica_label_selector": replica_label_selector(svc),
    }))


def autoscaler_visible_resources(svc: ServiceSpec) -> dict[str, str] | None:
    """The worker group's Ray resources (KubeRay's group `resources`) that Ray's autoscaler must see
    to add a slice for a new replica. Its node types come from the RayCluster alone (CPU, TPU,
    memory, TPU-<pod type>-head), never from a running host, and a replica's demand for a resource
    no node type lists is infeasible: the LLMServer replica asks for accelerator_type:<type> (the
    pin in serve_config, and Serve LLM's slice bundles), which Ray gives a TPU host only once it
    runs. So an autoscaled service lists it (Ray sets the same value on the host). A service with a
    fixed count (min == max) writes nothing: its cluster is as before."""
    if not svc.autoscaling or svc.queue_name:
        return None
    return {accelerator_resource(svc): "1"}


def accelerator_resource(svc: ServiceSpec) -> str:
    """Ray's resource of every TPU host of the service's generation (accelerator_type:TPU-V6E)."""
    return f"accelerator_type:{svc.slice.generation.ray_accelerator_type}"


# Ray 2.60 Serve LLM's ingress deployment (build_openai_app's OpenAiIngress): min = max = 1 replica
# of its own. spec.serve.ingressReplicas other than 1 overrides both (ingress_override).
INGRESS_DEPLOYMENT_NAME = "OpenAiIngress"


# Scale to zero (spec.replicas.min 0): the ingress (1 CPU by default) would run on a TPU host, the
# head having num-cpus 0, and hold that slice for ever. On the head with no CPU, beside the Serve
# proxy Serve always runs there (0 CPU), it outlives the slices, takes the first request and holds
# it while Serve's LLMServer scales up from zero. node:__internal_head__ is Ray's resource of the
# head node (the one Serve pins its own controller with).
INGRESS_ON_HEAD = {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}
# Serve LLM's ingress answers 408 once a request has waited RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT (600 s
# in Ray 2.60); a request that wakes a service waits for a slice to be provisioned, the image, the
# weights and the compile (a cold XLA compile alone can take 10-30 min).
ROUTER_TIMEOUT_ENV = "RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT"
SCALE_FROM_ZERO_TIMEOUT_S = 1800


def ingress_override(svc: ServiceSpec) -> dict | None:
    """The OpenAiIngress deployments override: its replica count when spec.serve.ingressReplicas
    is not Ray's own 1, and its place on the head under scale to zero; None when neither applies,
    so a service that sets neither keeps the Serve config it had."""
    scales_to_zero = svc.min_replicas == 0
    if not scales_to_zero and svc.ingress_replicas == SERVICE_DEFAULTS["serve.ingressReplicas"]:
        return None
    count = svc.ingress_replicas
    override = {"name": INGRESS_DEPLOYMENT_NAME, "autoscaling_config": {"min_replicas": count, "max_replicas": count}}
    if scales_to_zero:
        override["ray_actor_options"] = {**INGRESS_ON_HEAD, "runtime_env": {
            "env_vars": {ROUTER_TIMEOUT_ENV: str(SCALE_FROM_ZERO_TIMEOUT_S)}}}
    return override


def llm_deployment_name(model_id: str) -> str:
    """The name Ray 2.60 Serve LLM's build_openai_app gives the model's LLMServer deployment (the
    class name, then the model id with '/' and '.' replaced), which a Serve config's deployments
    override must name: Serve refuses an override of a deployment the application does not have."""
    return "LLMServer:" + model_id.replace("/", "--").replace(".", "_")


# Ray's node label of a TPU host's index in its slice (from the GKE webhook's TPU_WORKER_ID).
TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"


def replica_label_selector(svc: ServiceSpec) -> dict[str, str]:
    """Where the LLMServer replica may start. On a multi-host slice Ray 2.60 Serve LLM defers the
    slice's placement group to the replica, which first reserves the slice through its worker 0
    (ray.util.tpu.reserve_tpu_slice: a placement group on TPU-<pod type>-head, a resource only
    worker 0 has) and gives up after DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S (100 s), failing the
    replica's start. A replica free to start on whichever host joins first may wait out those
    100 s for a slow worker 0, and Serve fails the deployment after three such starts. On worker 0
    itself the replica starts only once the head resource it reserves is there. The rest of the
    slice is then waited for by vLLM's engine start (RAYLLM_ENGINE_START_TIMEOUT_S, 1 h)."""
    return {TPU_WORKER_ID_LABEL: "0"} if svc.slice.hosts > 1 else {}


def rayservice_annotations(svc: ServiceSpec) -> dict[str, str]:
    """The RayService's annotations other than our spec hash. A queued service is created without
    the initializing timeout: admitted_timeout_patch gives it one once Kueue admits it."""
    if not svc.initializing_timeout_s or svc.queue_name:
        return {}
    return {INITIALIZING_TIMEOUT_ANNOTATION: f"{svc.initializing_timeout_s}s"}


def admitted_timeout_patch(svc: ServiceSpec, observed: dict, admission) -> dict | None:
    """The merge patch that gives a queued RayService (``svc.queue_name``) the initializing
    timeout it should have now, or None when it has it. ``admission`` is its kueue.Admission
    (None: Kueue does not manage it, so nothing holds it back).

    KubeRay 1.6.1+ counts the timeout from its Ready condition's lastTransitionTime with reason
    Initializing, which it sets in its first reconcile (at creation) and checks every reconcile,
    suspended or not (rayservice_controller.go markFailedOnInitializingTimeout): a service that
    waited in Kueue's queue longer than the timeout would be failed in the queue, terminally. So
    a queued service has no timeout while Kueue holds it, and once admitted the time it waited
    (admission - that lastTransitionTime) plus spec.serve.initializingTimeoutSeconds."""
    if not svc.queue_name or not svc.initializing_timeout_s:
        return None
    have = (((observed.get("metadata") or {}).get("annotations")) or {}).get(INITIALIZING_TIMEOUT_ANNOTATION)
    st = observed.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"), {})
    admitted_at = timestamps.seconds(admission.admitted_at) if admission is not None else None
    if admission is None:
        want = f"{svc.initializing_timeout_s}s"
    elif not admission.admitted:
        want = None  # held back by Kueue (queued, or preempted before it was ever ready)
    elif ready.get("reason") not in (None, "Initializing") or admitted_at is None:
        return None  # it was ready once (KubeRay times out only an initializing service), or unknown
    else:
        since = timestamps.seconds(ready.get("lastTransitionTime"))  # None: no wait known, count none
        waited = 0 if since is None else max(0, math.ceil(admitted_at - since))
        want = f"{waited + svc.initializing_timeout_s}s"
    if have == want:
        return None
    return {"metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: want}}}


def rayservice_hash(obj: dict) -> str:
    """The hash a RayService carries: its spec and the annotations we write besides the hash."""
    annotations = {k: v for k, v in ((obj.get("metadata") or {}).get("annotations") or {}).items()
                   if k != SPEC_HASH_ANNOTATION}
    return spec_hash({"annotations": annotations, "spec": obj.get("spec") or {}})


def serve_service(svc: ServiceSpec) -> dict | None:
    """The RayService's serveService (KubeRay's Service <name>-serve-svc in front of the Serve port)
    from spec.exposure.serveService; None for the default ClusterIP, which KubeRay makes unasked.
    KubeRay sets the name, selector, labels and serve port itself; the ports and their node ports stay
    KubeRay's at every cluster switch, as does the load balancer's address."""
    wanted = svc.exposure.serve_service
    if wanted == ServeService():
        return None
    spec = {"type": wanted.type}
    if wanted.source_ranges:
        spec["loadBalancerSourceRanges"] = list(wanted.source_ranges)
    metadata = {"labels": pod_labels(svc)}
    if wanted.annotations:
        metadata["annotations"] = dict(wanted.annotations)
    return {"metadata": metadata, "spec": spec}


# Each spec object's RayService, rendered once (as JSON text: every caller gets a copy of its own)
# and dropped with the spec. A service's reconcile reads it twice (the patch its live RayService
# takes, the spec hash its status compares), and the controller's parse cache keeps one spec
# object per version of the object, so a version is rendered once, not twice per reconcile.
_RAYSERVICES: dict[int, str] = {}


def rayservice(svc: ServiceSpec) -> dict:
    """The RayService the operator creates for ``svc`` (without ownerReferences, added on create)."""
    text = _RAYSERVICES.get(id(svc))
    if text is None:
        text = json.dumps(_rayservice(svc))
        _RAYSERVICES[id(svc)] = text
        weakref.finalize(svc, _RAYSERVICES.pop, id(svc), None)  # before its id can be another's
    return json.loads(text)


def rayservice_spec_hash(svc: ServiceSpec) -> str:
    """The spec hash the RayService ``svc`` renders carries: a live one is up to date when it has it."""
    return rayservice(svc)["metadata"]["annotations"][SPEC_HASH_ANNOTATION]


def _rayservice(svc: ServiceSpec) -> dict:
    obj = _loaded(_template("rayservice.json.j2").render({
        "name": svc.name,
        "namespace": svc.namespace,
        "rayservice_labels": object_labels(svc),
        "annotations": rayservice_annotations(svc),
        "upgrade_strategy": svc.upgrade_strategy,
        "serve_service": serve_service(svc),
        "cluster_deletion_delay_s": svc.cluster_deletion_delay_s,
        "serve_config_v2": yaml.safe_dump(serve_config(svc), sort_keys=False, default_flow_style=False),
        # Autoscaling always on: KubeRay's cluster hash leaves out replicas/min/max but not
        # enableInTreeAutoscaling, so a replicas edit from {1,1} to {1,3} would otherwise start a
        # whole second cluster (a second slice) under the NewCluster upgrade.
        # Except under Kueue: its RayService webhook refuses Ray's autoscaler (a queued service has a
        # fixed number of slices, spec rule).
        # num-cpus 0 on the head (as Google's sample): no Serve replica or vLLM worker is placed on it.
        "cluster": {**cluster_context(svc, serving_env(svc), SERVICE_HEAD_PORTS, svc.min_replicas, svc.max_replicas,
                                      autoscaling=not svc.queue_name, head_start_params={"num-cpus": "0"}),
                    "worker_ray_resources": autoscaler_visible_resources(svc)},
    }), "RayService")
    obj["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(obj)
    return obj


DASHBOARD_PORT = 8265
METRICS_PORT = 8080  # Ray's metrics export port (KubeRay's "metrics" port; vLLM's series are there too)
# The NetworkPolicy of a job and of a service: names that never meet (neither suffix ends the other),
# so that a job and a service of the same name each keep their own.
JOB_NETWORK_POLICY_SUFFIX = "-rayjob"
SERVICE_NETWORK_POLICY_SUFFIX = "-ray"


@dataclass(frozen=True)
class NetworkPolicyConfig:
    """The operator's choice of sources for every Ray cluster's NetworkPolicy (tputorch run's
    --network-policy-* flags, the chart's networkPolicy values)."""

    mode: str = "open"  # network.POLICY_MODES
    peers: tuple[Peer, ...] = ()  # KubeRay's and the operator's: the dashboard (strict) and a service's Serve port
    metrics: tuple[Peer, ...] = ()  # metric scrapers: Ray's metrics port

    def admits_everyone_to_dashboard(self) -> bool:
        return self.mode != "strict"


def network_policy_name(spec: Spec) -> str:
    suffix = SERVICE_NETWORK_POLICY_SUFFIX if isinstance(spec, ServiceSpec) else JOB_NETWORK_POLICY_SUFFIX
    return spec.name + suffix


def _port_rule(ports: list[int], peers: tuple[Peer, ...] | None) -> dict:
    """Ingress on ``ports`` from ``peers`` (None: from any source)."""
    rule = {"ports": [{"protocol": "TCP", "port": n} for n in ports]}
    return rule if peers is None else {"from": [p.selector() for p in peers], **rule}


def network_policy(spec: Spec, config: NetworkPolicyConfig) -> dict:
    """The NetworkPolicy of a Ray cluster. Its own pods (head, TPU hosts, KubeRay's submitter) reach
    every port: Ray's GCS, client, dashboard agent, raylet, object-manager and multi-slice ports take
    work from whoever reaches them, so nobody else does. The dashboard (8265) from any source in open
    mode (Ray token auth refuses every call without the cluster's token, and where GKE's hosted
    KubeRay calls from is not documented), else from ``config.peers`` only; a service's Serve port
    per its spec.exposure and from the peers (KubeRay reads Serve's health); the metrics port from
    ``config.metrics``."""
    serving = isinstance(spec, ServiceSpec)
    owner = SERVICE_LABEL if serving else JOB_LABEL
    own = {"podSelector": {"matchLabels": {owner: spec.name}}}
    ingress = [{"from": [own]}]
    if config.admits_everyone_to_dashboard():
        ingress.append(_port_rule([DASHBOARD_PORT], None))
    if config.peers:
        ports = ([] if config.admits_everyone_to_dashboard() else [DASHBOARD_PORT]) + ([SERVE_PORT] if serving else [])
        if ports:
            ingress.append(_port_rule(ports, config.peers))
    if config.metrics:
        ingress.append(_port_rule([METRICS_PORT], config.metrics))
    if serving:
        exposure = spec.exposure
        if exposure.clients == "Anywhere":
            ingress.append(_port_rule([SERVE_PORT], None))
        elif exposure.clients == "InNamespace":
            ingress.append(_port_rule([SERVE_PORT], (Peer(),)))  # every pod of the service's namespace
        else:
            ingress.append(_port_rule([SERVE_PORT], exposure.peers))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": network_policy_name(spec), "namespace": spec.namespace,
                     "labels": pod_labels(spec)},
        "spec": {"podSelector": {"matchLabels": {owner: spec.name}}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _replacing(observed: object, desired: object) -> object:
    """Merge patch that makes ``observed`` equal ``desired``: desired whole, and null for every
    key (at any depth of nested objects) that observed has and desired does not."""
    if not isinstance(desired, dict) or not isinstance(observed, dict):
        return desired
    patch = {k: _replacing(observed.get(k), v) for k, v in desired.items()}
    patch.update({k: None for k in observed if k not in desired})
    return patch


# Keys of the head's pod spec the cluster template writes only when set (the worker group is in a
# list, which a merge patch replaces whole).
_OPTIONAL_HEAD_KEYS = ("serviceAccountName", "nodeSelector", "tolerations", "volumes")


def raycluster_bounds_patch(svc: ServiceSpec, cluster: dict) -> list | None:
    """The JSON patch that gives a RayService's running RayCluster the worker bounds ``svc`` asks
    for, or None when it has them. KubeRay's cluster hash leaves out replicas and min/max
    (kuberay#2331, #4568), so a spec.replicas edit reaches the RayService but never its RayCluster,
    whose bounds the Ray autoscaler reads. Each changed group is tested by name and the cluster by
    uid: a patch never lands on a group list or a cluster other than the one read."""
    ops = []
    for i, group in enumerate((cluster.get("spec") or {}).get("workerGroupSpecs") or []):
        replicas = group.get("replicas")
        want = {"minReplicas": svc.min_replicas, "maxReplicas": svc.max_replicas,
                "replicas": min(max(replicas if isinstance(replicas, int) else svc.min_replicas, svc.min_replicas),
                                svc.max_replicas)}
        if all(group.get(k) == v for k, v in want.items()):
            continue
        ops.append({"op": "test", "path": f"/spec/workerGroupSpecs/{i}/groupName", "value": group.get("groupName")})
        ops += [{"op": "add", "path": f"/spec/workerGroupSpecs/{i}/{k}", "value": v} for k, v in want.items()]
    if not ops:
        return None
    return [{"op": "test", "path": "/metadata/uid", "value": (cluster.get("metadata") or {}).get("uid")}, *ops]


def rayservice_patch(svc: ServiceSpec, observed: dict, desired: dict | None = None) -> dict | None:
    """The merge patch that brings an observed RayService to ``desired`` (its metadata.annotations
    and spec; by default what ``svc`` renders), or None when it already is: its spec-hash
    annotation is the desired one and, when its spec is given, that spec still holds every value
    desired (an edit behind our back is put back). KubeRay then upgrades the service. Under the
    upgrade rule (render/stamp.py) ``desired`` is the RayService's own stamped rendering unless the
    spec changed.

    ``observed`` needs only metadata.annotations; its spec, when given, lets the patch also remove
    keys that no longer render. Optional keys of ours are nulled either way."""
    desired = desired or rayservice(svc)
    want = desired["metadata"]["annotations"].get(SPEC_HASH_ANNOTATION)
    have = ((observed.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    if have == want and not observed.get("spec"):
        return None
    annotations = {**desired["metadata"]["annotations"]}
    if svc.queue_name:  # a queued service's timeout is admitted_timeout_patch's
        annotations.pop(INITIALIZING_TIMEOUT_ANNOTATION, None)
    else:
        annotations.setdefault(INITIALIZING_TIMEOUT_ANNOTATION, None)
    spec = _replacing(observed.get("spec") or {}, desired["spec"])
    if svc.max_replicas > svc.min_replicas:
        # Autoscaled: keep the slice count the autoscaler reached (within the new bounds) rather
        # than reset it to min with every edit.
        observed_groups = ((observed.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
        for group, seen in zip(spec["rayClusterConfig"]["workerGroupSpecs"], observed_groups):
            if isinstance(seen.get("replicas"), int):
                group["replicas"] = min(max(seen["replicas"], svc.min_replicas), svc.max_replicas)
    # rayClusterConfig.suspend is Kueue's (its RayService integration holds a queued service there):
    # a patch that nulled it would start a service Kueue has not admitted.
    spec["rayClusterConfig"].pop("suspend", None)
    # spec.serve.clusterDeletionDelaySeconds unset: KubeRay's own 60 s again, also when observed has no spec.
    spec.setdefault("rayClusterDeletionDelaySeconds", None)
    head = spec["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    for key in _OPTIONAL_HEAD_KEYS:
        head.setdefault(key, None)
    if have == want and _holds(observed["spec"], spec):
        return None
    return {"metadata": {"annotations": annotations}, "spec": spec}


def _holds(observed: object, patch: object) -> bool:
    """``observed`` already has every value the merge patch sets. Keys the patch removes (null) or
    does not name are not looked at: KubeRay's and the API server's defaults are indistinguishable
    from an addition by hand, and correcting them would patch for ever."""
    if isinstance(patch, dict):
        if not isinstance(observed, dict):
            return all(v is None for v in patch.values())
        return all(v is None or _holds(observed.get(k), v) for k, v in patch.items())
    if isinstance(patch, list):
        return isinstance(observed, list) and len(observed) == len(patch) and all(map(_holds, observed, patch))
    return observed == patch


def render_any(spec: Spec) -> dict:
    """The child of either kind."""
    return rayservice(spec) if isinstance(spec, ServiceSpec) else rayjob(spec)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (serveConfigV2, runtimeEnvYAML) as literal blocks: readable YAML inside YAML."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    block = "\n" in value and not any(line != line.rstrip() for line in value.split("\n"))
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_Dumper.add_representer(str, _str)


def to_yaml(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
