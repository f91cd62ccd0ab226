"""Ray's token authentication on every cluster: the authOptions a child renders, and a child's
token Secret (its name, and the Secret the operator makes for it), for a RayJob and a RayService alike."""

from __future__ import annotations

import hashlib

from .names import JOB_LABEL, MANAGED_BY_LABEL, SERVICE_LABEL

# Ray's token authentication on every cluster (KubeRay 1.6 `authOptions`): KubeRay starts every Ray
# container, the submitter and its own dashboard calls with the token of the cluster's Secret. That
# Secret is the operator's, which needs the token for its own dashboard reads (a job's progress, a
# service's slice check): named on the child when it is created (with_ray_token_secret), made right
# after it and owned by it (ray_token_secret), so it outlives the child's deletion, whose finalizer
# still calls the head. A RayService made before services got one (0.2.0) keeps KubeRay's own
# Secret until the user's edit starts it a new RayCluster (controller/child.py). A head without auth
# runs whatever reaches its ports with the pods' ServiceAccount, Workload Identity and Secrets.
RAY_AUTH = {"mode": "token"}
RAY_AUTH_TOKEN_KEY = "auth_token"  # the Secret's key KubeRay reads

# Where each child kind holds its RayCluster's spec: (field, child kind, the label its objects carry).
_CLUSTER_FIELDS = (("rayClusterSpec", "RayJob", JOB_LABEL), ("rayClusterConfig", "RayService", SERVICE_LABEL))


def _cluster_of(child: dict) -> tuple[str, str, str]:
    """(field, kind, label) of the child's kind, told by its spec (a listed object carries no kind)."""
    spec = child.get("spec") or {}
    return next((f for f in _CLUSTER_FIELDS if f[0] in spec), _CLUSTER_FIELDS[0])


def cluster_field(child: dict) -> str:
    """The field of the child's spec that holds its RayCluster's spec."""
    return _cluster_of(child)[0]


def ray_token_secret_name(child: dict) -> str | None:
    """The Secret a child's cluster takes its token from, when it names one."""
    cluster = (child.get("spec") or {}).get(cluster_field(child)) or {}
    auth = cluster.get("authOptions") if isinstance(cluster, dict) else None
    return auth.get("secretName") if isinstance(auth, dict) else None


def new_ray_token_secret_name(child_name: str, suffix: str) -> str:
    """A name of one child's alone (the suffix is random): never one a deleted child still holds."""
    return f"{child_name}-ray-token-{suffix}"


def later_ray_token_secret_name(child: dict) -> str:
    """The name an existing child that names no token Secret of the operator's is given (a RayService
    made before services got one, on the edit that starts it a new RayCluster): drawn from its uid,
    so a patch sent again before its watch event names the same Secret; the child's alone, as a
    random one is."""
    meta = child["metadata"]
    return new_ray_token_secret_name(meta["name"], hashlib.sha256(str(meta.get("uid") or "").encode()).hexdigest()[:6])


def is_ray_token_secret_of(child: dict, secret_name: str | None) -> bool:
    """The name is one the operator gives this child's token Secret (not any Secret of the namespace)."""
    return bool(secret_name) and secret_name.startswith(new_ray_token_secret_name(child["metadata"]["name"], ""))


def with_ray_token_secret(child: dict, secret_name: str) -> None:
    child["spec"][cluster_field(child)]["authOptions"] = {**RAY_AUTH, "secretName": secret_name}


def ray_token_secret(child: dict, token: str) -> dict:
    """The Secret with a child's token, owned by the child (deleted after it, not before)."""
    meta = child["metadata"]
    _, kind, label = _cluster_of(child)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": ray_token_secret_name(child), "namespace": meta["namespace"],
                     "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in (label, MANAGED_BY_LABEL)},
                     "ownerReferences": [{"apiVersion": child.get("apiVersion", "ray.io/v1"), "kind": kind,
                                          "name": meta["name"], "uid": meta["uid"]}]},
        "stringData": {RAY_AUTH_TOKEN_KEY: token},
    }
