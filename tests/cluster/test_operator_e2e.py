"""The operator end to end on a real API server with KubeRay and fake GKE TPU node pools.

TPUTorchJob -> RayJob -> RayCluster -> pods on the right TPU nodes -> status back on the
TPUTorchJob, driven to success or failure through the stand-in Ray dashboard. The 4x4 job also
runs under the chart's default NetworkPolicy as the stand-in enforces it (test_network.py has the
strict mode and the rest of the pod network).
"""

from __future__ import annotations

import copy
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from namespaces import make_bucket_account
from operator_process import kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)
from test_network import enforce, verdicts

from tputorch import render
from tputorch.render.names import JOB_LABEL, MANAGED_BY_LABEL
from tputorch.api import spec, topology

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def job_body(name: str, accelerator="v6e", topo="4x4", **spec_extra) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTorchJob",
        "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": accelerator, "topology": topo}, "image": "example.com/ray-torch-tpu:2.60.0",
                 "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                 "worker": {"cpu": "4", "memory": "16Gi"}, **spec_extra},
    }


def apply(kube, namespace: str, body: dict, check=True):
    return kubectl(kube.kubeconfig, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=check)


def get_job(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def job_status(kube, ns, name) -> dict:
    return get_job(kube, ns, name).get("status") or {}


def condition(st: dict, ctype: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def wait_phase(kube, ns, name, phase, timeout=120):
    return kube.wait(lambda: (lambda s: s if s.get("phase") == phase else None)(job_status(kube, ns, name)),
                     timeout, f"TPUTorchJob {ns}/{name} phase {phase}")


def get_rayjob(kube, ns, name):
    return kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", name)


def events_for(kube, ns, name) -> list:
    return [(e.type, e.reason) for e in kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TPUTorchJob").items]


def wait_events(kube, ns, name, *expected, timeout=30):
    """Events are posted by their own worker after the status patch: wait until all expected are there."""
    return kube.wait(lambda: (lambda have: have if set(expected) <= have else None)(set(events_for(kube, ns, name))),
                     timeout, f"events {expected} on {name}")


def pods_of(kube, ns, job):
    return kube.core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={job}").items


@pytest.fixture
def enforced(dashboard):
    return enforce(dashboard)


def test_v6e_4x4_runs_on_its_slice_and_succeeds(kube, kube_env, namespace, enforced, operator, dashboard):
    """Also the pod network with the chart's defaults (open mode, issue 41), enforced by the stand-in
    with KubeRay hosted outside the pod network: the job reaches Succeeded through KubeRay's own status
    path, every progress read passes, and from another namespace Ray's ports stay closed."""
    body = example("v6e-4x4.yaml")
    name = body["metadata"]["name"]
    make_bucket_account(kube, namespace)  # the example's spec.serviceAccountName, as the runbook makes it
    apply(kube, namespace, body)

    rayjob = kube.wait(lambda: get_rayjob(kube, namespace, name), 30, "RayJob")
    owner = rayjob["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TPUTorchJob", name, True)
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["numOfHosts"] == 4

    st = wait_phase(kube, namespace, name, "Running", 180)
    st = kube.wait(lambda: (lambda s: s if s.get("hostsReady") == "4/4" else None)(job_status(kube, namespace, name)),
                   120, "4/4 hosts ready")
    assert st["workers"] == 16 and condition(st, "SliceReady")["status"] == "True"
    assert st["rayClusterName"].startswith(name)
    assert condition(st, "NetworkPolicyReady")["status"] == "True"

    nodes = {n.metadata.name: n.metadata.labels for n in kube.core.list_node().items}
    pods = pods_of(kube, namespace, name)
    heads = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "head"]
    workers = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "worker"]
    assert len(heads) == 1 and "cloud.google.com/gke-tpu-accelerator" not in nodes[heads[0].spec.node_name]
    assert len(workers) == 4
    assert len({w.spec.node_name for w in workers}) == 4, "one TPU host per node"
    for w in workers:
        labels = nodes[w.spec.node_name]
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
        assert labels["cloud.google.com/gke-tpu-topology"] == "4x4"
        assert w.spec.containers[0].resources.limits["google.com/tpu"] == "4"
        assert w.metadata.labels.get("app.kubernetes.io/name") == "kuberay"  # the GKE webhook needs it

    dashboard.set_job_status(namespace, name, "SUCCEEDED")
    st = wait_phase(kube, namespace, name, "Succeeded", 180)
    assert st["completionTime"] and st["jobStatus"] == "SUCCEEDED"
    assert condition(st, "Succeeded")["status"] == "True"
    # one event per transition (AllHostsReady too when the hosts were ready in a write before Running)
    wait_events(kube, namespace, name, ("Normal", "Created"), ("Normal", "Running"), ("Normal", "JobSucceeded"))
    assert ("Normal", "JobFinished") not in events_for(kube, namespace, name)  # JobSucceeded says it
    metrics = operator.metrics()
    assert 'tputorch_reconciles_total{kind="TPUTorchJob",result="created"} 1.0' in metrics
    assert 'tputorch_jobs{phase="Succeeded"} 1.0' in metrics
    # KubeRay's status reads and the operator's progress reads all passed the network; cyclonus decided
    reads = [r for r in dashboard.requests(namespace=namespace) if r["path"].startswith("/api/jobs/")]
    assert reads and all(r.get("status_code") == 200 and not r.get("dropped") for r in reads), reads[-3:]
    assert dashboard._call("GET", "/network")["verdicts_cached"] >= 1
    # From another namespace: Ray's ports are closed, the dashboard open but Ray auth refuses a call
    # without the cluster's token (the stand-in answers as a Ray 2.60 head, recorded).
    policy = kube.custom.get_namespaced_custom_object("networking.k8s.io", "v1", namespace, "networkpolicies",
                                                      f"{name}-rayjob")
    head = {"metadata": {"namespace": namespace, "labels": {JOB_LABEL: name, "ray.io/node-type": "head"}}}
    other = {"metadata": {"namespace": "elsewhere", "labels": {"app": "notebook"}}}
    assert verdicts([policy], [(other, head, port) for port in (6379, 10001, 43215, 8265)]) == [False, False, False, True]
    proxy = urllib.request.build_opener(urllib.request.ProxyHandler({"http": kube_env["dashboard_url"]}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        proxy.open(f"http://{st['rayClusterName']}-head-svc.{namespace}.svc.cluster.local:8265/api/jobs/", timeout=10)
    assert refused.value.code in (401, 403)


def test_failing_job_reports_kuberays_message(kube, namespace, operator, dashboard):
    apply(kube, namespace, job_body("fails"))
    wait_phase(kube, namespace, "fails", "Running", 180)
    dashboard.set_job_status(namespace, "fails", "FAILED", message="RuntimeError: boom in train.py", submitter_exit_code=1)
    st = wait_phase(kube, namespace, "fails", "Failed", 180)
    assert condition(st, "Failed")["status"] == "True"
    assert st["completionTime"]
    wait_events(kube, namespace, "fails", ("Warning", condition(st, "Failed")["reason"]))


def test_single_host_job(kube, namespace, operator, dashboard):
    body = example("v6e-2x2-single-host.yaml")
    body["spec"]["worker"] = {"cpu": "4", "memory": "16Gi"}
    name = body["metadata"]["name"]
    apply(kube, namespace, body)
    st = wait_phase(kube, namespace, name, "Running", 180)
    st = kube.wait(lambda: (lambda s: s if s.get("hostsReady") == "1/1" else None)(job_status(kube, namespace, name)), 120, "1/1")
    assert st["workers"] == 4
    (worker,) = [p for p in pods_of(kube, namespace, name) if p.metadata.labels.get("ray.io/node-type") == "worker"]
    node = kube.core.read_node(worker.spec.node_name)
    assert node.metadata.labels["cloud.google.com/gke-tpu-topology"] == "2x2"
    dashboard.set_job_status(namespace, name, "SUCCEEDED")
    wait_phase(kube, namespace, name, "Succeeded", 180)


def test_a_2x4_on_two_4_chip_hosts_never_lands_on_the_8_chip_node(kube, namespace, operator):
    """v6e 2x4 with chipsPerHost 4 beside an 8-chip v6e 2x4 node (hack/nodes.yaml): by topology label and
    chips both 4-chip pods fit on the 8-chip node; the machine type in the node selector keeps them off it.
    With the two 4-chip nodes cordoned the hosts wait; uncordoned, they land one on each."""
    four_chip = ["gke-tpu-v6e-2x4-0", "gke-tpu-v6e-2x4-1"]
    body = job_body("two-vms", topo="2x4")
    body["spec"]["tpu"]["chipsPerHost"] = 4

    def cordon(flag: bool) -> None:
        for node in four_chip:
            kube.core.patch_node(node, {"spec": {"unschedulable": flag}})

    def workers():
        return [p for p in pods_of(kube, namespace, "two-vms") if p.metadata.labels.get("ray.io/node-type") == "worker"]

    def unschedulable(pod) -> bool:
        return any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or [])

    cordon(True)
    try:
        apply(kube, namespace, body)
        waiting = kube.wait(lambda: (lambda ws: ws if len(ws) == 2 and all(map(unschedulable, ws)) else None)(workers()),
                            120, "both 2x4 hosts unschedulable while the 4-chip nodes are cordoned")
        assert not any(w.spec.node_name for w in waiting), [w.spec.node_name for w in waiting]
    finally:
        cordon(False)
    placed = kube.wait(lambda: (lambda ws: ws if len(ws) == 2 and all(w.spec.node_name for w in ws) else None)(workers()),
                       120, "both 2x4 hosts scheduled")
    assert sorted(w.spec.node_name for w in placed) == four_chip


def test_slice_missing_from_the_cluster_says_why(kube, namespace, operator):
    """No v6e 8x8 node pool exists: the real scheduler's message on a TPU host pod is read as such,
    and the status names the node labels the slice needs."""
    apply(kube, namespace, job_body("no-pool", topo="8x8"))
    st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "NoMatchingNodePool" else None)(
        job_status(kube, namespace, "no-pool")), 120, "SliceReady=NoMatchingNodePool")
    assert st["phase"] == "Pending"
    msg = condition(st, "SliceReady")["message"]
    assert msg.startswith("no node pool has the node labels this slice needs: cloud.google.com/gke-tpu-accelerator="
                          "tpu-v6e-slice, cloud.google.com/gke-tpu-topology=8x8, "
                          "node.kubernetes.io/instance-type=ct6e-standard-4t;"), msg
    assert "Unschedulable: no nodes are available: " in msg and "didn't match Pod's node affinity/selector" in msg, msg
    assert st["message"] == msg
    wait_events(kube, namespace, "no-pool", ("Warning", "NoMatchingNodePool"))


def test_a_host_whose_disk_volumes_no_node_holds_is_unschedulable(kube, namespace, operator):
    """60Gi of scratch on each host's boot disk: the operator requests it (plus 10Gi) and the real
    scheduler finds no node with that much allocatable (hack/nodes.yaml: GKE's 100 GB default disk,
    47G); the status says so in the scheduler's words, not that a node pool is missing."""
    scratch = [{"name": "scratch", "mountPath": "/scratch", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "60Gi"}}]
    apply(kube, namespace, job_body("disk", topo="2x2", volumes=scratch))
    st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "Unschedulable" else None)(
        job_status(kube, namespace, "disk")), 120, "SliceReady=Unschedulable")
    msg = condition(st, "SliceReady")["message"]
    assert "Insufficient ephemeral-storage" in msg, msg
    worker = next(p for p in kube.core.list_namespaced_pod(namespace).items if p.metadata.name.startswith("disk-")
                  and "worker" in p.metadata.name)
    ray = next(c for c in worker.spec.containers if c.name == "ray-worker")
    assert ray.resources.requests["ephemeral-storage"] == "70Gi" and "ephemeral-storage" not in (ray.resources.limits or {})


def test_a_multi_host_slice_without_the_tpu_webhook_says_so(kube, namespace, operator, dashboard):
    """The local cluster's stand-in TPU webhook (hack/tpu_webhook.py) leaves out a namespace labelled
    tputorch.io/tpu-webhook=off: there the slice's pods are created as on a GKE cluster without the
    webhook, every host Running and Ready, and the job says why it cannot train."""
    kube.core.patch_namespace(namespace, {"metadata": {"labels": {"tputorch.io/tpu-webhook": "off"}}})
    apply(kube, namespace, job_body("no-webhook"))
    st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "TPUWebhookMissing" else None)(
        job_status(kube, namespace, "no-webhook")), 120, "SliceReady=TPUWebhookMissing")
    assert st["phase"] == "Pending"
    msg = condition(st, "SliceReady")["message"]
    assert re.match(r"pod no-webhook-\S+-worker-\S+, a host of a 4-host TPU slice, was created without TPU_WORKER_ID and "
                    r"TPU_WORKER_HOSTNAMES: the GKE Ray TPU webhook", msg), msg
    assert st["message"] == msg
    workers = [p for p in pods_of(kube, namespace, "no-webhook") if p.metadata.labels.get("ray.io/node-type") == "worker"]
    assert workers and all(not any((e.name or "").startswith("TPU_WORKER") for e in p.spec.containers[0].env or [])
                           for p in workers)
    wait_events(kube, namespace, "no-webhook", ("Warning", "TPUWebhookMissing"))


def test_invalid_job_fails_with_every_error_and_no_rayjob(kube, namespace, operator):
    # Passes the CRD's schema (8 is an allowed chipsPerWorker, env names are free-form) but not spec.py.
    body = job_body("bad")
    body["spec"]["tpu"]["chipsPerWorker"] = 8
    body["spec"]["env"] = [{"name": "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "value": "1"}]
    apply(kube, namespace, body)
    st = wait_phase(kube, namespace, "bad", "Failed", 60)
    c = condition(st, "Validated")
    assert (c["status"], c["reason"]) == ("False", "ValidationFailed")
    assert "spec.tpu.chipsPerWorker: 8 must divide the 4 chips" in c["message"]
    assert "spec.env[0].name" in c["message"]
    wait_events(kube, namespace, "bad", ("Warning", "ValidationFailed"))
    with pytest.raises(ApiException) as err:
        get_rayjob(kube, namespace, "bad")
    assert err.value.status == 404
    assert 'tputorch_validation_failures_total{kind="TPUTorchJob"} 1' in operator.metrics()


@pytest.mark.parametrize(
    "mutate,fragment",
    [
        (lambda b: b["spec"]["tpu"].update(topology="4x5"), "topology 4x5 is not a v6e slice on GKE"),
        (lambda b: b["spec"]["tpu"].update(slices=2), "must be 1: a TPUTorchJob runs on one slice"),
        (lambda b: b["spec"]["tpu"].update(accelerator="v9"), "Unsupported value: \"v9\""),
        (lambda b: b["metadata"].update(name="n" * 48), "at most 47 characters"),
        (lambda b: b["spec"].update(shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=5), "unless spec.shutdownAfterJobFinishes is true"),
    ],
)
def test_admission_refuses_what_the_crd_can_check(kube, namespace, tputorch_crd, mutate, fragment):
    body = job_body("admission")
    mutate(body)
    proc = apply(kube, namespace, body, check=False)
    assert proc.returncode != 0
    assert fragment in proc.stderr, proc.stderr


def test_tpu_block_is_immutable(kube, namespace, tputorch_crd):
    apply(kube, namespace, job_body("immutable", suspend=True))
    changed = job_body("immutable", topo="2x2", suspend=True)
    proc = apply(kube, namespace, changed, check=False)
    assert proc.returncode != 0 and "spec.tpu is immutable" in proc.stderr, proc.stderr


def test_deleting_the_job_removes_rayjob_raycluster_and_pods(kube, namespace, operator):
    apply(kube, namespace, job_body("gc", topo="2x2"))
    wait_phase(kube, namespace, "gc", "Running", 180)
    assert pods_of(kube, namespace, "gc")
    kubectl(kube.kubeconfig, "delete", "-n", namespace, "tputorchjob", "gc", "--wait=true", "--timeout=60s")
    kube.wait(lambda: not kube.custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs")["items"], 60, "RayJob gone")
    kube.wait(lambda: not kube.custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"], 60, "RayCluster gone")
    kube.wait(lambda: not pods_of(kube, namespace, "gc"), 90, "pods gone")


def test_rayjob_deleted_behind_our_back_is_recreated(kube, namespace, operator):
    apply(kube, namespace, job_body("recreate", topo="2x2"))
    first = kube.wait(lambda: get_rayjob(kube, namespace, "recreate"), 30, "RayJob")
    kube.custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", "recreate")
    second = kube.wait(lambda: (lambda r: r if r["metadata"]["uid"] != first["metadata"]["uid"] else None)(
        get_rayjob(kube, namespace, "recreate")), 60, "a new RayJob")
    assert second["metadata"]["ownerReferences"][0]["name"] == "recreate"


def test_suspend_reaches_the_rayjob(kube, namespace, operator):
    apply(kube, namespace, job_body("pause", topo="2x2", suspend=True))
    rayjob = kube.wait(lambda: get_rayjob(kube, namespace, "pause"), 30, "RayJob")
    assert rayjob["spec"]["suspend"] is True
    wait_phase(kube, namespace, "pause", "Suspended", 120)
    assert not [p for p in pods_of(kube, namespace, "pause")]
    apply(kube, namespace, job_body("pause", topo="2x2", suspend=False))
    kube.wait(lambda: get_rayjob(kube, namespace, "pause")["spec"]["suspend"] is False, 30, "RayJob resumed")
    wait_phase(kube, namespace, "pause", "Running", 180)


def test_children_stay_in_the_jobs_namespace(kube, namespace, operator):
    body = job_body("here", topo="2x2")
    body["metadata"]["namespace"] = namespace
    apply(kube, namespace, body)
    rayjob = kube.wait(lambda: get_rayjob(kube, namespace, "here"), 30, "RayJob")
    assert rayjob["metadata"]["namespace"] == namespace
    others = kube.custom.list_cluster_custom_object("ray.io", "v1", "rayjobs", label_selector=f"{JOB_LABEL}=here")["items"]
    assert {r["metadata"]["namespace"] for r in others} == {namespace}


ALL_SLICES = topology.all_slices()


def test_every_supported_slice_renders_a_rayjob_the_api_server_accepts(kube, namespace):
    """Server-side dry run against KubeRay's real CRD schema, for every slice in the table."""
    docs = []
    for i, s in enumerate(ALL_SLICES):
        body = job_body(f"s{i}-{s.generation.name}-{s.topology.replace('x', '-')}", accelerator=s.generation.name, topo=s.topology)
        body["spec"]["tpu"]["chipsPerHost"] = s.chips_per_host
        body["metadata"]["namespace"] = namespace
        docs.append(render.rayjob(spec.parse(copy.deepcopy(body))))
    proc = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("created (server dry run)") == len(ALL_SLICES)


def test_a_foreign_rayjob_with_the_same_name_is_reported_not_taken_over(kube, namespace, operator):
    foreign = render.rayjob(spec.parse(job_body("taken", topo="2x2", suspend=True)))
    foreign["metadata"]["namespace"] = namespace
    foreign["metadata"]["labels"] = {"team": "someone-else"}
    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", foreign)
    apply(kube, namespace, job_body("taken", topo="2x2", suspend=True))
    st = kube.wait(lambda: (lambda s: s if condition(s, "RayJobCreated").get("reason") == "RayJobNameTaken" else None)(
        job_status(kube, namespace, "taken")), 60, "RayJobCreated=False RayJobNameTaken")
    assert st["phase"] == "Pending" and "does not belong to this TPUTorchJob" in st["message"]
    assert "ownerReferences" not in get_rayjob(kube, namespace, "taken")["metadata"]


# --- hostile objects (issue 34) ------------------------------------------------------------------

HOSTILE = 30  # of each kind, ~1 MB each: ~90 MB that the operator reads and must not keep
REAL_JOBS = 6
CHART_MEMORY_LIMIT = 512 * 2**20  # charts/tputorch-operator/values.yaml resources.limits.memory


def _hostile(kind: str, i: int) -> dict:
    """An object any tenant may make with our managed-by label: nothing of ours controls it."""
    labels = {MANAGED_BY_LABEL: "tputorch-operator", JOB_LABEL: "victim"}
    meta = {"name": f"hostile-{i}", "labels": labels}
    if kind == "pods":  # never scheduled (no node has the label): it stays, as it is, in the store's list
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeSelector": {"nowhere": "true"},
                         "containers": [{"name": "c", "image": "busybox", "env": [{"name": "B", "value": "x" * 1_000_000}]}]}}
    if kind == "networkpolicies":  # 15,000 selector values of 63 characters
        values = [f"{j:063d}" for j in range(15_000)]
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
                "spec": {"podSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": values}]}}}
    # CRD-valid (runtimeEnv is free-form to the API server), refused by the parser (over 32 KiB)
    body = job_body(f"hostile-{i}", runtimeEnv={"env_vars": {f"V{j}": "x" * 30_000 for j in range(30)}})
    body["metadata"]["labels"] = labels
    return body


def _rss(pid: int, field: str) -> int:
    """The process's resident set now (VmRSS) or at its peak (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def test_hostile_objects_of_another_namespace_cost_nothing_while_real_jobs_run(kube, namespace, tputorch_crd,
                                                                               kube_env, tmp_path):
    """Another namespace (one the operator watches) makes pods and NetworkPolicies with our managed-by
    label and large TPUTorchJobs the parser refuses, while real jobs start: the operator keeps its
    memory under the chart's limit, does not restart, and every real job is reconciled."""
    from namespaces import delete_namespace, make_namespace
    from operator_process import OperatorProcess

    tenant = make_namespace(kube, f"{namespace[:50]}-tenant")
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [namespace, tenant],
                         dashboard_url=kube_env["dashboard_url"]).start()
    try:
        before = _rss(op.proc.pid, "VmRSS")
        for i in range(HOSTILE):
            kube.core.create_namespaced_pod(tenant, _hostile("pods", i))
            kube.custom.create_namespaced_custom_object("networking.k8s.io", "v1", tenant, "networkpolicies",
                                                        _hostile("networkpolicies", i))
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, tenant, PLURAL, _hostile("tputorchjobs", i))
            if i < REAL_JOBS:
                apply(kube, namespace, job_body(f"real-{i}"))
        for i in range(REAL_JOBS):
            st = kube.wait(lambda: (lambda s: s if condition(s, "RayJobCreated").get("status") == "True" else None)(
                job_status(kube, namespace, f"real-{i}")), 180, f"real-{i}'s RayJob")
            assert st["phase"] in ("Pending", "Running"), st
            get_rayjob(kube, namespace, f"real-{i}")
        for i in range(HOSTILE):  # refused, with only their refusal kept
            st = wait_phase(kube, tenant, f"hostile-{i}", "Failed", 120)
            validated = condition(st, "Validated")
            assert validated["reason"] == "ValidationFailed" and "spec.runtimeEnv" in validated["message"], validated
        assert op.proc.poll() is None, op.log()[-3000:]  # never restarted
        peak = _rss(op.proc.pid, "VmHWM")
        # ~90 MB of foreign objects went through its informers: kept whole they were that much and more
        assert peak < CHART_MEMORY_LIMIT and peak - before < 64 * 2**20, \
            f"peak RSS {peak / 2**20:.0f} MiB, {before / 2**20:.0f} MiB before the hostile objects"
    finally:
        op.stop()
        delete_namespace(kube, tenant)
    assert "Traceback" not in op.log(), op.log()[-5000:]
