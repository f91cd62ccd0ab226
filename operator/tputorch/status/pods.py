"""What a slice's pods say, read the same way for a job and a service: their KubeRay labels,
which TPU hosts are up or wanted, and why a host waits (unschedulable, no node pool of the slice's
shape, the GKE Ray TPU webhook missing, a quota, a container that cannot start). These are the
observations both status derivations start from; the conditions they make of them are theirs.
Pure functions over the pods as the API (or the operator's slimmed pod store) returns them.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from ..api import topology

ROLE_LABEL = "ray.io/node-type"  # KubeRay labels each pod head or worker
CLUSTER_LABEL = "ray.io/cluster"  # and with its RayCluster's name
# KubeRay >= 1.5 with its RayMultiHostIndexing gate: which slice replica a host pod belongs to.
REPLICA_LABEL = "ray.io/worker-group-replica-name"
GROUP_LABEL = "ray.io/group"  # KubeRay labels each pod with its worker group's name
# The pod labels the derive functions read (a pod store may keep only these).
POD_LABELS_READ = (ROLE_LABEL, CLUSTER_LABEL, REPLICA_LABEL, GROUP_LABEL)


def _pod_name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _pod_condition(pod: dict, ctype: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


# The scheduler rewrites the node counts of its message on every retry ("0/7 nodes are available:
# 3 node(s) had untolerated taint ..."); without them the message changes only with its substance.
_NODE_TOTAL = re.compile(r"\b0/\d+ nodes are available")
_REASON_COUNT = re.compile(r"(^|: |, )\d+ ")


# The scheduler lists its reasons by descending count: with the counts gone, the order would
# still move whenever the counts cross (measured: bench/RESULTS.md run 6, measure 5).
_REASON_LIST = re.compile(r"(no nodes are available: )(.*?)(?=\.(?: |$))")
_REASON_SEPARATOR = re.compile(r", (?![^{]*\})")  # not inside a taint's {key: value}


def stable_scheduler_message(message: str) -> str:
    """The scheduler's message without its node counts, its reasons in a fixed order."""
    without_counts = _REASON_COUNT.sub(r"\1", _NODE_TOTAL.sub("no nodes are available", message))
    return _REASON_LIST.sub(lambda m: m.group(1) + ", ".join(sorted(_REASON_SEPARATOR.split(m.group(2)))),
                            without_counts)


def scheduling_problem(pods: Iterable[dict]) -> str | None:
    """Why the first unschedulable pod (by name) waits, if one does; stable across the
    scheduler's retries."""
    for pod in sorted(pods, key=_pod_name):
        cond = _pod_condition(pod, "PodScheduled")
        if cond.get("status") == "False":
            message = stable_scheduler_message(cond.get("message", ""))
            return f"pod {_pod_name(pod)}: {cond.get('reason', 'Unschedulable')}: {message}".strip()
    return None


# The scheduler's reason for a node without the pod's node selector labels, and the reasons that
# say nothing about them (its filters stop at a node's first failure; taints are checked first).
NODE_SELECTOR_MISMATCH = "didn't match Pod's node affinity/selector"
_SAYS_NOTHING_OF_LABELS = ("had untolerated taint", "were unschedulable", "didn't match Pod's node affinity/selector")


def no_node_pool(pods: Iterable[dict], selector: dict[str, str]) -> tuple[str, str] | None:
    """(NoMatchingNodePool, message) when a TPU host pod (by name) cannot be scheduled because no
    node has the slice's node labels ``selector`` (the scheduler found only nodes that lack them, or
    that it ruled out by a taint first): no node pool of this shape. The message names the labels."""
    for pod in sorted(_workers(pods), key=_pod_name):
        cond = _pod_condition(pod, "PodScheduled")
        if cond.get("status") != "False":
            continue
        stable = stable_scheduler_message(cond.get("message", ""))
        found = _REASON_LIST.search(stable)
        reasons = _REASON_SEPARATOR.split(found.group(2)) if found else []
        if not any(NODE_SELECTOR_MISMATCH in r for r in reasons) or \
                not all(any(s in r for s in _SAYS_NOTHING_OF_LABELS) for r in reasons):
            continue
        first = topology.SLICE_LABELS
        labels = ", ".join(f"{k}={selector[k]}" for k in (*first, *sorted(set(selector) - set(first))) if k in selector)
        return "NoMatchingNodePool", (
            f"no node pool has the node labels this slice needs: {labels}; create a node pool of this shape or "
            f"choose a slice that has one (an autoscaled pool at 0 nodes reads the same until it scales up). "
            f"pod {_pod_name(pod)}: {cond.get('reason', 'Unschedulable')}: {stable}")
    return None


TPU_RESOURCE = "google.com/tpu"
# What the GKE Ray TPU webhook sets at admission on each TPU container of a multi-host slice's pods
# (it also sets TPU_NAME, which says nothing of the slice's other hosts).
WEBHOOK_ENV = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")


def tpu_webhook_missing(pods: Iterable[dict], hosts: int) -> tuple[str, str] | None:
    """(TPUWebhookMissing, message) when a TPU host pod (by name) of a multi-host slice was created
    without the variables the GKE Ray TPU webhook sets: the webhook is not installed (or did not
    see the pod), and the slice's hosts cannot find each other. Pods whose containers are not
    known (spec.containers absent) say nothing."""
    if hosts <= 1:
        return None
    for pod in sorted(_workers(pods), key=_pod_name):
        for c in (pod.get("spec") or {}).get("containers") or []:
            if TPU_RESOURCE not in ((c.get("resources") or {}).get("limits") or {}):
                continue
            have = {e.get("name") for e in c.get("env") or []}
            missing = [v for v in WEBHOOK_ENV if v not in have]
            if missing:
                return "TPUWebhookMissing", (
                    f"pod {_pod_name(pod)}, a host of a {hosts}-host TPU slice, was created without "
                    f"{' and '.join(missing)}: the GKE Ray TPU webhook, which sets them when the pod is created, is "
                    f"not installed, and the slice's hosts cannot find each other. Install it (the GKE Ray Operator "
                    f"add-on does; with KubeRay installed by hand, the kuberay-tpu-webhook chart: "
                    f"docs/compatibility.md), then delete and re-create this object: pods made before keep lacking them")
    return None


def pods_forbidden(namespace: str, refused: tuple[str, str]) -> tuple[str, str]:
    """(PodsForbidden, message) for the objects of a namespace whose pods the operator may not
    read (``refused``: the informer's ("list" or "watch", the API's message))."""
    step, detail = refused
    return "PodsForbidden", (
        f"the operator may not {step} pods in namespace {namespace} ({detail}): it cannot see the slice's hosts, "
        f"so how many are ready is KubeRay's count and why a host waits or was lost is not known; grant its "
        f"ServiceAccount get, list and watch on pods there (the chart's Role does)")


# Kubelet's reasons for a container that cannot start: they never clear by waiting alone.
CONTAINER_PROBLEMS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                      "CreateContainerError", "RunContainerError", "CrashLoopBackOff")


IMAGE_PROBLEMS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


def _waiting(pod: dict) -> Iterator[tuple[dict, dict]]:
    """(container status, its waiting state or {}) of each container of the pod, init containers
    first: one that cannot start holds the others (PodInitializing)."""
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        yield cs, (cs.get("state") or {}).get("waiting") or {}


def container_problem(pods: Iterable[dict]) -> tuple[str, str] | None:
    """(reason, message) of the first pod (by name) with a container kubelet cannot start: a
    missing image, a missing Secret or key (CreateContainerConfigError), a crash loop."""
    for pod in sorted(pods, key=_pod_name):
        for cs, waiting in _waiting(pod):
            if waiting.get("reason") in CONTAINER_PROBLEMS:
                detail = waiting.get("message") or ""
                image = f" (image {cs['image']})" if cs.get("image") and waiting["reason"] in IMAGE_PROBLEMS else ""
                return waiting["reason"], (f"pod {_pod_name(pod)} container {cs.get('name', '')}{image}: "
                                           f"{waiting['reason']}" + (f": {detail}" if detail else ""))
    return None


def secret_missing(pods: Iterable[dict], secret_name: str | None) -> bool:
    """A container of ``pods`` cannot start because the Secret ``secret_name`` is not there
    (kubelet's CreateContainerConfigError, 'secret "<name>" not found')."""
    quoted = f'"{secret_name}"'
    return bool(secret_name) and any(
        waiting.get("reason") == "CreateContainerConfigError" and quoted in (waiting.get("message") or "")
        and "not found" in (waiting.get("message") or "")
        for pod in pods for _, waiting in _waiting(pod))


def quota_problem(cluster_status: dict | None) -> tuple[str, str] | None:
    """(reason, message) when KubeRay cannot create the slice's pods (its ReplicaFailure condition):
    a ResourceQuota exceeded (QuotaExceeded, the quota's message as is) or another refusal."""
    for cond in (cluster_status or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            message = cond.get("message") or ""
            reason = "QuotaExceeded" if "exceeded quota" in message else "PodCreationFailed"
            return reason, f"KubeRay cannot create the slice's pods: {message}"
    return None


def running(pod: dict) -> bool:
    """The pod's containers run (phase Running and no container waiting or terminated), whatever
    its readiness probe says. A crash-looping container leaves the pod Running while it waits in
    CrashLoopBackOff (or has terminated) between restarts: that host is not up. (The pod store
    keeps only the waiting containers: controller/stores.slim_pod.)"""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return not any({"waiting", "terminated"} & set(cs.get("state") or {}) for cs in status.get("containerStatuses") or [])


def labels_of(pod: dict) -> dict:
    return (pod.get("metadata") or {}).get("labels") or {}


def _workers(pods: Iterable[dict]) -> list[dict]:
    return [p for p in pods if labels_of(p).get(ROLE_LABEL) == "worker"]


def _ready(pod: dict) -> bool:
    return _pod_condition(pod, "Ready").get("status") == "True"


def ready_hosts(pods: Iterable[dict], cluster_status: dict, up=_ready) -> int:
    """TPU host pods that are up (by default Ready). The pods are fresher than the RayJob's copy of
    the RayCluster's status, which is only the fallback once the pods are gone (job finished)."""
    workers = _workers(pods)
    if workers:
        return sum(1 for p in workers if up(p))
    return int(cluster_status.get("readyWorkerReplicas") or 0)


def wanted_hosts(pods: Iterable[dict], cluster_status: dict, pods_read: bool = True) -> int:
    """TPU host pods wanted now: the ones KubeRay keeps (not being deleted), which follow the
    RayCluster's replicas as soon as Ray's autoscaler writes them. KubeRay 1.6 writes a RayService's
    copy of its cluster's status (desiredWorkerReplicas) only when a Serve status changes
    (utils.inconsistentRayServiceStatus), so after the autoscaler gives a slice back the copy stays
    high for as long as Serve says nothing new; it is the answer only when the pods cannot be read."""
    if not pods_read:
        return int(cluster_status.get("desiredWorkerReplicas") or 0)
    return sum(1 for p in _workers(pods) if not (p.get("metadata") or {}).get("deletionTimestamp"))


def ready_slices(pods: Iterable[dict], hosts_per_slice: int, ready: int, up=_ready) -> int:
    """Slice replicas whose every host is Ready. Grouped by KubeRay's replica label where the pods
    carry it; otherwise whole slices' worth of ready hosts (KubeRay creates a slice's hosts together)."""
    workers = _workers(pods)
    if workers and all(REPLICA_LABEL in labels_of(p) for p in workers):
        groups: dict[str, list[dict]] = {}
        for p in workers:
            groups.setdefault(labels_of(p)[REPLICA_LABEL], []).append(p)
        return sum(1 for g in groups.values() if len(g) >= hosts_per_slice and all(up(p) for p in g))
    return ready // hosts_per_slice
