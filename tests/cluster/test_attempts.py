"""Attempts and Pending reasons on the local cluster (stand-in Ray dashboard): a TPU host evicted
through the Eviction API (a node drain, GKE maintenance) or its node deleted (a preempted Spot VM)
ends the attempt as the infrastructure's failure, the job goes Retrying and a new RayJob (attempt
2) runs on a fresh slice, succeeding with attempts: 2; attempt 2 is created only once every pod
of attempt 1 is gone (a head pod held by a finalizer is named in the status meanwhile); a script
failure on a healthy slice fails after one attempt; an image that cannot be pulled is named in the
status and a Warning event."""

from __future__ import annotations

import yaml
from kubernetes import client

from operator_process import REPO, kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)
from test_operator_e2e import (apply, condition, events_for, get_rayjob, job_body, job_status, pods_of,
                               wait_events, wait_phase)

ATTEMPT_LABEL = "tputorch.io/attempt"


def wait_attempt_ended(kube, ns, name, timeout):
    """The status once the first attempt's end is recorded. The phase Retrying itself can last less
    than a poll: the next attempt's RayJob is created right after it (0.4 s on a quiet machine), so
    the transition is checked through attemptHistory and the Retrying event instead."""
    return kube.wait(lambda: (lambda s: s if s.get("attemptHistory") else None)(job_status(kube, ns, name)),
                     timeout, f"TPUTorchJob {ns}/{name}'s first attempt ended")


def test_an_evicted_host_restarts_the_slice_as_attempt_two(kube, namespace, operator, dashboard):
    apply(kube, namespace, job_body("evicted", topo="2x2"))
    wait_phase(kube, namespace, "evicted", "Running", 180)
    first = get_rayjob(kube, namespace, "evicted")
    assert first["metadata"]["labels"][ATTEMPT_LABEL] == "1"
    (worker,) = [p for p in pods_of(kube, namespace, "evicted") if p.metadata.labels.get("ray.io/node-type") == "worker"]

    kube.core.create_namespaced_pod_eviction(worker.metadata.name, namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=worker.metadata.name, namespace=namespace)))

    st = wait_attempt_ended(kube, namespace, "evicted", 60)
    assert st["attempts"] == 2
    (record,) = st["attemptHistory"]
    assert (record["attempt"], record["result"]) == (1, "Infrastructure")
    assert record["reason"] in ("PodEvicted", "PodDeleted") and worker.metadata.name in record["message"]
    second = kube.wait(lambda: (lambda rj: rj if rj["metadata"]["uid"] != first["metadata"]["uid"] else None)(
        get_rayjob(kube, namespace, "evicted")), 120, "the RayJob of attempt 2")
    assert second["metadata"]["labels"][ATTEMPT_LABEL] == "2"
    wait_phase(kube, namespace, "evicted", "Running", 180)
    # KubeRay reports Running once it has made the submitter, before the Ray job exists: the
    # stand-in dashboard's newest job of this RayJob name must be attempt 2's before it is ended.
    cluster = kube.wait(lambda: (get_rayjob(kube, namespace, "evicted").get("status") or {}).get("rayClusterName"),
                        60, "attempt 2's RayCluster")
    kube.wait(lambda: (dashboard.get_job(namespace, "evicted") or {}).get("cluster") == cluster, 120,
              "attempt 2's Ray job submitted")
    dashboard.set_job_status(namespace, "evicted", "SUCCEEDED")
    st = wait_phase(kube, namespace, "evicted", "Succeeded", 180)
    assert st["attempts"] == 2
    assert [(a["attempt"], a["result"]) for a in st["attemptHistory"]] == [(1, "Infrastructure"), (2, "Succeeded")]
    wait_events(kube, namespace, "evicted", ("Normal", "Running"), ("Normal", "JobSucceeded"))
    assert any(reason == "Retrying" for _, reason in events_for(kube, namespace, "evicted"))


HOLD_ANNOTATION = "tputorch.local/hold-deletion"  # KWOK leaves such a pod Terminating (hack/kwok-pod-stages.yaml)
HOLD_FINALIZER = "tputorch.local/hold"


def test_attempt_two_waits_until_every_pod_of_attempt_one_is_gone(kube, namespace, operator, dashboard):
    """Attempts never overlap: attempt 1's head pod, held by a finalizer while a worker's eviction
    ends the attempt, keeps attempt 2's RayJob from being made; the status says why and names the
    pod; once the finalizer goes, attempt 2 is created."""
    apply(kube, namespace, job_body("held", topo="2x2"))
    wait_phase(kube, namespace, "held", "Running", 180)
    pods = pods_of(kube, namespace, "held")
    (head,) = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "head"]
    (worker,) = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "worker"]
    hold = {"metadata": {"annotations": {HOLD_ANNOTATION: "true"}, "finalizers": [HOLD_FINALIZER]}}
    kube.core.patch_namespaced_pod(head.metadata.name, namespace, hold)
    try:
        kube.core.create_namespaced_pod_eviction(worker.metadata.name, namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=worker.metadata.name, namespace=namespace)))
        st = kube.wait(lambda: (lambda s: s if condition(s, "RayJobCreated").get("reason") == "PreviousAttemptTerminating"
                                else None)(job_status(kube, namespace, "held")), 90, "the wait for attempt 1's pods")
        assert (st["phase"], st["attempts"]) == ("Retrying", 2)
        assert head.metadata.name in condition(st, "RayJobCreated")["message"] and head.metadata.name in st["message"]
        held = kube.core.read_namespaced_pod(head.metadata.name, namespace)
        assert held.metadata.deletion_timestamp is not None  # attempt 1's RayJob is gone, its head is not
        rayjobs = kube.custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs")["items"]
        assert [rj["metadata"]["name"] for rj in rayjobs] == []  # and no attempt 2 beside it
    finally:
        kube.core.patch_namespaced_pod(head.metadata.name, namespace,
                                       {"metadata": {"annotations": {HOLD_ANNOTATION: None}, "finalizers": None}})
    second = kube.wait(lambda: (lambda rj: rj if rj and rj["metadata"]["labels"].get(ATTEMPT_LABEL) == "2" else None)(
        _rayjob_or_none(kube, namespace, "held")), 90, "the RayJob of attempt 2")
    head_env = second["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TPUTORCH_ATTEMPT", "value": "2"} in head_env
    assert all(p.metadata.name != head.metadata.name for p in pods_of(kube, namespace, "held"))


def _rayjob_or_none(kube, ns, name):
    try:
        return get_rayjob(kube, ns, name)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def test_a_failing_script_on_a_healthy_slice_is_not_retried(kube, namespace, operator, dashboard):
    apply(kube, namespace, job_body("raises", topo="2x2"))
    wait_phase(kube, namespace, "raises", "Running", 180)
    uid = get_rayjob(kube, namespace, "raises")["metadata"]["uid"]
    dashboard.set_job_status(namespace, "raises", "FAILED", submitter_exit_code=1,
                             message="Job entrypoint command failed with exit code 1, last available logs:\n"
                                     "ValueError: learning rate must be positive\n")
    st = wait_phase(kube, namespace, "raises", "Failed", 180)
    assert st["attempts"] == 1 and st["attemptHistory"][0]["result"] == "Application"
    assert "ValueError: learning rate must be positive" in condition(st, "Failed")["message"]
    assert get_rayjob(kube, namespace, "raises")["metadata"]["uid"] == uid  # not made again
    assert job_status(kube, namespace, "raises")["phase"] == "Failed"


def _node_from_hack(name: str) -> dict:
    items = yaml.safe_load((REPO / "hack" / "nodes.yaml").read_text())["items"]
    return next(n for n in items if n["metadata"]["name"] == name)


def test_a_deleted_node_is_the_infrastructures_failure(kube, namespace, operator, dashboard):
    """GKE deletes a preempted Spot node; the pod garbage collector then deletes its pods
    (DisruptionTarget DeletionByPodGC) and the attempt ends as NodeDeleted or PodDeleted."""
    apply(kube, namespace, job_body("node-gone", topo="2x2"))
    wait_phase(kube, namespace, "node-gone", "Running", 180)
    (worker,) = [p for p in pods_of(kube, namespace, "node-gone") if p.metadata.labels.get("ray.io/node-type") == "worker"]
    node = worker.spec.node_name
    saved = _node_from_hack(node)
    kubectl(kube.kubeconfig, "delete", "node", node, "--wait=false")
    try:
        st = wait_attempt_ended(kube, namespace, "node-gone", 150)
        (record,) = st["attemptHistory"]
        assert record["result"] == "Infrastructure" and record["reason"] in ("NodeDeleted", "PodDeleted")
        assert worker.metadata.name in record["message"]
    finally:
        kube.wait(lambda: kubectl(kube.kubeconfig, "get", "node", node, check=False).returncode != 0, 60, f"node {node} gone")
        kubectl(kube.kubeconfig, "create", "--validate=false", "-f", "-", input=yaml.safe_dump(saved))
        kubectl(kube.kubeconfig, "wait", "--for=condition=Ready", f"node/{node}", "--timeout=60s")
    wait_phase(kube, namespace, "node-gone", "Running", 180)
    assert job_status(kube, namespace, "node-gone")["attempts"] == 2


def test_an_image_that_cannot_be_pulled_is_named_in_the_status(kube, namespace, operator, dashboard):
    """The kubelet's report (ImagePullBackOff on a TPU host's container), written as a kubelet
    writes it (KWOK has no image pulls): the slice's condition names the image, with a Warning."""
    apply(kube, namespace, job_body("no-image", topo="2x2"))
    wait_phase(kube, namespace, "no-image", "Running", 180)
    (worker,) = [p for p in pods_of(kube, namespace, "no-image") if p.metadata.labels.get("ray.io/node-type") == "worker"]
    image = worker.spec.containers[0].image
    kube.core.patch_namespaced_pod_status(worker.metadata.name, namespace, {"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [{"name": "ray-worker", "image": image, "imageID": "", "ready": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "ImagePullBackOff",
                                                     "message": f'Back-off pulling image "{image}"'}}}]}})
    st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "ImagePullBackOff" else None)(
        job_status(kube, namespace, "no-image")), 60, "SliceReady=ImagePullBackOff")
    assert f"(image {image}): ImagePullBackOff" in condition(st, "SliceReady")["message"]
    wait_events(kube, namespace, "no-image", ("Warning", "ImagePullBackOff"))
