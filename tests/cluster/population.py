"""Many TPUTorchJobs in chosen phases, made through the API while no operator runs: each job, its
RayJob (owned by the job's uid, as the operator makes it) and the RayJob's status as KubeRay
would have written it. Used by the restart test and by the bench (bench/scale.py).

The RayJobs carry ``spec.managedBy: kueue.x-k8s.io/multikueue``: KubeRay (v1.3+) leaves a RayJob
managed elsewhere alone, so the statuses set here stay put even while KubeRay runs, and no
RayCluster or pod is made for them.

With ``job_status=True`` each job also gets the status the operator derives (tputorch.status.derive)
from its RayJob, as an operator that ran earlier would have written it; phase "Cleaned" is a
succeeded job whose RayJob was deleted since (only with job_status: its status says it finished).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))
from tputorch.api import crd, spec  # noqa: E402
from tputorch import render, status as statuses  # noqa: E402

RAY = ("ray.io", "v1", "rayjobs")
MANAGED_ELSEWHERE = "kueue.x-k8s.io/multikueue"
START, END = "2026-11-30T01:00:00Z", "2026-11-30T01:20:00Z"


def rayjob_status(phase: str, name: str) -> dict:
    """The RayJob status KubeRay writes for a job in ``phase`` (a TPUTorchJob phase)."""
    cluster = f"{name}-raycluster-bench"
    return {
        "Succeeded": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "jobId": f"{name}-job",
                      "rayClusterName": cluster, "startTime": START, "endTime": END,
                      "message": "Job finished successfully."},
        "Failed": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
                   "jobId": f"{name}-job", "rayClusterName": cluster, "startTime": START, "endTime": END,
                   "message": "Job entrypoint command failed with exit code 1"},
        "Running": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": f"{name}-job",
                    "rayClusterName": cluster, "startTime": START,
                    "rayClusterStatus": {"readyWorkerReplicas": 4, "desiredWorkerReplicas": 4}},
        "Suspended": {"jobDeploymentStatus": "Suspended"},
        "Pending": {"jobDeploymentStatus": "Initializing", "rayClusterName": cluster, "startTime": START},
    }[phase]


def job_body(name: str, suspend: bool) -> dict:
    """A v6e 4x4 TPUTorchJob (the bench's shape)."""
    return {
        "apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/ray-torch-tpu:2.60.0",
                 "entrypoint": "python train.py --epochs 1", "head": {"cpu": "1", "memory": "2Gi"},
                 "worker": {"cpu": "4", "memory": "16Gi"}, "suspend": suspend},
    }


def _retrying(call, attempts: int = 6):
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as exc:
            if exc.status in (429, 500, 503, 504) and attempt < attempts - 1:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise


def make_one(custom, namespace: str, name: str, phase: str, job_status: bool = False) -> None:
    body = job_body(name, suspend=phase == "Suspended")
    try:
        job = _retrying(lambda: custom.create_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace, crd.PLURAL,
                                                                        body))
    except ApiException as exc:
        if exc.status != 409:
            raise
        job = custom.get_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
    parsed = spec.parse({**body, "metadata": {"name": name, "namespace": namespace}})
    rayjob = render.rayjob(parsed)
    rayjob["spec"]["managedBy"] = MANAGED_ELSEWHERE
    rayjob["metadata"]["ownerReferences"] = [{
        "apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": name, "uid": job["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    rayjob["status"] = rayjob_status("Succeeded" if phase == "Cleaned" else phase, name)
    if phase != "Cleaned":
        try:
            _retrying(lambda: custom.create_namespaced_custom_object(*RAY[:2], namespace, RAY[2], rayjob))
        except ApiException as exc:
            if exc.status != 409:
                raise
        _retrying(lambda: custom.patch_namespaced_custom_object_status(*RAY[:2], namespace, RAY[2], name,
                                                                        {"status": rayjob["status"]}))
    if job_status:
        status = statuses.derive(parsed, job["metadata"].get("generation", 1), rayjob, [], {}, END)
        _retrying(lambda: custom.patch_namespaced_custom_object_status(crd.GROUP, crd.VERSION, namespace, crd.PLURAL,
                                                                        name, {"status": status}))


def plan(counts: dict[str, int]) -> list[tuple[str, str]]:
    """(name, phase) for every job; phases interleaved so that any prefix holds every phase."""
    left = dict(counts)
    out, i = [], 0
    while any(left.values()):
        for phase in counts:
            if left[phase]:
                out.append((f"job-{i:05d}", phase))
                left[phase] -= 1
                i += 1
    return out


def populate(custom, namespace: str, counts: dict[str, int], job_status: bool = False, threads: int = 8) -> dict:
    """Make every job of ``counts`` (phase -> number) in ``namespace``; returns timings."""
    if "Cleaned" in counts and not job_status:
        raise ValueError("phase Cleaned needs job_status=True: without a status the job would run again")
    jobs = plan(counts)
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda job: make_one(custom, namespace, *job, job_status=job_status), jobs))
    return {"objects": len(jobs), "seconds": time.monotonic() - started, "counts": dict(counts)}

