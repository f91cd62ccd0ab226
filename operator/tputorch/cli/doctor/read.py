"""The reads `tputorch doctor` makes: plain GETs (and SelfSubjectAccessReviews) with the user's
kubeconfig, each bounded in time, run side by side. What could not be read becomes an
`Unread` with the reason; every decision is in the check module of its area.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable

from kubernetes.client.rest import ApiException

from .. import client
from ...api import crd, topology
from ...status.kueue import WORKLOAD_CRD
from .cluster import LEASE_NAME, lease_names
from .identity import accounts_named
from .kuberay import KUBERAY_CRDS
from .kueue import KUEUE_DEPLOYMENT, KUEUE_LOCALQUEUE_CRD
from .result import Unread
from .rights import GCS_FUSE_DRIVER, RIGHTS

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
OPERATOR_SELECTOR = "app.kubernetes.io/part-of=tputorch,app.kubernetes.io/component=operator"
# KubeRay's Helm chart labels its Deployment kuberay-operator, its kustomize manifests kuberay (as
# `kubectl ray version` looks for it). GKE's Ray Operator add-on runs KubeRay outside the cluster:
# no Deployment of it is there to find (kuberay.check_kuberay says so).
KUBERAY_SELECTOR = "app.kubernetes.io/name in (kuberay-operator,kuberay)"
MAX_CONNECTIONS = 10  # the Kubernetes client's connection pool: more threads would each open their own


class Reader:
    def __init__(self, api_client, timeout: float):
        self.api_client = api_client
        self.timeout = timeout

    def call(self, path: str, method: str = "GET", query: list | None = None, body: dict | None = None):
        """The API's JSON answer; None for 404."""
        params = self.api_client.param_serialize(
            method, path, query_params=query or [], body=body, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": "application/json"})
        resp = self.api_client.call_api(*params, _request_timeout=self.timeout)
        data = resp.read()
        if resp.status == 404:
            return None
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp, body=data.decode("utf-8", "replace"), data=None)
        return json.loads(data)

    def items(self, path: str, **query) -> list[dict]:
        return (self.call(path, query=list(query.items())) or {}).get("items") or []


def _reason(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return client.api_error_message(err)
    return f"{type(err).__name__}: {err}"


def read_facts(api_client, namespace: str, specs: list | None, timeout: float = 10.0) -> dict:
    """Everything the checks look at (run_checks in __init__.py). Each read runs in its own thread and is
    given `timeout` seconds; one that errs or takes longer is an Unread, the rest still count."""
    r = Reader(api_client, timeout)
    namespaces = sorted({namespace} | {s.namespace for s in specs or []})
    crd_names = [crd.NAME, crd.SERVICE_NAME, *KUBERAY_CRDS.values(), KUEUE_LOCALQUEUE_CRD,
                 WORKLOAD_CRD]
    reads: dict[str, Callable[[], object]] = {
        "version": lambda: r.call("/version"),
        "user": lambda: (((r.call("/apis/authentication.k8s.io/v1/selfsubjectreviews", "POST", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}) or {}).get("status") or {})
            .get("userInfo") or {}).get("username"),
        "operator_deployments": lambda: r.items("/apis/apps/v1/deployments", labelSelector=OPERATOR_SELECTOR),
        "kuberay_deployments": lambda: r.items("/apis/apps/v1/deployments", labelSelector=KUBERAY_SELECTOR),
        "lease": lambda: _lease(r),
        "mutating_webhooks": lambda: r.items("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"),
        "validating_webhooks": lambda: r.items("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"),
        "nodes": lambda: r.items("/api/v1/nodes", labelSelector=topology.GKE_ACCELERATOR_LABEL),
        "kube_system_pods": lambda: r.items("/api/v1/namespaces/kube-system/pods"),
        "kueue_config": lambda: r.call("/api/v1/namespaces/kueue-system/configmaps/kueue-manager-config"),
        "kueue_deployment": lambda: r.call("/apis/apps/v1/namespaces/{}/deployments/{}".format(*KUEUE_DEPLOYMENT)),
        "gcsfuse_driver": lambda: r.call(f"/apis/storage.k8s.io/v1/csidrivers/{GCS_FUSE_DRIVER}"),
    }
    for name in crd_names:
        reads[f"crd:{name}"] = lambda name=name: r.call(CRD_PATH + name)
    accounts = accounts_named(specs or [])
    for ns, name in accounts:
        reads[f"sa:{ns}/{name}"] = lambda ns=ns, name=name: r.call(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}")
    for ns in namespaces:
        reads[f"quota:{ns}"] = lambda ns=ns: r.items(f"/api/v1/namespaces/{ns}/resourcequotas")
    for right in RIGHTS:
        verb, group, resource, sub, _ = right
        reads[f"right:{right}"] = lambda verb=verb, group=group, resource=resource, sub=sub: (
            (r.call("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "POST", body={
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                "resource": resource, "subresource": sub}}}) or {})
            .get("status") or {}).get("allowed", False)
    got = _run(reads, timeout)

    facts: dict = {k: got[k] for k in ("version", "operator_deployments", "kuberay_deployments", "lease",
                                        "mutating_webhooks", "validating_webhooks", "nodes", "kube_system_pods",
                                        "kueue_config", "kueue_deployment", "gcsfuse_driver")}
    facts["namespace"] = namespace
    facts["user"] = None if isinstance(got["user"], Unread) else got["user"]
    facts["crds"] = {name: got[f"crd:{name}"] for name in crd_names}
    lq_crd = facts["crds"][KUEUE_LOCALQUEUE_CRD]
    facts["kueue_installed"] = lq_crd if isinstance(lq_crd, Unread) else lq_crd is not None
    facts["quotas"] = {ns: got[f"quota:{ns}"] for ns in namespaces}
    facts["rights"] = {right: got[f"right:{right}"] for right in RIGHTS}
    facts["specs"] = specs
    facts["service_accounts"] = {(ns, name): got[f"sa:{ns}/{name}"] for ns, name in accounts}
    facts["local_queues"] = _local_queues(r, lq_crd, namespaces, timeout)
    facts["cluster_queues"], facts["resource_flavors"] = _kueue_quota(r, lq_crd, specs, timeout)
    return facts


def _lease(r: Reader) -> dict | None:
    """The operator's leader Lease: the one its Deployment names, else any Lease of the default
    name (an operator run outside a Deployment), the most recently renewed."""
    named = lease_names(r.items("/apis/apps/v1/deployments", labelSelector=OPERATOR_SELECTOR))
    if named:
        leases = [r.call(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}") for ns, name in named]
    else:
        leases = r.items("/apis/coordination.k8s.io/v1/leases", fieldSelector=f"metadata.name={LEASE_NAME}")
    return max((lease for lease in leases if lease), default=None,
               key=lambda lease: (lease.get("spec") or {}).get("renewTime") or "")


def _local_queues(r: Reader, lq_crd, namespaces: list[str], timeout: float) -> dict:
    """namespace -> its LocalQueues (through the CRD's storage version), [] without Kueue."""
    if isinstance(lq_crd, Unread):
        return {ns: lq_crd for ns in namespaces}
    if lq_crd is None:
        return {ns: [] for ns in namespaces}
    version = _storage_version(lq_crd)
    reads = {ns: (lambda ns=ns: r.items(f"/apis/kueue.x-k8s.io/{version}/namespaces/{ns}/localqueues"))
             for ns in namespaces}
    return _run(reads, timeout)


def _kueue_quota(r: Reader, lq_crd, specs: list | None, timeout: float) -> tuple:
    """(ClusterQueues, ResourceFlavors) for --for FILE with a queued job or service; (None, None)
    without one or without Kueue (its LocalQueue CRD not served)."""
    if not isinstance(lq_crd, dict) or not any(s.queue_name for s in specs or []):
        return None, None
    version = _storage_version(lq_crd)
    got = _run({kind: (lambda kind=kind: r.items(f"/apis/kueue.x-k8s.io/{version}/{kind}"))
                for kind in ("clusterqueues", "resourceflavors")}, timeout)
    return got["clusterqueues"], got["resourceflavors"]


def _storage_version(crd_obj: dict) -> str:
    return next((v["name"] for v in crd_obj["spec"]["versions"] if v.get("storage")), "v1beta1")


def _run(reads: dict[str, Callable[[], object]], timeout: float) -> dict:
    """The reads side by side; one not done by the deadline (its own timeout after the reads queued
    before it, plus a second's grace) is an Unread."""
    workers = min(len(reads), MAX_CONNECTIONS) or 1
    pool = ThreadPoolExecutor(max_workers=workers)
    deadline = time.monotonic() + timeout * -(-len(reads) // workers) + 1.0  # each read its own timeout
    try:
        futures = {key: pool.submit(fn) for key, fn in reads.items()}
        out = {}
        for key, future in futures.items():
            try:
                out[key] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                out[key] = Unread(f"no answer within {timeout:g} s")
            except Exception as err:  # the API's refusal or a dropped connection: that check says ?
                out[key] = Unread(_reason(err))
        return out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
