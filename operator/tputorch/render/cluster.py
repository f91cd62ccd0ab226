"""The RayCluster both kinds run on (templates/_cluster.json.j2): head and TPU worker group, their
node selectors, tolerations, resources and volumes, and KubeRay's autoscaler."""

from __future__ import annotations

from ..api import storage, topology
from . import volumes
from .names import SERVE_PORT, WORKER_GROUP, Spec, pod_labels
from .raytoken import RAY_AUTH

TPU_TOLERATION = {"key": topology.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": topology.GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
HEAD_PORTS = [
    {"name": "gcs-server", "containerPort": 6379},
    {"name": "dashboard", "containerPort": 8265},
    {"name": "client", "containerPort": 10001},
]
# KubeRay's serve Service targets the head's port named "serve".
SERVICE_HEAD_PORTS = HEAD_PORTS + [{"name": "serve", "containerPort": SERVE_PORT}]


def worker_node_selector(spec: Spec) -> dict[str, str]:
    selector = dict(spec.node_selector)
    selector.update(spec.slice.node_selector)
    if spec.spot:
        selector[topology.GKE_SPOT_LABEL] = "true"
    if spec.reservation:
        selector[topology.GKE_RESERVATION_LABEL] = spec.reservation
    return selector


def container_resources(cpu: str, memory: str, ephemeral: tuple[dict, dict], extra: dict | None = None) -> dict:
    """A Ray container's requests and limits: cpu, memory and ``extra`` both (requests = limits), and
    the ephemeral-storage volumes.ephemeral_storage decided (requested alone when derived)."""
    requests, limits = ephemeral
    return {"requests": {"cpu": cpu, "memory": memory, **requests, **(extra or {})},
            "limits": {"cpu": cpu, "memory": memory, **limits, **(extra or {})}}


def _resources(spec: Spec, role: str, extra: dict | None = None) -> dict:
    r = spec.head if role == "head" else spec.worker
    disk = volumes.ephemeral_storage(r.ephemeral_storage, storage.node_disk(spec.volumes, role))
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
# Every host of a new slice must be launched in one pass: Ray's KubeRay provider adds
# (hosts asked for) // numOfHosts slices per launch, so a slice split over passes is never added.
# "Default" lets a pass launch as many hosts as the demand needs (Ray's upscaling speed 1000;
# "Conservative" allows one host while none runs), and Ray caps a pass at
# AUTOSCALER_MAX_CONCURRENT_LAUNCHES hosts (10): raised to numOfHosts for larger slices.
UPSCALING_MODE = "Default"
MAX_CONCURRENT_LAUNCHES_ENV = "AUTOSCALER_MAX_CONCURRENT_LAUNCHES"
RAY_MAX_CONCURRENT_LAUNCHES = 10


def autoscaler_env(hosts: int) -> list[dict]:
    """The autoscaler container's environment (autoscalerOptions.env)."""
    env = [{"name": PENDING_SLICE_IDLE_TIMEOUT_ENV, "value": str(PENDING_SLICE_IDLE_TIMEOUT_S)}]
    if hosts > RAY_MAX_CONCURRENT_LAUNCHES:
        env.append({"name": MAX_CONCURRENT_LAUNCHES_ENV, "value": str(hosts)})
    return env


def cluster_context(spec: Spec, env: list[dict], head_ports: list[dict], min_replicas: int = 1, max_replicas: int = 1,
                    autoscaling: bool | None = None, head_start_params: dict | None = None,
                    idle_timeout_s: int | None = None) -> dict:
    """The RayCluster of either kind (templates/_cluster.json.j2): one slice per worker replica;
    ``idle_timeout_s``: a service's spec.replicas.idleTimeoutSeconds (None: SLICE_IDLE_TIMEOUT_S)."""
    autoscaling = max_replicas > min_replicas if autoscaling is None else autoscaling
    token_in_autoscaler = autoscaling and not spec.automount_service_account_token  # else pod-wide, or none
    head_storage = volumes.pod_storage(spec.volumes, spec.gcs_fuse_sidecar, "head", spec.security_context)
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
                               **({"version": AUTOSCALER_VERSION, "idleTimeoutSeconds": SLICE_IDLE_TIMEOUT_S if idle_timeout_s is None else idle_timeout_s,
                                   "upscalingMode": UPSCALING_MODE, "env": autoscaler_env(spec.slice.hosts)}
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
        "worker_storage": volumes.pod_storage(spec.volumes, spec.gcs_fuse_sidecar, "worker", spec.security_context),
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
