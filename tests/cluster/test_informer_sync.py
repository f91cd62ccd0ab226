"""A store that can never be listed, on the real API server (issue 34): Kueue's Workload CRD left
behind with a conversion webhook that points nowhere (Kueue uninstalled), so every list of
Workloads fails (500, or 429 "storage is (re)initializing" while the API server's watch cache cannot
fill). Jobs are still reconciled, and readiness and the metrics name the store.

On a cluster without Kueue (make test runs this module before test_kueue.py) the Workload CRD made
here is the stand-in for the one an uninstall leaves, and is deleted at the end. On one where Kueue
runs (test_kueue.py ran first), Kueue's own CRD is broken the same way and put back as it was.
"""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client.rest import ApiException

from operator_process import OperatorProcess, free_port, http_get, kubectl, tputorch_crd  # noqa: F401 (fixtures)
from test_operator_e2e import apply, get_rayjob, job_body

GROUP = "kueue.x-k8s.io"
CRD = f"workloads.{GROUP}"


def _crd(conversion: dict) -> dict:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": CRD},
            "spec": {"group": GROUP, "scope": "Namespaced", "conversion": conversion,
                     "names": {"plural": "workloads", "singular": "workload", "kind": "Workload", "listKind": "WorkloadList"},
                     "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": schema},
                                  {"name": "v1beta2", "served": True, "storage": False, "schema": schema}]}}


def _nowhere() -> dict:
    return {"url": f"https://127.0.0.1:{free_port()}/convert"}


def _list_fails(kube) -> bool:
    try:
        kube.custom.list_cluster_custom_object(GROUP, "v1beta2", "workloads")
    except ApiException as err:  # 500 (the webhook's failure), or 429 while its watch cache cannot fill
        return err.status in (429, 500)
    return False


@pytest.fixture
def workloads_fail(kube, namespace):
    """A Workload stored as v1beta1, then the conversion pointed at a port nobody serves: listing
    v1beta2 (what the operator reads) needs a conversion, which fails."""
    crd = kubectl(kube.kubeconfig, "get", "crd", CRD, "-o", "json", check=False)
    if crd.returncode == 0:
        yield from _kueues_crd_broken(kube, namespace, json.loads(crd.stdout))
        return
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(_crd({"strategy": "None"})))
    kubectl(kube.kubeconfig, "wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=30s")
    try:
        kube.wait(lambda: kube.custom.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "workloads", {
            "apiVersion": f"{GROUP}/v1beta1", "kind": "Workload", "metadata": {"name": "left-behind"}, "spec": {}}),
            30, "a Workload stored as v1beta1")
        nowhere = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": _nowhere()}}
        kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(_crd(nowhere)))
        kube.wait(lambda: _list_fails(kube), 30, "the Workloads list to fail")
        yield
    finally:
        kubectl(kube.kubeconfig, "delete", "crd", CRD, "--ignore-not-found", "--wait=true", check=False)


def _kueues_crd_broken(kube, namespace, saved: dict):
    """Kueue's own Workload CRD (v1beta2 stored, conversion by Kueue's webhook): v1beta1 made the
    storage version for one valid Workload, then the conversion pointed nowhere, as an uninstall
    leaves it. Kueue's own Workload lists fail meanwhile. Put back as it was after: the conversion,
    the storage version, the Workload gone and the CRD's storedVersions."""
    index = {v["name"]: i for i, v in enumerate(saved["spec"]["versions"])}

    def patch(*ops, subresource=()):
        kubectl(kube.kubeconfig, "patch", "crd", CRD, *subresource, "--type=json", "-p", json.dumps(list(ops)))

    def storage(version):
        return [{"op": "replace", "path": f"/spec/versions/{i}/storage", "value": name == version} for name, i in index.items()]

    workload = {"apiVersion": f"{GROUP}/v1beta1", "kind": "Workload", "metadata": {"name": "left-behind"},
                "spec": {"queueName": "nowhere", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "example.com/x:1"}]}}}]}}
    patch(*storage("v1beta1"))
    try:
        kube.wait(lambda: kube.custom.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "workloads", workload),
                  30, "a Workload stored as v1beta1")
        patch({"op": "replace", "path": "/spec/conversion/webhook/clientConfig", "value": _nowhere()})
        kube.wait(lambda: _list_fails(kube), 30, "the Workloads list to fail")
        yield
    finally:
        patch({"op": "replace", "path": "/spec/conversion/webhook/clientConfig",
               "value": saved["spec"]["conversion"]["webhook"]["clientConfig"]}, *storage("v1beta2"))
        kube.wait(lambda: not _list_fails(kube) and kube.custom.list_cluster_custom_object(GROUP, "v1beta2", "workloads"),
                  60, "the Workloads list back")
        kubectl(kube.kubeconfig, "delete", "workloads.v1beta2.kueue.x-k8s.io", "-n", namespace, "left-behind",
                "--ignore-not-found", "--wait=true", "--timeout=60s")
        patch({"op": "replace", "path": "/status/storedVersions", "value": saved["status"]["storedVersions"]},
              subresource=("--subresource=status",))


def test_a_workloads_list_that_fails_for_ever_holds_no_job_and_readiness_names_it(kube, namespace, tputorch_crd,
                                                                                  workloads_fail, tmp_path):
    ready_port = free_port()
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [namespace],
                         extra_args=["--readiness", f"http://127.0.0.1:{ready_port}/readyz"]).start()
    try:
        apply(kube, namespace, job_body("despite-kueue", topo="2x2"))
        # the optional store is waited for 30 s at most (handlers.OPTIONAL_SYNC_WAIT)
        kube.wait(lambda: get_rayjob(kube, namespace, "despite-kueue"), 90, "the RayJob, without Kueue's store")
        code, text = http_get(f"http://127.0.0.1:{ready_port}/readyz")
        assert code == 200, text
        assert "not listed (optional, running without): Kueue Workloads (HTTP " in text
        assert 'tputorch_informer_listed{resource="Kueue Workloads"} 0.0' in op.metrics()
        assert 'tputorch_informer_listed{resource="rayjobs"} 1.0' in op.metrics()
        assert "running without Kueue Workloads (HTTP " in op.log()
    finally:
        op.stop()
    assert "Traceback" not in op.log(), op.log()[-5000:]
