"""Ray's token authentication on every cluster: the authOptions a child renders, and a RayJob's
token Secret (its name, and the Secret the operator makes for it)."""

from __future__ import annotations

from .names import JOB_LABEL, MANAGED_BY_LABEL

# Ray's token authentication on every cluster (KubeRay 1.6 `authOptions`): KubeRay starts every Ray
# container, the submitter and its own dashboard calls with the token of the cluster's Secret. A
# service's Secret is KubeRay's own (one per RayCluster, owned by it). A job's is the operator's,
# which needs the token for its progress reads: named on the RayJob when it is created
# (with_ray_token_secret), made right after it and owned by it (ray_token_secret), so it outlives
# the RayJob's deletion, whose finalizer still calls the head. A head without auth runs whatever
# reaches its ports with the pods' ServiceAccount, Workload Identity and Secrets.
RAY_AUTH = {"mode": "token"}
RAY_AUTH_TOKEN_KEY = "auth_token"  # the Secret's key KubeRay reads


def ray_token_secret_name(rayjob: dict) -> str | None:
    """The Secret a RayJob's cluster takes its token from, when the operator named one."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    return (cluster.get("authOptions") or {}).get("secretName")


def new_ray_token_secret_name(rayjob_name: str, suffix: str) -> str:
    """A name of one RayJob's alone (the suffix is random): never one a deleted RayJob still holds."""
    return f"{rayjob_name}-ray-token-{suffix}"


def is_ray_token_secret_of(rayjob: dict, secret_name: str | None) -> bool:
    """The name is one the operator gives this RayJob's token Secret (not any Secret of the namespace)."""
    return bool(secret_name) and secret_name.startswith(new_ray_token_secret_name(rayjob["metadata"]["name"], ""))


def with_ray_token_secret(rayjob: dict, secret_name: str) -> None:
    rayjob["spec"]["rayClusterSpec"]["authOptions"] = {**RAY_AUTH, "secretName": secret_name}


def ray_token_secret(rayjob: dict, token: str) -> dict:
    """The Secret with a RayJob's token, owned by the RayJob (deleted after it, not before)."""
    meta = rayjob["metadata"]
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": ray_token_secret_name(rayjob), "namespace": meta["namespace"],
                     "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in (JOB_LABEL, MANAGED_BY_LABEL)},
                     "ownerReferences": [{"apiVersion": rayjob.get("apiVersion", "ray.io/v1"), "kind": "RayJob",
                                          "name": meta["name"], "uid": meta["uid"]}]},
        "stringData": {RAY_AUTH_TOKEN_KEY: token},
    }
