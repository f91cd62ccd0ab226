"""TPUTorchJobs and TPUTorchServices queued through real Kueue v0.19 (KUEUE=1 hack/cluster.sh up) with
the real KubeRay operator, on the platform objects of examples/kueue: a ClusterQueue whose
google.com/tpu quota is one slice per flavor (v6e 4x4: 16 chips, v6e 2x2: 4, v5p 2x2x2: 8),
WorkloadPriorityClasses tpu-low and tpu-high.

What is checked against what Kueue itself reports (its Workloads, the API server's audit log),
never against what the operator says about itself alone.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

import audit
from operator_process import kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)

from tputorch import render, timestamps
from tputorch.render.names import INITIALIZING_TIMEOUT_ANNOTATION, JOB_LABEL, SERVICE_LABEL

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kueue"
GROUP, VERSION = "tputorch.io", "v1alpha1"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUOTA_MESSAGE = "insufficient unused quota for google.com/tpu in flavor v6e-4x4, 16 more needed"
# Kueue >= 0.18 (SchedulingEquivalenceHashing, on by default) does not evaluate a Workload equivalent to
# one that just failed to fit: it says so, or (UnadmittedWorkloadsExplicitStatus off, 0.19's default) sets
# no QuotaReserved condition at all, and the operator says the job waits in the LocalQueue.
NOT_EVALUATED_MESSAGES = ("Bypassed scheduling evaluation because an equivalent workload recently failed",
                          "waiting in LocalQueue tpu")


@pytest.fixture(scope="module")
def kueue(kube, kube_env):
    """Kueue running on the local cluster (added to a running one), with examples/kueue's
    flavors, ClusterQueue and priority classes."""
    subprocess.run([str(REPO / "hack" / "cluster.sh"), "up"], check=True, env={**os.environ, "KUEUE": "1"})
    for name in ("flavors.yaml", "cluster-queue.yaml", "priority-classes.yaml"):
        kubectl(kube.kubeconfig, "apply", "-f", str(EXAMPLES / name))
    return kube


@pytest.fixture
def queue_ns(kueue, namespace):
    kubectl(kueue.kubeconfig, "apply", "-n", namespace, "-f", str(EXAMPLES / "local-queue.yaml"))
    return namespace


def job_body(name: str, priority: str | None = "tpu-low", queue: str = "tpu", **extra) -> dict:
    spec = {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/ray-torch-tpu:2.60.0",
            "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
            "worker": {"cpu": "4", "memory": "16Gi"}, "queueName": queue, **extra}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name}, "spec": spec}


def apply(kube, ns, body):
    kubectl(kube.kubeconfig, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))


def status(kube, ns, name, plural="tputorchjobs") -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name).get("status") or {}


def wait_phase(kube, ns, name, *phases, timeout=90, plural="tputorchjobs"):
    return kube.wait(lambda: (lambda s: s if s.get("phase") in phases else None)(status(kube, ns, name, plural)),
                     timeout, f"{ns}/{name} phase in {phases}")


def condition(st: dict, ctype: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def pods_of(kube, ns, job):
    return kube.core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={job}").items


def workload_of(kube, ns, rayjob: str) -> dict | None:
    items = kube.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
    owned = [w for w in items if any(r.get("name") == rayjob and r.get("kind") == "RayJob"
                                     for r in w["metadata"].get("ownerReferences") or [])]
    return owned[-1] if owned else None


def events_for(kube, ns, name) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in kube.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TPUTorchJob").items]


def finish(kube, dashboard, ns, name):
    """Succeed the Ray job of the RayJob's current RayCluster. KubeRay reports Running once it has
    made the submitter, before the Ray job exists, and after a preemption or suspend the newest job
    the stand-in knows is the stopped one of the removed cluster: ending that one would end nothing."""
    cluster = kube.wait(lambda: (kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", name)
                                 .get("status") or {}).get("rayClusterName"), 90, f"{ns}/{name}'s RayCluster")
    kube.wait(lambda: (dashboard.get_job(ns, name) or {}).get("cluster") == cluster, 120,
              f"{ns}/{name}'s Ray job on {cluster} submitted")
    dashboard.set_job_status(ns, name, "SUCCEEDED")


class PodWatch:
    """Every pod of the namespace as it is created, to compare with Kueue's admission times."""

    def __init__(self, kube, ns):
        from kubernetes import watch
        self.first: dict[str, datetime.datetime] = {}
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, args=(kube, ns), daemon=True)
        self._t.start()

    def _run(self, kube, ns):
        try:
            for ev in self._w.stream(kube.core.list_namespaced_pod, ns, timeout_seconds=600):
                pod = ev["object"]
                job = (pod.metadata.labels or {}).get(JOB_LABEL)
                if job and ev["type"] == "ADDED":
                    self.first.setdefault(job, pod.metadata.creation_timestamp)
        except Exception as err:  # the stream cut at stop(); a cut before is seen by the test
            self.error = err

    error: Exception | None = None

    def stop(self):
        self._w.stop()


def admitted_at(kube, ns, rayjob) -> datetime.datetime:
    return admitted_at_of(workload_of(kube, ns, rayjob))


def test_one_slice_of_quota_three_jobs_run_one_at_a_time(kueue, queue_ns, operator, dashboard):
    kube, ns = kueue, queue_ns
    pods = PodWatch(kube, ns)
    try:
        for name in ("q1", "q2", "q3"):
            apply(kube, ns, job_body(name))
        running = kube.wait(lambda: [n for n in ("q1", "q2", "q3") if status(kube, ns, n).get("phase") == "Running"],
                            90, "one job Running")
        assert len(running) == 1
        order = [running[0]]
        for name in sorted({"q1", "q2", "q3"} - set(order)):
            # Queued at once ("waiting for Kueue ... no Workload yet"), then with Kueue's own reason
            st = kube.wait(lambda: (lambda s: s if s.get("phase") == "Queued" and any(
                m in s.get("message", "") for m in (QUOTA_MESSAGE, *NOT_EVALUATED_MESSAGES)) else None)(
                status(kube, ns, name)), 90, f"{name} Queued with Kueue's message")
            assert condition(st, "Admitted")["status"] == "False" and st["queue"] == "tpu"
            assert pods_of(kube, ns, name) == []
            assert ("Normal", "Queued") in events_for(kube, ns, name)
        # Kueue evaluates at least one of the two identical jobs (the other may not be: see NOT_EVALUATED_MESSAGES)
        kube.wait(lambda: any(QUOTA_MESSAGE in status(kube, ns, n).get("message", "") for n in {"q1", "q2", "q3"} - set(order)),
                  30, "a queued job with Kueue's quota message")
        # each finishing job lets exactly the next one in
        for _ in range(2):
            finish(kube, dashboard, ns, order[-1])
            wait_phase(kube, ns, order[-1], "Succeeded")
            nxt = kube.wait(lambda: [n for n in ("q1", "q2", "q3") if n not in order
                                     and status(kube, ns, n).get("phase") == "Running"], 90, "the next job Running")
            assert len(nxt) == 1
            order.append(nxt[0])
            assert condition(status(kube, ns, nxt[0]), "Admitted")["reason"] == "Admitted"
        finish(kube, dashboard, ns, order[-1])
        wait_phase(kube, ns, order[-1], "Succeeded")
        # no job had a pod before Kueue admitted it (timestamps are whole seconds)
        assert pods.error is None and set(pods.first) == set(order)
        for name in order:
            assert pods.first[name] >= admitted_at(kube, ns, name), name
    finally:
        pods.stop()


def audit_writes(ns: str, verbs=("update", "patch")) -> list[dict]:
    return audit.writes(ns, "rayjobs", verbs)


def writes_suspend(entry: dict) -> bool:
    return "suspend" in ((entry.get("requestObject") or {}).get("spec") or {})


def test_high_priority_preempts_low_which_resumes_later_and_only_kueue_writes_suspend(kueue, queue_ns, operator,
                                                                                       dashboard):
    kube, ns = kueue, queue_ns
    apply(kube, ns, job_body("low", "tpu-low"))
    wait_phase(kube, ns, "low", "Running")
    apply(kube, ns, job_body("high", "tpu-high"))
    wait_phase(kube, ns, "high", "Running")
    st = wait_phase(kube, ns, "low", "Queued")
    assert "preempted earlier" in st["message"]
    kube.wait(lambda: pods_of(kube, ns, "low") == [], 60, "the low job's pods gone")
    assert ("Warning", "Preempted") in events_for(kube, ns, "low")
    finish(kube, dashboard, ns, "high")
    wait_phase(kube, ns, "high", "Succeeded")
    wait_phase(kube, ns, "low", "Running")
    finish(kube, dashboard, ns, "low")
    wait_phase(kube, ns, "low", "Succeeded")
    reasons = [r for _, r in events_for(kube, ns, "low")]
    for reason in ("Admitted", "Running", "Preempted", "Queued", "JobSucceeded"):
        assert reason in reasons, reasons

    # Who wrote spec.suspend of the RayJobs after creating them: Kueue (on admission and
    # preemption), never the operator. The log does hold both parties' entries: the operator's
    # creates and Kueue's suspend writes (unsuspend low, suspend it, unsuspend high, unsuspend low).
    assert len(audit.by_operator(audit_writes(ns, ("create",)))) == 2
    by_kueue = [e for e in audit_writes(ns) if writes_suspend(e) and audit.agent(e).startswith("kueue")]
    assert len(by_kueue) >= 4, [audit.agent(e) for e in audit_writes(ns)]
    assert [e for e in audit.by_operator(audit_writes(ns)) if writes_suspend(e)] == []


def test_a_users_suspend_stops_a_queued_job_and_resume_runs_it_through_kueue(kueue, queue_ns, operator, dashboard):
    kube, ns = kueue, queue_ns
    apply(kube, ns, job_body("s1"))
    wait_phase(kube, ns, "s1", "Running")
    kubectl(kube.kubeconfig, "patch", "-n", ns, "tputorchjob", "s1", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_phase(kube, ns, "s1", "Suspended")
    kube.wait(lambda: pods_of(kube, ns, "s1") == [], 60, "pods gone")
    assert workload_of(kube, ns, "s1")["spec"]["active"] is False
    kubectl(kube.kubeconfig, "patch", "-n", ns, "tputorchjob", "s1", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_phase(kube, ns, "s1", "Running")
    assert workload_of(kube, ns, "s1")["spec"]["active"] is True
    finish(kube, dashboard, ns, "s1")
    wait_phase(kube, ns, "s1", "Succeeded")
    assert [e for e in audit.by_operator(audit_writes(ns)) if writes_suspend(e)] == []


def test_unknown_queue_and_priority_class_are_named_and_run_once_created(kueue, queue_ns, operator, dashboard):
    kube, ns = kueue, queue_ns
    apply(kube, ns, job_body("noqueue", priority=None, queue="later"))
    apply(kube, ns, job_body("noclass", priority="tputorch-test-gold"))
    st = wait_phase(kube, ns, "noqueue", "Queued")
    kube.wait(lambda: "LocalQueue later doesn't exist" in status(kube, ns, "noqueue")["message"], 60,
              "Kueue's message about the missing LocalQueue")
    st = kube.wait(lambda: (lambda s: s if condition(s, "Admitted").get("reason") == "WorkloadPriorityClassNotFound"
                            else None)(status(kube, ns, "noclass")), 60, "the missing priority class named")
    assert "WorkloadPriorityClass tputorch-test-gold does not exist" in st["message"]
    assert pods_of(kube, ns, "noqueue") == [] and pods_of(kube, ns, "noclass") == []
    # created later: both run in turn, nothing lost
    gold = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": "tputorch-test-gold"}, "value": 500}
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(gold))
    try:
        wait_phase(kube, ns, "noclass", "Running", "Queued")
        lq = yaml.safe_load((EXAMPLES / "local-queue.yaml").read_text())
        lq["metadata"]["name"] = "later"
        kubectl(kube.kubeconfig, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(lq))
        first = kube.wait(lambda: [n for n in ("noqueue", "noclass") if status(kube, ns, n).get("phase") == "Running"],
                          90, "one of them Running")[0]
        finish(kube, dashboard, ns, first)
        other = ({"noqueue", "noclass"} - {first}).pop()
        wait_phase(kube, ns, other, "Running")
        finish(kube, dashboard, ns, other)
        wait_phase(kube, ns, other, "Succeeded")
    finally:
        kubectl(kube.kubeconfig, "delete", "workloadpriorityclass", "tputorch-test-gold", "--ignore-not-found")


INITIALIZING_TIMEOUT = 15  # seconds; the service below waits in the queue at least twice as long


def rayservice_of(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayservices", name)


def test_a_service_queued_longer_than_its_initializing_timeout_is_admitted_and_ready(kueue, queue_ns, operator, dashboard):
    """Issue 35 item 2. KubeRay 1.6.2 counts ray.io/initializing-timeout from its first reconcile
    (Ready=False, Initializing) and checks it every reconcile, suspended or not: with the timeout set
    at creation a service queued longer is failed in the queue. The operator gives a queued service
    its timeout only when Kueue admits it (the wait plus the timeout)."""
    kube, ns = kueue, queue_ns
    # A job holds the ClusterQueue's whole v6e-2x2 flavor (4 chips), the only one a 2x2 service fits
    # (a 4x4 holder would take the v6e-4x4 flavor's quota and leave the service admitted at once).
    apply(kube, ns, job_body("holder", priority="tpu-high", tpu={"accelerator": "v6e", "topology": "2x2"}))
    wait_phase(kube, ns, "holder", "Running")
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": "llm"},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm-tpu:2.60.0",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "queueName": "tpu", "priorityClassName": "tpu-low",
                     "serve": {"initializingTimeoutSeconds": INITIALIZING_TIMEOUT},
                     "head": {"cpu": "1", "memory": "2Gi"}, "worker": {"cpu": "4", "memory": "16Gi"}}}
    apply(kube, ns, body)
    wait_phase(kube, ns, "llm", "Queued", plural="tputorchservices")
    # KubeRay's clock: its Ready condition (False, Initializing) from its first reconcile on
    initializing = kube.wait(lambda: (lambda c: c if c.get("reason") == "Initializing" else None)(
        condition(rayservice_of(kube, ns, "llm").get("status") or {}, "Ready")), 60, "KubeRay's Initializing")
    # Queued for twice the timeout, KubeRay reconciling it every 2 s all along.
    time.sleep(2 * INITIALIZING_TIMEOUT)
    rs = rayservice_of(kube, ns, "llm")
    assert condition(rs["status"], "Ready") == initializing, rs["status"]
    assert INITIALIZING_TIMEOUT_ANNOTATION not in (rs["metadata"].get("annotations") or {})
    assert status(kube, ns, "llm", "tputorchservices")["phase"] == "Queued"
    # The slice's quota comes free: admitted, given its timeout, deployed, Ready.
    finish(kube, dashboard, ns, "holder")
    wait_phase(kube, ns, "holder", "Succeeded")
    st = wait_phase(kube, ns, "llm", "Ready", "Failed", plural="tputorchservices", timeout=240)
    assert st["phase"] == "Ready", st
    assert condition(st, "Admitted")["status"] == "True" and st["clusterQueue"] == "tpu"
    w = next(w for w in kube.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
             if any(r["kind"] == "RayService" for r in w["metadata"]["ownerReferences"]))
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in w["status"]["conditions"])
    rs = rayservice_of(kube, ns, "llm")
    timeout = int(rs["metadata"]["annotations"][INITIALIZING_TIMEOUT_ANNOTATION].removesuffix("s"))
    # KubeRay times out on the Initializing condition's age, not the RayService's: the wait counts from there
    waited = (admitted_at_of(w) - since(initializing)).total_seconds()
    assert waited >= 2 * INITIALIZING_TIMEOUT, waited
    assert waited + INITIALIZING_TIMEOUT <= timeout <= waited + INITIALIZING_TIMEOUT + 2, (timeout, waited)


def test_a_queued_autoscaled_service_is_admitted_as_kueues_elastic_job(kueue, queue_ns, operator):
    """Issue 56 item 7. A queued service with replicas.min < max renders its RayService with
    kueue.x-k8s.io/elastic-job: "true" and Ray's autoscaler on; the real Kueue 0.19.1
    (ElasticJobsViaWorkloadSlices on by default) admits it: its webhook lets the RayService in, its
    Workload is admitted (and marked elastic by Kueue itself), KubeRay makes the RayCluster with
    in-tree autoscaling and the service's range, and Kueue lifts its elastic-job scheduling gate
    from the pods it admitted. The CRD then refuses an edit to a fixed count, which Kueue would refuse
    on the RayService. Admission only: no Serve, no scale-up (a v6e 2x2, one host a slice)."""
    kube, ns = kueue, queue_ns
    gate = "kueue.x-k8s.io/elastic-job"  # Kueue's annotation and its pods' scheduling gate share the name
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": "elastic"},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm-tpu:2.60.0",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "queueName": "tpu", "replicas": {"min": 1, "max": 2},
                     "head": {"cpu": "1", "memory": "2Gi"}, "worker": {"cpu": "4", "memory": "16Gi"}}}
    apply(kube, ns, body)
    rs = kube.wait(lambda: rayservice_of(kube, ns, "elastic"), 60, "the RayService")
    assert rs["metadata"]["annotations"][gate] == "true", rs["metadata"]
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    w = kube.wait(lambda: next((w for w in kube.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
                                if any(r["kind"] == "RayService" and r["name"] == "elastic"
                                       for r in w["metadata"].get("ownerReferences") or [])
                                and any(c["type"] == "Admitted" and c["status"] == "True"
                                        for c in (w.get("status") or {}).get("conditions") or [])), None),
                  90, "the RayService's Workload admitted")
    assert (w["metadata"].get("annotations") or {}).get(gate) == "true", w["metadata"]  # Kueue's own mark: elastic
    cluster = kube.wait(lambda: next(iter(kube.custom.list_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", label_selector="ray.io/originated-from-cr-name=elastic")["items"]), None),
                        90, "KubeRay's RayCluster of the admitted RayService")
    assert cluster["spec"]["enableInTreeAutoscaling"] is True, cluster["spec"]
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 2), group
    assert (cluster["metadata"].get("annotations") or {}).get(gate) == "true"  # KubeRay copies it: elastic too

    def ungated_pods():
        pods = kube.core.list_namespaced_pod(ns, label_selector=f"{SERVICE_LABEL}=elastic").items
        roles = sorted((p.metadata.labels or {}).get("ray.io/node-type", "") for p in pods)
        gated = [p.metadata.name for p in pods if any(g.name == gate for g in p.spec.scheduling_gates or [])]
        return roles if roles == ["head", "worker"] and not gated else None
    kube.wait(ungated_pods, 90, "the head and the slice's host, ungated by Kueue")
    st = wait_phase(kube, ns, "elastic", "Pending", "Deploying", "Ready", plural="tputorchservices")
    assert condition(st, "Admitted")["status"] == "True" and st["clusterQueue"] == "tpu", st

    # Fixed from a range: Kueue refuses the elastic-job annotation's change, so the API server refuses the edit.
    fixed = {**body, "spec": {**body["spec"], "replicas": {"min": 2, "max": 2}}}
    refused = kubectl(kube.kubeconfig, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(fixed), check=False)
    assert refused.returncode != 0 and "between a fixed count (max == min) and a range" in refused.stderr, refused.stderr


def admitted_at_of(workload: dict) -> datetime.datetime:
    return since(next(c for c in workload["status"]["conditions"] if c["type"] == "Admitted"))


def since(cond: dict) -> datetime.datetime:
    when = timestamps.parse(cond["lastTransitionTime"])
    assert when is not None, cond
    return when


WORKLOAD_CRD = "workloads.kueue.x-k8s.io"


def podset_caps(kube) -> list:
    crd = json.loads(kubectl(kube.kubeconfig, "get", "crd", WORKLOAD_CRD, "-o", "json").stdout)
    return [v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["podSets"].get("maxItems")
            for v in crd["spec"]["versions"]]


def set_podset_caps(kube, cap: int, versions: int) -> None:
    ops = [{"op": "replace", "value": cap,
            "path": f"/spec/versions/{i}/schema/openAPIV3Schema/properties/spec/properties/podSets/maxItems"}
           for i in range(versions)]
    kubectl(kube.kubeconfig, "patch", "crd", WORKLOAD_CRD, "--type=json", "-p", json.dumps(ops))


def groups(n: int) -> list:
    return [{"name": f"g{i}", "cpu": "100m", "memory": "256Mi"} for i in range(n)]


def test_the_groups_cap_of_a_queued_job_follows_the_installed_kueues_workload_crd(kueue, queue_ns, operator):
    """Kueue 0.19.1's own Workload CRD takes 18 pod sets: a queued job of 6 groups (past the constant 5
    the operator had for Kueue 0.17) gets its Workload of 9 pod sets from the real Kueue, and one of 16
    is refused before any RayJob, with the installed cap. The CRD's cap set to 0.17's 8 (as an older
    Kueue installs it): the operator's watch refuses the next 6-group job; set back to 18, that job
    gets its RayJob. The jobs name a LocalQueue that does not exist, so none takes quota."""
    kube, ns = kueue, queue_ns
    caps = podset_caps(kube)
    assert set(caps) == {18}, caps  # Kueue v0.19.1, as hack/build.sh builds it
    apply(kube, ns, job_body("g16", priority=None, queue="nowhere", groups=groups(16)))
    apply(kube, ns, job_body("g6", priority=None, queue="nowhere", groups=groups(6)))
    st = wait_phase(kube, ns, "g16", "Failed")
    assert "spec.groups: '16 groups' must hold at most 15 groups while spec.queueName is set" in st["message"], st
    assert "at most 18 pod sets (the installed Kueue's Workload CRD" in st["message"], st
    w = kube.wait(lambda: workload_of(kube, ns, "g6"), 60, "Kueue's Workload of g6")
    assert len(w["spec"]["podSets"]) == 9  # head, the training slice, 6 groups, the submitter
    assert workload_of(kube, ns, "g16") is None
    set_podset_caps(kube, 8, len(caps))
    try:
        kube.wait(lambda: "Kueue's Workloads take at most 8 pod sets" in operator.log(), 60, "the operator seeing cap 8")
        apply(kube, ns, job_body("later", priority=None, queue="nowhere", groups=groups(6)))
        st = wait_phase(kube, ns, "later", "Failed")
        assert "must hold at most 5 groups while spec.queueName is set" in st["message"], st
        assert "at most 8 pod sets" in st["message"], st
        assert workload_of(kube, ns, "later") is None
    finally:
        set_podset_caps(kube, 18, len(caps))
    assert podset_caps(kube) == caps
    w = kube.wait(lambda: workload_of(kube, ns, "later"), 60, "the refused job's Workload once the cap is 18 again")
    assert len(w["spec"]["podSets"]) == 9


def suspended_by_kueue(kube, ns) -> bool:
    """Whether Kueue's admission webhook suspends a queued RayService (as the operator renders one,
    not suspended itself): a server-side dry run, nothing is created."""
    from tputorch.api import spec

    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": "probe", "namespace": ns},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/ray-vllm-torchtpu:2.60.0",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "queueName": "tpu"}}
    rayservice = render.rayservice(spec.parse_service(body))
    rayservice["spec"]["rayClusterConfig"].pop("suspend", None)
    made = kube.custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayservices", rayservice, dry_run="All")
    return made["spec"]["rayClusterConfig"].get("suspend") is True


def kueue_up(frameworks: str | None) -> None:
    """Kueue alone restarted with these integrations (None: the default ones): ~10 s, half a whole `up`."""
    env = {k: v for k, v in os.environ.items() if k != "KUEUE_FRAMEWORKS"}
    if frameworks is not None:
        env["KUEUE_FRAMEWORKS"] = frameworks
    subprocess.run([str(REPO / "hack" / "cluster.sh"), "kueue"], check=True, env=env)


def test_doctor_sees_the_ray_integrations_and_the_local_queue_and_a_kueue_without_rayservice(kueue, queue_ns, capsys,
                                                                                             tmp_path):
    """`tputorch doctor` reads Kueue's integrations from kueue-system/kueue-manager-config (what
    Kueue's manager mounts; the local cluster publishes there the config its Kueue runs with). A
    real Kueue restarted without ray.io/rayservice (its webhook for RayServices is then a no-op: a
    queued RayService is no longer suspended for admission, so it would start unqueued or, made
    suspended, never be admitted) gives its own ✗; then Kueue is restarted as it was."""
    from test_doctor import by_check, doctor, failed

    _, healthy = doctor(capsys, kueue.kubeconfig, queue_ns)
    checks = by_check(healthy)
    assert checks["kueue-integrations"]["status"] == "ok", checks["kueue-integrations"]
    assert checks["kueue-localqueues"]["status"] == "ok" and "tpu" in checks["kueue-localqueues"]["message"]
    assert suspended_by_kueue(kueue, queue_ns)

    # --for: a queued job is followed to the real Kueue's ClusterQueue (examples/kueue) and its
    # flavors: a 4x4 fits flavor v6e-4x4's 16 chips; a 2x4, whose pools exist, has no flavor there
    # (v6e-4x4 and v6e-2x2 name other topologies), so Kueue could never admit it.
    jobs = tmp_path / "queued.yaml"
    jobs.write_text(yaml.safe_dump_all([job_body("fits", priority=None),
                                        job_body("no-flavor", priority=None, tpu={"accelerator": "v6e", "topology": "2x4"})]))
    _, placed = doctor(capsys, kueue.kubeconfig, queue_ns, "--for", str(jobs))
    checks = by_check(placed)
    assert checks[f"for/{queue_ns}/fits"]["status"] == "ok", checks[f"for/{queue_ns}/fits"]
    no_flavor = checks[f"for/{queue_ns}/no-flavor"]
    assert no_flavor["status"] == "fail", no_flavor
    assert ("LocalQueue 'tpu''s ClusterQueue 'tpu' has no flavor that can ever hold 8 google.com/tpu: v6e-4x4 (its "
            "nodeLabels cloud.google.com/gke-tpu-topology=4x4, ") in no_flavor["message"], no_flavor["message"]
    assert "; v6e-2x2 (its nodeLabels cloud.google.com/gke-tpu-topology=2x2, " in no_flavor["message"]

    kueue_up("ray.io/rayjob ray.io/raycluster")
    try:
        assert not suspended_by_kueue(kueue, queue_ns), "Kueue still manages RayServices"
        code, report = doctor(capsys, kueue.kubeconfig, queue_ns)
    finally:
        kueue_up(None)
    assert suspended_by_kueue(kueue, queue_ns)
    fail = failed(report).get("kueue-integrations")
    # the only new ✗ (this module's operator runs as a process without the Lease: its ✗ is in both)
    assert code == 1 and set(failed(report)) - set(failed(healthy)) == {"kueue-integrations"}, failed(report)
    assert "ray.io/rayservice" in fail["message"] and "ray.io/rayjob" not in fail["message"]
    assert "integrations.frameworks" in fail["fix"]


# -- an operator upgrade, from the previous release to this checkout (issue 59) ------------------
# Here because it needs Kueue (a queued service and a queued job) and this module starts it.
RELEASES = REPO / "hack" / "release.py"
KUBERAY_HASH = "ray.io/hash-without-replicas-and-workers-to-delete"  # KubeRay 1.6.2, utils/constant.go
CHILDREN = ("rayclusters", "rayservices", "rayjobs")


def previous_release() -> str:
    """The commit to upgrade from: $TPUTORCH_UPGRADE_FROM, else hack/releases.tsv's newest release
    older than this checkout's version (0.2.0's commit for 0.3.0)."""
    import importlib.util

    import tputorch

    if os.environ.get("TPUTORCH_UPGRADE_FROM"):
        return os.environ["TPUTORCH_UPGRADE_FROM"]
    spec = importlib.util.spec_from_file_location("release", RELEASES)
    release = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(release)
    return release.previous_release(REPO, tputorch.__version__)["commit"]


@pytest.fixture
def previous_checkout(tmp_path):
    """The previous release's sources, checked out in a git worktree of its own (a CI clone has the history)."""
    commit = previous_release()
    where = tmp_path / "previous"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit], check=True,
                   capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False)


def children(kube, ns) -> dict:
    """(plural, name) -> what an upgrade must not change of each RayCluster, RayService and RayJob."""
    out = {}
    for plural in CHILDREN:
        for obj in kube.custom.list_namespaced_custom_object("ray.io", "v1", ns, plural)["items"]:
            meta = obj["metadata"]
            out[(plural, meta["name"])] = {"uid": meta["uid"], "generation": meta["generation"], "spec": obj["spec"],
                                           "hash": (meta.get("annotations") or {}).get(KUBERAY_HASH)}
    return out


def parents(kube, ns) -> dict:
    """(plural, name) -> the status fields no upgrade may move back (phase, attempt, cluster)."""
    out = {}
    for plural in ("tputorchjobs", "tputorchservices"):
        for obj in kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]:
            st = obj.get("status") or {}
            out[(plural, obj["metadata"]["name"])] = {k: st.get(k) for k in (
                "phase", "attempts", "observedGeneration", "rayClusterName", "readyReplicas")}
    return out


def reconciles(op, kind_part: str) -> float:
    """The operator's reconciles so far of the kinds whose label holds ``kind_part``."""
    total = 0.0
    for line in op.metrics().splitlines():
        if line.startswith("tputorch_reconciles_total{") and kind_part in line.split("}")[0].lower():
            total += float(line.rsplit(" ", 1)[1])
    return total


def reconciled_by(kube, op, services: int, jobs: int) -> None:
    """Once ``op`` has reconciled every object (its first reconciles: one per object), and 6 s more:
    three of KubeRay's 2 s requeues, in which it would start a new RayCluster for a changed hash."""
    kube.wait(lambda: reconciles(op, "service") >= services and reconciles(op, "job") >= jobs, 60,
              f"{services} service and {jobs} job reconciles")
    time.sleep(6)


def test_an_operator_upgrade_from_the_previous_release_changes_nothing_running(kueue, queue_ns, dashboard, kube_env,
                                                                               previous_checkout, tmp_path):
    """Issue 59. The previous release's operator (from its commit, hack/releases.tsv) makes: the
    reference service Ready, an autoscaled service, a service queued through Kueue (admitted, Ready),
    a job running its first attempt (admitted by Kueue), a job Queued behind the service's quota and
    a job Succeeded. Then the new CRDs and this checkout's operator in its place, as `helm upgrade`
    rolls the Deployment: no RayCluster, RayService or RayJob changes (generation, spec, KubeRay's
    cluster hash), no RayCluster is added, no attempt starts again, no status moves back, and no
    status write is refused by the new CRDs. A user's edit of one service then applies the new
    rendering to that service alone, and a downgrade to the previous operator changes nothing.
    TPUTORCH_UPGRADE_FROM=<commit> upgrades from another commit."""
    from operator_process import OperatorProcess, install_crd
    from tputorch.render import stamp as stamps

    kube, ns, old = kueue, queue_ns, previous_checkout
    for crd in sorted((old / "crds").glob("tputorch.io_*.yaml")):
        kubectl(kube.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(crd))
    ops = []

    def operator_from(source: Path, log: str) -> OperatorProcess:
        ops.append(OperatorProcess(kube.kubeconfig, tmp_path / log, [ns], dashboard_url=kube_env["dashboard_url"],
                                   source=source).start())
        return ops[-1]
    try:
        previous = operator_from(old / "operator", "previous.log")
        dashboard.set_serve_ready_after(1)
        reference = yaml.safe_load((old / "examples" / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
        hf = reference["spec"]["model"]["hfTokenSecret"]
        kubectl(kube.kubeconfig, "create", "secret", "generic", hf["name"], "-n", ns, f"--from-literal={hf['key']}=hf_x")
        ref = reference["metadata"]["name"]

        def service(name, topo, **extra):
            return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": name},
                    "spec": {"tpu": {"accelerator": "v6e", "topology": topo}, "image": "example.com/ray-vllm-torchtpu:2.60.0",
                             "model": {"source": "Qwen/Qwen3-0.6B"}, "head": {"cpu": "1", "memory": "2Gi"},
                             "worker": {"cpu": "4", "memory": "16Gi"}, **extra}}
        unqueued = job_body("done", priority=None, tpu={"accelerator": "v6e", "topology": "2x4"})
        del unqueued["spec"]["queueName"]
        for body in (reference, service("auto", "2x2", replicas={"min": 1, "max": 2}),
                     service("queued", "2x2", queueName="tpu"), unqueued,
                     job_body("train", priority=None, tpu={"accelerator": "v5p", "topology": "2x2x2"})):
            apply(kube, ns, body)
        # the queued service holds the v6e-2x2 flavor's quota: a 2x2 job queued after it waits
        wait_phase(kube, ns, "queued", "Ready", plural="tputorchservices", timeout=120)
        apply(kube, ns, job_body("waits", priority=None, tpu={"accelerator": "v6e", "topology": "2x2"}))
        finish(kube, dashboard, ns, "done")
        wait_phase(kube, ns, "done", "Succeeded")
        # mid-attempt: its Ray job submitted to attempt 1's cluster and running there
        cluster = wait_phase(kube, ns, "train", "Running")["rayClusterName"]
        kube.wait(lambda: (dashboard.get_job(ns, "train") or {}).get("cluster") == cluster, 90, "train's Ray job submitted")
        kube.wait(lambda: workload_of(kube, ns, "waits"), 60, "the queued job's Workload")
        wait_phase(kube, ns, "waits", "Queued")
        for name in (ref, "auto"):
            wait_phase(kube, ns, name, "Ready", plural="tputorchservices", timeout=180)
        before, statuses_before = children(kube, ns), parents(kube, ns)
        services = [ref, "auto", "queued"]
        assert {n for p, n in before if p == "rayservices"} == set(services)
        assert {n for p, n in before if p == "rayjobs"} >= {"train", "waits"}
        assert all(before[("rayservices", n)]["hash"] is None for n in services)  # KubeRay's hash is on the clusters
        active = {n: rayservice_of(kube, ns, n)["status"]["activeServiceStatus"]["rayClusterName"] for n in services}
        assert all(before[("rayclusters", c)]["hash"] for c in active.values()), before

        # helm upgrade: the new CRDs (by hand: helm never upgrades crds/), the Deployment rolled
        install_crd(kube.kubeconfig)
        previous.stop()
        new = operator_from(REPO / "operator", "new.log")
        reconciled_by(kube, new, services=3, jobs=3)
        after = children(kube, ns)
        assert set(after) <= set(before), f"new Ray objects: {set(after) - set(before)}"
        gone = set(before) - set(after)
        assert gone <= {("rayclusters", c) for p, c in before if p == "rayclusters" and c.startswith("done")}, gone
        changed = {k: (before[k], after[k]) for k in after if after[k] != before[k]}
        assert not changed, changed
        for name in services:
            rs = rayservice_of(kube, ns, name)["status"]
            assert rs["activeServiceStatus"]["rayClusterName"] == active[name]
            assert not (rs.get("pendingServiceStatus") or {}).get("rayClusterName"), (name, rs)
        assert parents(kube, ns) == statuses_before
        # each RayService made before the rule adopted as it is: its stamp records what it runs
        for name in services:
            rs = rayservice_of(kube, ns, name)
            stamp = stamps.read(rs)
            assert stamp is not None and stamp.version == stamps.UNKNOWN_VERSION, (name, rs["metadata"])
            assert stamp.rendering["spec"] == rs["spec"], name
        assert status(kube, ns, "train")["attempts"] == 1 and not status(kube, ns, "train").get("attemptHistory")
        # every status write the new operator made passed the new CRDs' schema and rules
        assert 'code="422"' not in new.metrics() and "Unprocessable" not in new.log(), new.log()[-3000:]

        # A downgrade (helm rollback: the previous operator again, the new CRDs kept) touches nothing either.
        new.stop()
        back = operator_from(old / "operator", "downgraded.log")
        reconciled_by(kube, back, services=3, jobs=3)
        rolled_back = children(kube, ns)
        assert set(rolled_back) <= set(after), f"new Ray objects: {set(rolled_back) - set(after)}"
        changed = {k: (after[k], rolled_back[k]) for k in rolled_back if rolled_back[k] != after[k]}
        assert not changed, changed
        assert parents(kube, ns) == statuses_before
        assert 'code="422"' not in back.metrics(), back.log()[-3000:]

        # Upgraded again, the user edits one service: the new operator's rendering, for it alone
        # (a new RayCluster of its own where this release changes a field inside KubeRay's hash).
        back.stop()
        again = operator_from(REPO / "operator", "new-again.log")
        edited = service("auto", "2x2", replicas={"min": 1, "max": 2}, engine={"maxModelLen": 4096})
        apply(kube, ns, edited)
        rs = kube.wait(lambda: (lambda r: r if "max_model_len: 4096" in r["spec"]["serveConfigV2"] else None)(
            rayservice_of(kube, ns, "auto")), 60, "the edit on auto's RayService")
        assert rs["metadata"]["generation"] > before[("rayservices", "auto")]["generation"]
        stamp = stamps.read(rs)
        assert (stamp.version, stamp.generation) == (stamps.OPERATOR_VERSION, 2), stamp
        kube.wait(lambda: status(kube, ns, "auto", "tputorchservices").get("observedGeneration") == 2, 60,
                  "auto's status of generation 2")
        time.sleep(4)  # two of KubeRay's requeues
        final = children(kube, ns)
        moved = {k for k in final if k in before and final[k]["generation"] != before[k]["generation"]}
        assert moved == {("rayservices", "auto")}, moved
        added = {name for plural, name in set(final) - set(before)}
        assert all(name.startswith("auto-") for name in added), f"the edit of auto made {added}"
        logs = previous.log() + new.log() + back.log() + again.log()
        assert "Traceback" not in logs and 'code="422"' not in again.metrics(), logs[-5000:]
    finally:
        for op in ops:
            op.stop()
        install_crd(kube.kubeconfig)
