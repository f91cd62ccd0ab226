"""Test namespaces on the cluster: created labelled, deleted (and emptied) after use."""

from __future__ import annotations


def make_namespace(kube, name: str, labels: dict | None = None) -> str:
    from kubernetes import client

    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"tputorch.local/test": "true", **(labels or {})})))
    return name


# The account the examples that reach gs:// name (docs/tasks/bucket-access.md creates it and binds it to
# the bucket): without it the API server refuses their pods (ServiceAccount admission), as on GKE.
BUCKET_ACCOUNT = "ray-tpu"


def make_bucket_account(kube, namespace: str) -> str:
    from kubernetes import client

    kube.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=BUCKET_ACCOUNT)))
    return BUCKET_ACCOUNT


# What a deleted namespace's leftovers can still hold that a later test feels: chips and node
# capacity (pods), Kueue quota (Workloads), KubeRay's and the operator's attention and the operator's
# per-phase gauges (the custom objects). Kinds whose CRD is not installed count as empty.
_HELD = (("tputorch.io", "v1alpha1", "tputorchjobs"), ("tputorch.io", "v1alpha1", "tputorchservices"),
         ("ray.io", "v1", "rayjobs"), ("ray.io", "v1", "rayservices"), ("ray.io", "v1", "rayclusters"),
         ("kueue.x-k8s.io", "v1beta2", "workloads"))


def delete_namespace(kube, name: str, wait: bool = True) -> None:
    """Delete what it holds (_HELD), then the namespace, and by default wait until nothing in it
    holds what the next test needs. The namespace object itself may still be Terminating: the
    namespace controller's last passes over every resource type take ~5 s more even for an empty
    namespace, and hold nothing.

    The held kinds are deleted first, by the test as a user would, because the namespace controller
    alone takes ~10 s for them (measured: its first pass after ~5 s deletes the pods, the custom
    objects only go on its next pass), and that wait, at most tests' teardown, was ~10 minutes of
    `make test`. Owners before what they own: a pod deleted while its RayCluster exists comes back."""
    from kubernetes import client

    for group, version, plural in _HELD:
        try:
            # The answer (the deleted objects) left undecoded: a hostile test object nested deeper
            # than Python's JSON decoder recurses would fail the teardown (test_tenancy.py's). It is
            # read to its end all the same: a pooled connection with an unread body gives the next
            # request on it that body as its status line (urllib3 then retries, with a warning).
            answer = kube.custom.delete_collection_namespaced_custom_object(
                group, version, name, plural, propagation_policy="Background", _preload_content=False)
            answer.drain_conn()
            answer.release_conn()
        except client.ApiException as exc:
            if exc.status not in (404, 405):  # no such namespace, or the kind's CRD is not installed
                raise
    try:
        kube.core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as exc:
        if exc.status != 404:
            raise

    def items(group, version, plural):
        try:
            return kube.custom.list_namespaced_custom_object(group, version, name, plural, limit=1)["items"]
        except client.ApiException as exc:
            if exc.status == 404:
                return []
            raise

    def emptied():
        return not kube.core.list_namespaced_pod(name, limit=1).items and not any(items(*k) for k in _HELD)

    if wait:
        kube.wait(emptied, 180, f"namespace {name} emptied")
