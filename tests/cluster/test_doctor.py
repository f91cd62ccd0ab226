"""`tputorch doctor` against the local cluster: the healthy cluster fails nothing, and each seeded
fault gives its own ✗ with its fix and exit 1. Every fault is undone in the test that made it.

One operator (leader-elected, as the chart runs it) serves the module; the operator-stopped test
runs last and stops it. `--smoke` against a real Ray head is in test_real_ray.py (its Ray head).
"""

from __future__ import annotations

import copy
import json
import shlex
import uuid
from pathlib import Path

import pytest
import yaml

import doccmds
from namespaces import delete_namespace, make_bucket_account, make_namespace
from operator_process import OperatorProcess, install_crd, kubectl

from tputorch.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
TPU_WEBHOOK = "tputorch-local-tpu-webhook"  # hack/cluster.sh's stand-in's configuration
# Not ✓ on the local cluster, and why (each is the honest answer there, not a fault):
LOCAL_NOT_OK = {
    "operator": "warn",  # the operator runs as a process, outside a Deployment (it holds the Lease)
    "kuberay-version": "unknown",  # KubeRay runs out of cluster: no Deployment to read a version from
    "tpu-webhook-validation": "warn",  # the stand-in mutates pods only
    "gcsfuse": "warn",  # no GCS FUSE CSI driver here
}


@pytest.fixture(scope="module")
def doctor_ns(kube):
    name = make_namespace(kube, f"doctor-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(kube, name)


@pytest.fixture(scope="module")
def leader(kube, kube_env, doctor_ns, tmp_path_factory):
    install_crd(kube.kubeconfig)
    op = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("doctor") / "operator.log", [doctor_ns],
                         dashboard_url=kube_env["dashboard_url"],
                         extra_args=["--leader-elect", "--lease-namespace", doctor_ns]).start()
    kube.wait(lambda: (kube_lease(kube, doctor_ns).get("spec") or {}).get("holderIdentity"), 30, "the operator to lead")
    yield op
    op.stop()


def kube_lease(kube, ns) -> dict:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        lease = client.CoordinationV1Api(kube.api_client).read_namespaced_lease("tputorch-operator", ns)
    except ApiException:
        return {}
    return kube.api_client.sanitize_for_serialization(lease)


def doctor(capsys, kubeconfig, namespace, *extra) -> tuple[int, dict]:
    code = cli.main(["doctor", "--kubeconfig", str(kubeconfig), "-n", namespace, "-o", "json", "--timeout", "5", *extra])
    out, err = capsys.readouterr()
    report = json.loads(out)
    return code, report


def by_check(report) -> dict:
    return {c["check"]: c for c in report["checks"]}


def failed(report) -> dict:
    return {c["check"]: c for c in report["checks"] if c["status"] == "fail"}


def test_healthy_cluster_fails_nothing(kube, leader, doctor_ns, capsys):
    code, report = doctor(capsys, kube.kubeconfig, doctor_ns)
    assert code == 0 and report["ok"], failed(report)
    checks = by_check(report)
    not_ok = {k: c["status"] for k, c in checks.items() if c["status"] != "ok"}
    network = not_ok.pop("network-policy", None)  # a heuristic: never ✓
    assert network in ("warn", "unknown")
    # with Kueue (KUEUE=1, or test_kueue.py ran first): this fresh namespace has no LocalQueue
    assert not_ok.pop("kueue-localqueues", "warn") == "warn"
    # and Kueue runs out of cluster: no Deployment kueue-system/kueue-controller-manager to read its version from
    assert not_ok.pop("kueue-version", "unknown") == "unknown"
    assert not_ok == LOCAL_NOT_OK, {k: checks[k]["message"] for k in not_ok}
    assert "holds the leader Lease" in checks["operator"]["message"]
    assert f"Lease {doctor_ns}/tputorch-operator" in checks["operator-lease"]["message"]
    pools = {row["pool"]: row for row in checks["tpu-pools"]["details"]}
    assert pools["tpu-v6e-4x4"]["hosts"] == 4 and pools["tpu-v6e-4x4"]["slices"] == 1
    assert pools["tpu-v5p-2x2x2"]["machineType"] == "ct5p-hightpu-4t"


def test_tpu_webhook_removed(kube, leader, doctor_ns, capsys):
    from kubernetes import client

    adm = client.AdmissionregistrationV1Api(kube.api_client)
    saved = kube.api_client.sanitize_for_serialization(adm.read_mutating_webhook_configuration(TPU_WEBHOOK))
    adm.delete_mutating_webhook_configuration(TPU_WEBHOOK)
    try:
        code, report = doctor(capsys, kube.kubeconfig, doctor_ns)
    finally:
        saved["metadata"] = {"name": TPU_WEBHOOK}
        adm.create_mutating_webhook_configuration(saved)
    assert code == 1
    assert set(failed(report)) == {"tpu-webhook"}
    assert "Ray Operator add-on" in failed(report)["tpu-webhook"]["fix"]
    assert failed(report)["tpu-webhook"]["doc"] == "docs/compatibility.md#the-ray-tpu-webhook"


def test_kuberay_crd_without_a_field_the_operator_writes(kube, leader, doctor_ns, capsys):
    """As an older KubeRay's CRD: RayJob without authOptions.secretName (KubeRay < 1.6)."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube.api_client)
    original = kube.api_client.sanitize_for_serialization(ext.read_custom_resource_definition("rayjobs.ray.io"))
    stripped = copy.deepcopy(original)
    v1 = next(v for v in stripped["spec"]["versions"] if v["name"] == "v1")
    auth = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rayClusterSpec"]["properties"]["authOptions"]
    del auth["properties"]["secretName"]
    ext.replace_custom_resource_definition("rayjobs.ray.io", stripped)
    job = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob", "metadata": {"name": "auth-pruned"},
           "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "i", "entrypoint": "python x.py",
                    "suspend": True}}  # suspended: KubeRay makes no cluster, the RayJob is all there is
    try:
        code, report = doctor(capsys, kube.kubeconfig, doctor_ns)
        # the operator's side of the same fault: the RayJob it made, as the API server stored it, lost
        # authOptions.secretName, and the job says so (a Warning event too)
        kubectl(kube.kubeconfig, "apply", "-n", doctor_ns, "-f", "-", input=yaml.safe_dump(job))
        auth = kube.wait(lambda: next((c for c in (kube.custom.get_namespaced_custom_object(
            "tputorch.io", "v1alpha1", doctor_ns, "tputorchjobs", "auth-pruned").get("status") or {}).get("conditions") or []
            if c["type"] == "RayAuth"), None), 30, "the job's RayAuth condition")
        stored = kube.custom.get_namespaced_custom_object("ray.io", "v1", doctor_ns, "rayjobs", "auth-pruned")
        assert stored["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}  # the API server pruned it
        assert (auth["status"], auth["reason"]) == ("False", "AuthSecretNameDropped"), auth
        kube.wait(lambda: [e for e in kube.core.list_namespaced_event(
            doctor_ns, field_selector="involvedObject.name=auth-pruned").items
            if e.reason == "AuthSecretNameDropped" and e.type == "Warning"], 30, "its Warning event")
    finally:
        kubectl(kube.kubeconfig, "delete", "-n", doctor_ns, "tputorchjob", "auth-pruned", "--ignore-not-found",
                "--wait=true", check=False)
        current = ext.read_custom_resource_definition("rayjobs.ray.io")
        original["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition("rayjobs.ray.io", original)
    assert code == 1
    assert set(failed(report)) == {"kuberay-crd/rayjobs.ray.io"}
    fail = failed(report)["kuberay-crd/rayjobs.ray.io"]
    assert fail["details"] == ["spec.rayClusterSpec.authOptions.secretName"]
    assert "upgrade KubeRay" in fail["fix"]


def test_for_a_shape_no_pool_has(kube, leader, doctor_ns, capsys, tmp_path):
    jobs = tmp_path / "jobs.yaml"
    base = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob",
            "spec": {"image": "i", "entrypoint": "python x.py"}}
    docs = [{**base, "metadata": {"name": "fits"}, "spec": {**base["spec"], "tpu": {"accelerator": "v6e", "topology": "4x4"}}},
            {**base, "metadata": {"name": "big"}, "spec": {**base["spec"], "tpu": {"accelerator": "v6e", "topology": "8x8"}}},
            # 60Gi of scratch on each host's boot disk: hack/nodes.yaml's nodes allocate 47G, as GKE's 100 GB default disk does
            {**base, "metadata": {"name": "disk"}, "spec": {**base["spec"], "tpu": {"accelerator": "v6e", "topology": "4x4"},
             "volumes": [{"name": "scratch", "mountPath": "/scratch", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "60Gi"}}]}}]
    jobs.write_text(yaml.safe_dump_all(docs))
    code, report = doctor(capsys, kube.kubeconfig, doctor_ns, "--for", str(jobs))
    assert code == 1
    checks = by_check(report)
    assert checks[f"for/{doctor_ns}/fits"]["status"] == "ok" and "tpu-v6e-4x4" in checks[f"for/{doctor_ns}/fits"]["message"]
    assert set(failed(report)) == {f"for/{doctor_ns}/big", f"for/{doctor_ns}/disk"}
    assert "--tpu-topology=8x8 --num-nodes=16" in failed(report)[f"for/{doctor_ns}/big"]["fix"]
    # the request is the volume plus the operator's 10Gi for logs, caches and the writable layer; 47G is 43.8Gi
    disk = failed(report)[f"for/{doctor_ns}/disk"]
    assert "70Gi ephemeral-storage" in disk["message"] and "tpu-v6e-4x4" in disk["message"], disk


def test_pool_one_node_short(kube, leader, doctor_ns, capsys):
    """A v6e 4x4 pool with one node of the four: a copy of a fake TPU node, labelled as its own pool."""
    node = kube.api_client.sanitize_for_serialization(kube.core.read_node("gke-tpu-v6e-4x4-0"))
    name = f"gke-doctor-short-{uuid.uuid4().hex[:4]}"
    labels = {**node["metadata"]["labels"], "kubernetes.io/hostname": name, "cloud.google.com/gke-nodepool": "doctor-short"}
    node["metadata"] = {"name": name, "labels": labels, "annotations": node["metadata"].get("annotations") or {}}
    kube.core.create_node(node)
    try:
        code, report = doctor(capsys, kube.kubeconfig, doctor_ns)
    finally:
        kube.core.delete_node(name)
    assert code == 1
    assert set(failed(report)) == {"tpu-pool/doctor-short"}
    fail = failed(report)["tpu-pool/doctor-short"]
    assert "1 ready node(s) of a 4-host v6e 4x4 slice, 3 short" in fail["message"]
    assert "multiple of 4" in fail["fix"]


def test_service_account_without_rights(kube, leader, doctor_ns, capsys, tmp_path):
    """The caller's rights, as a ServiceAccount with no RoleBinding (its own token's kubeconfig)."""
    from kubernetes import client

    kube.core.create_namespaced_service_account(doctor_ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody")))
    token = kube.core.create_namespaced_service_account_token(
        "nobody", doctor_ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=600))).status.token
    config = yaml.safe_load(open(kube.kubeconfig))
    cluster = config["clusters"][0]
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "nobody", "user": {"token": token}}],
        "contexts": [{"name": "nobody", "context": {"cluster": cluster["name"], "user": "nobody", "namespace": doctor_ns}}],
        "current-context": "nobody"}))
    code, report = doctor(capsys, kubeconfig, doctor_ns)
    assert code == 1
    assert report["user"] == f"system:serviceaccount:{doctor_ns}:nobody"
    fail = failed(report)
    assert set(fail) == {"rights"}, fail
    assert "create tputorchjobs" in fail["rights"]["message"] and "get pods/log" in fail["rights"]["message"]
    assert "rolebinding" in fail["rights"]["fix"]
    # what it may not read is a ? (never a ✓, never a ✗ it cannot know)
    assert by_check(report)["tpu-pools"]["status"] == "unknown"


def test_the_docs_doctor_commands_pass_on_the_healthy_cluster(kube, leader, doctor_ns, capsys, monkeypatch):
    """tasks/install.md's and troubleshooting.md's `tputorch doctor` lines, as written, from the
    repository's root (the examples' paths are relative to it), in the test's namespace."""
    cmds = {c.text for c in doccmds.tested_by("tests/cluster/test_doctor.py")}
    assert "tputorch doctor" in cmds and "tputorch doctor --for examples/v6e-4x4.yaml" in cmds, cmds
    # The example runs as the bound account getting-started creates before `doctor --for`
    # (which fails when the account a spec names is missing from its namespace).
    make_bucket_account(kube, doctor_ns)
    monkeypatch.chdir(REPO)
    for text in sorted(cmds):
        words = shlex.split(text)
        assert words[:2] == ["tputorch", "doctor"], text
        code, report = doctor(capsys, kube.kubeconfig, doctor_ns, *words[2:])
        assert code == 0, (text, failed(report))
        if "--for" in words:
            assert by_check(report)[f"for/{doctor_ns}/llama-v6e-4x4"]["status"] == "ok"


# ---------------------------------------------------------------- --smoke

SMOKE_KINDS = ("rayjobs.ray.io", "rayclusters.ray.io", "pods", "secrets", "networkpolicies", "jobs", "services")


def objects(kubeconfig, ns) -> set[str]:
    """What a namespace holds of the kinds the probe makes (and KubeRay makes for it)."""
    out = kubectl(kubeconfig, "get", ",".join(SMOKE_KINDS), "-n", ns, "-o", "name").stdout
    return set(out.split())


def controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty on stdin, as a shell
    gives a command it runs in the foreground."""
    import fcntl
    import os
    import signal
    import termios

    # A shell's foreground command gets SIGINT's default action, but a process started in the
    # background by a shell without job control (CI's runner, nohup ... &) inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: restore what a terminal's user has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_smoke_interrupted_leaves_nothing_behind(kube, leader, namespace):
    """Ctrl-C typed at a terminal (the pty's line discipline sends SIGINT) while KubeRay waits for the
    job (the stand-in dashboard says RUNNING by default): exit 130 and the namespace as before."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    before = objects(kube.kubeconfig, namespace)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "tputorch", "doctor", "--kubeconfig", kube.kubeconfig, "-n", namespace,
                             "--smoke", "--smoke-timeout", "120"], stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=controlling_terminal, env={**os.environ, "PYTHONPATH": str(REPO / "operator")})
    os.close(slave)
    output = b""
    try:
        end = time.monotonic() + 60
        while b"waiting for KubeRay" not in output and time.monotonic() < end and proc.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                output += os.read(master, 4096)
        assert b"waiting for KubeRay" in output, output.decode(errors="replace")
        kube.wait(lambda: any(o.startswith("raycluster") for o in objects(kube.kubeconfig, namespace)), 30,
                  "KubeRay to make the probe's RayCluster")
        os.write(master, b"\x03")  # Ctrl-C
        while proc.poll() is None and time.monotonic() < end + 60:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    output += os.read(master, 4096)
                except OSError:
                    break
        assert proc.wait(30) == 130, output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert b"interrupted: the smoke probe's objects are deleted" in output
    kube.wait(lambda: objects(kube.kubeconfig, namespace) == before, 30, "the namespace to hold what it held before")


def test_smoke_in_a_policy_mode_that_does_not_admit_kuberay(kube, leader, namespace, dashboard, capsys):
    """Strict NetworkPolicy mode with no KubeRay peer (`--smoke-policy-mode strict`, what an
    operator Deployment with those flags gives the probe by default; the local operator runs as a
    process), enforced as Dataplane V2 would (the stand-in dashboard asks cyclonus, see
    test_network.py; KubeRay calls from outside the pod network, as the GKE add-on's may): the
    probe's Ray job runs and its submitter ends, KubeRay's status calls are dropped, KubeRay fails
    the RayJob 30 s later, and the doctor says why with the fix, exit 1, the namespace as before."""
    import threading

    network = dashboard._call("PUT", "/network", {"enforce": True, "reset": True})
    assert network["enforce"] and "hosted" in network["identities"]["kuberay"], network
    before = objects(kube.kubeconfig, namespace)
    stop = threading.Event()

    def the_run_succeeds():  # as `ray job submit` from the submitter pod does: KubeRay is not needed for it
        while not stop.wait(0.5):
            probes = [j["metadata"]["name"] for j in kube.custom.list_namespaced_custom_object(
                "ray.io", "v1", namespace, "rayjobs")["items"] if j["metadata"]["name"].startswith("tputorch-smoke-")]
            if probes:
                dashboard.set_job_status(namespace, probes[0], "SUCCEEDED")
                return

    helper = threading.Thread(target=the_run_succeeds, daemon=True)
    helper.start()
    try:
        code, report = doctor(capsys, kube.kubeconfig, namespace, "--smoke", "--smoke-policy-mode", "strict",
                              "--smoke-timeout", "180")
    finally:
        stop.set()
        helper.join(10)
    assert code == 1
    fail = failed(report)
    assert set(fail) == {"smoke"}, fail
    assert "KubeRay could not reach the Ray dashboard" in fail["smoke"]["message"]
    assert "JobDeploymentStatusTransitionGracePeriodExceeded" in fail["smoke"]["message"]
    assert "networkPolicy.mode=open" in fail["smoke"]["fix"] and "networkPolicy.kuberay" in fail["smoke"]["fix"]
    dropped = [r for r in dashboard.requests(namespace=namespace) if r.get("dropped")]
    assert dropped and all(r["path"].startswith("/api/") for r in dropped)  # the policy's doing, not a stand-in's
    kube.wait(lambda: objects(kube.kubeconfig, namespace) == before, 30, "the namespace to hold what it held before")


def test_zz_operator_stopped(kube, leader, doctor_ns, capsys):
    leader.stop()  # SIGTERM: it releases the Lease, as a pod that is deleted does
    code, report = doctor(capsys, kube.kubeconfig, doctor_ns)
    assert code == 1
    fail = failed(report)
    assert set(fail) == {"operator", "operator-lease"}, fail
    assert "held by no one" in fail["operator-lease"]["message"]
    assert "no operator Deployment" in fail["operator"]["message"]
