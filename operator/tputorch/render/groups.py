"""spec.groups -> the extra KubeRay worker groups of a job's RayCluster (templates/_groups.json.j2),
the Ray label and fence resource of the training slice, and the group shapes handed to the script.

Every group's Ray nodes carry the Ray label ``tputorch.io/group: <name>``, the training slice's
nodes ``tputorch.io/group: tpu-slice``, and only the training slice's nodes the Ray resource
``tputorch-train-slice`` (one per chip), which ``tputorch.train.scaling_config()`` asks for: Ray
Train refuses a label selector with ``use_tpu``, so a resource keeps its workers off a rollout
slice of the same shape.
"""

from __future__ import annotations

import json

from .. import train
from ..api import storage, topology
from ..api.groups import GKE_GPU_LABEL, GPU_RESOURCE, TRAIN_GROUP, Group
from . import volumes
from .cluster import SPOT_TOLERATION, TPU_TOLERATION, container_resources

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def ray_labels(name: str) -> dict[str, str]:
    return {train.GROUP_LABEL: name}


def train_slice_extras(job) -> dict:
    """What the training slice's worker group gets when the job has groups (nothing otherwise, so
    a job without groups renders as before)."""
    if not job.groups:
        return {"train_ray_labels": None, "worker_ray_resources": None}
    return {
        "train_ray_labels": ray_labels(TRAIN_GROUP),
        "worker_ray_resources": {train.TRAIN_RESOURCE: str(job.slice.chips_per_host)},
    }


def shape(group: Group) -> dict:
    """One group as the script sees it (TPUTORCH_GROUPS; tputorch.train.groups())."""
    entry = {"name": group.name, "kind": group.kind, "replicas": group.replicas, "hostsPerReplica": group.hosts,
             "labels": ray_labels(group.name)}
    if group.slice is not None:
        s = group.slice
        entry.update(acceleratorType=s.generation.ray_accelerator_type, topology=s.topology, chips=s.chips,
                     chipsPerHost=s.chips_per_host, podType=s.ray_pod_type)
    if group.gpu_type is not None:
        entry.update(gpuType=group.gpu_type, gpusPerHost=group.gpus)
    return entry


def groups_env(job) -> list[dict]:
    """The group shapes for the script: nothing for a job without groups."""
    if not job.groups:
        return []
    value = json.dumps([shape(g) for g in job.groups], sort_keys=True, separators=(",", ":"))
    return [{"name": train.ENV_GROUPS, "value": value}]


def _node_selector_and_tolerations(job, group: Group) -> tuple[dict, list]:
    selector = dict(group.node_selector)
    tolerations: list[dict] = []
    if group.kind == "tpu":
        selector.update(group.slice.node_selector)
        if group.spot:
            selector[topology.GKE_SPOT_LABEL] = "true"
        if group.reservation:
            selector[topology.GKE_RESERVATION_LABEL] = group.reservation
        tolerations = [TPU_TOLERATION] + ([SPOT_TOLERATION] if group.spot else [])
    elif group.kind == "gpu":
        selector[GKE_GPU_LABEL] = group.gpu_type
        tolerations = [GPU_TOLERATION]
    return selector, tolerations + list(job.tolerations)


def group_context(job, group: Group, cluster: dict) -> dict:
    """One group's worker group; what every Ray worker pod shares (env, pod labels, the workers'
    volumes, securityContext, service-account token) comes from the job's cluster context."""
    selector, tolerations = _node_selector_and_tolerations(job, group)
    extra = {}
    if group.kind == "tpu":
        extra[topology.TPU_RESOURCE] = str(group.slice.chips_per_host)
    elif group.kind == "gpu":
        extra[GPU_RESOURCE] = str(group.gpus)
    # The workers' volumes, so the workers' disk: requested as for a main-slice host whose
    # spec.worker.ephemeralStorage is unset (a group has no field of its own for it).
    disk = volumes.ephemeral_storage(None, storage.node_disk(job.volumes, "worker"))
    resources = container_resources(group.cpu, group.memory, disk, extra)
    return {
        "name": group.name,
        "replicas": group.replicas,
        "num_hosts": group.hosts,
        "ray_labels": ray_labels(group.name),
        "pod_labels": cluster["pod_labels"],
        "service_account_name": job.service_account_name,
        "node_selector": selector,
        "tolerations": tolerations,
        "image": group.image,
        "env": cluster["env"] + list(group.env),  # the group's own last: its value wins
        "resources": resources,
        # the workers' volumes, mounts and GKE's gcsfuse annotations, for a Ray container without a disk limit
        "storage": volumes.pod_storage(job.volumes, job.gcs_fuse_sidecar, "worker", job.security_context),
        "security_context": cluster["security_context"],
        "automount": cluster["worker_automount"],
    }


def group_contexts(job, cluster: dict) -> list[dict]:
    return [group_context(job, g, cluster) for g in job.groups]
