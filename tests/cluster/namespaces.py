"""Test namespaces on the cluster: created labelled, deleted (and emptied) after use."""

from __future__ import annotations


def make_namespace(kube, name: str, labels: dict | None = None) -> str:
    from kubernetes import client

    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"tputorch.local/test": "true", **(labels or {})})))
    return name


# What a deleted namespace's leftovers can still hold that a later test feels: chips and node
# capacity (pods), Kueue quota (Workloads), KubeRay's and the operator's attention and the operator's
# per-phase gauges (the custom objects). Kinds whose CRD is not installed count as empty.
_HELD = (("tputorch.io", "v1alpha1", "tputorchjobs"), ("tputorch.io", "v1alpha1", "tputorchservices"),
         ("ray.io", "v1", "rayjobs"), ("ray.io", "v1", "rayservices"), ("ray.io", "v1", "rayclusters"),
         ("kueue.x-k8s.io", "v1beta2", "workloads"))


def delete_namespace(kube, name: str, wait: bool = True) -> None:
    """Delete, and by default wait until nothing in it holds what the next test needs (see _HELD).
    The namespace object itself may still be Terminating: the namespace controller's last passes
    over every resource type take ~5 s more even for an empty namespace, and hold nothing."""
    from kubernetes import client

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
