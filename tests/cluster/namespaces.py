"""Test namespaces on the cluster: created labelled, deleted (and waited for) after use."""

from __future__ import annotations


def make_namespace(kube, name: str, labels: dict | None = None) -> str:
    from kubernetes import client

    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"tputorch.local/test": "true", **(labels or {})})))
    return name


def delete_namespace(kube, name: str, wait: bool = True) -> None:
    """Delete, and by default wait until it is gone: its pods hold fake TPU chips that the next
    test's slice needs."""
    from kubernetes import client

    try:
        kube.core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as exc:
        if exc.status != 404:
            raise

    def gone():
        try:
            kube.core.read_namespace(name)
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    if wait:
        kube.wait(gone, 180, f"namespace {name} deleted")
