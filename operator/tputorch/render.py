"""JobSpec -> KubeRay RayJob (RayCluster embedded). Pure and deterministic.

Decisions live here; the object's shape lives in templates/rayjob.json.j2.
"""

from __future__ import annotations

import json
from functools import lru_cache

import jinja2
import yaml

from . import topology, train
from .spec import JobSpec

MANAGED_BY = "tputorch-operator"
JOB_LABEL = "tputorch.io/job"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKER_GROUP = "tpu-slice"

TPU_TOLERATION = {"key": topology.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": topology.GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tputorch", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty string
        autoescape=False,
        keep_trailing_newline=True,
    )
    # Plain JSON for tojson: Jinja's default also HTML-escapes <>&' (useless here, the output is
    # parsed by json.loads at once) and was half of the rendering time.
    env.filters["tojson"] = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode
    return env.get_template("rayjob.json.j2")


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
    ]


def worker_node_selector(job: JobSpec) -> dict[str, str]:
    selector = dict(job.node_selector)
    selector[topology.GKE_ACCELERATOR_LABEL] = job.slice.generation.gke_accelerator
    selector[topology.GKE_TOPOLOGY_LABEL] = job.slice.topology
    if job.spot:
        selector[topology.GKE_SPOT_LABEL] = "true"
    if job.reservation:
        selector[topology.GKE_RESERVATION_LABEL] = job.reservation
    return selector


def pod_labels(job: JobSpec) -> dict[str, str]:
    # Never app.kubernetes.io/name: KubeRay sets it to kuberay and GKE's TPU webhook looks for it.
    return {MANAGED_BY_LABEL: MANAGED_BY, JOB_LABEL: job.name}


def context(job: JobSpec) -> dict:
    rayjob_labels = {**job.labels, **pod_labels(job)}
    if job.queue_name:
        rayjob_labels[QUEUE_LABEL] = job.queue_name
    worker_tolerations = [TPU_TOLERATION] + ([SPOT_TOLERATION] if job.spot else []) + list(job.tolerations)
    return {
        "name": job.name,
        "namespace": job.namespace,
        "rayjob_labels": rayjob_labels,
        "pod_labels": pod_labels(job),
        "entrypoint": job.entrypoint,
        "runtime_env_yaml": yaml.safe_dump(job.runtime_env, sort_keys=True) if job.runtime_env else "",
        "shutdown_after_job_finishes": job.shutdown_after_job_finishes,
        "ttl_seconds_after_finished": job.ttl_seconds_after_finished,
        "active_deadline_seconds": job.active_deadline_seconds,
        "backoff_limit": job.backoff_limit,
        "suspend": job.suspend,
        "ray_version": job.ray_version,
        "service_account_name": job.service_account_name,
        "head_node_selector": job.head_node_selector,
        "accelerator_label": topology.GKE_ACCELERATOR_LABEL,
        "head_tolerations": list(job.tolerations),
        "image": job.image,
        "env": slice_env(job) + list(job.env),
        "head_resources": {"cpu": job.head.cpu, "memory": job.head.memory},
        "group_name": WORKER_GROUP,
        "num_hosts": job.slice.hosts,
        "worker_node_selector": worker_node_selector(job),
        "worker_tolerations": worker_tolerations,
        "worker_resources": {
            "cpu": job.worker.cpu,
            "memory": job.worker.memory,
            topology.TPU_RESOURCE: str(job.slice.chips_per_host),
        },
    }


def rayjob(job: JobSpec) -> dict:
    """The RayJob the operator creates for ``job`` (without ownerReferences, added on create)."""
    return json.loads(_template().render(context(job)))


def to_yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
