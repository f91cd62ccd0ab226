"""A store that can never be listed, on the real API server (issue 34): Kueue's Workload CRD left
behind with a conversion webhook that points nowhere (Kueue uninstalled), so every list of
Workloads fails (500, or 429 "storage is (re)initializing" while the API server's watch cache cannot
fill). Jobs are still reconciled, and readiness and the metrics name the store.

Runs before test_kueue.py (which installs the real Kueue CRDs): the Workload CRD made here is the
stand-in for the one an uninstall leaves, and is deleted at the end.
"""

from __future__ import annotations

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


@pytest.fixture
def workloads_fail(kube, namespace):
    """A Workload stored as v1beta1, then the conversion pointed at a port nobody serves: listing
    v1beta2 (what the operator reads) needs a conversion, which fails."""
    def crd_exists():
        return kubectl(kube.kubeconfig, "get", "crd", CRD, check=False).returncode == 0
    if crd_exists():
        pytest.skip("Kueue's real Workload CRD is installed on this cluster (test_kueue.py ran before this module), "
                    "and replacing it would break that Kueue: run this module on a cluster without Kueue "
                    "(make test does: test_informer_sync sorts before test_kueue)")
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(_crd({"strategy": "None"})))
    kubectl(kube.kubeconfig, "wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=30s")
    try:
        kube.wait(lambda: kube.custom.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "workloads", {
            "apiVersion": f"{GROUP}/v1beta1", "kind": "Workload", "metadata": {"name": "left-behind"}, "spec": {}}),
            30, "a Workload stored as v1beta1")
        nowhere = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                                                      "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/convert"}}}
        kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(_crd(nowhere)))

        def list_fails():
            try:
                kube.custom.list_cluster_custom_object(GROUP, "v1beta2", "workloads")
            except ApiException as err:  # 500 (the webhook's failure), or 429 while its watch cache cannot fill
                return err.status in (429, 500)
            return False
        kube.wait(list_fails, 30, "the Workloads list to fail")
        yield
    finally:
        kubectl(kube.kubeconfig, "delete", "crd", CRD, "--ignore-not-found", "--wait=true", check=False)


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
