"""JobSpec -> KubeRay RayJob (templates/rayjob.json.j2): the submitter and the job's RayCluster,
its training slice and spec.groups."""

from __future__ import annotations

import yaml

from ..api.spec import JobSpec
from . import groups as _groups, output
from .cluster import HEAD_PORTS, cluster_context
from .env import slice_env
from .names import JOB_LABEL, object_labels

def job_cluster_context(job: JobSpec, attempt: int = 1, started: str | None = None) -> dict:
    """A job's RayCluster: the training slice, then its spec.groups."""
    cluster = cluster_context(job, slice_env(job, attempt, started), HEAD_PORTS)
    if job.groups:
        cluster.update(_groups.train_slice_extras(job))
        cluster["groups"] = _groups.group_contexts(job, cluster)
    return cluster


# KubeRay's own default for the submitter pod of K8sJobMode, which the operator writes out so that
# the pod also gets the securityContext (KubeRay's default has none: refused by `restricted`).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
SUBMITTER_CONTAINER = "ray-job-submitter"


def context(job: JobSpec, attempt: int = 1, started: str | None = None) -> dict:
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
        "cluster": job_cluster_context(job, attempt, started),
    }


def rayjob(job: JobSpec, attempt: int = 1, started: str | None = None) -> dict:
    """The RayJob the operator creates for ``job``'s attempt number ``attempt`` (without
    ownerReferences, added on create); ``started``: when the operator creates it (render/env.py
    attempt_env). An attempt's RayJob is never patched but for suspend: its number reaches the
    next attempt only.

    No spec hash: a RayJob only ever gets suspend patched, and hashing the spec would slow the
    render of every job in a burst."""
    return output.loaded(output.template("rayjob.json.j2").render(context(job, attempt, started)), "RayJob")
