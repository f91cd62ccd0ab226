"""Whether the RayJob / RayService as the API server keeps it still asks KubeRay for Ray token
authentication. The operator always renders ``authOptions`` (render/raytoken.py RAY_AUTH); a KubeRay whose CRD
lacks the field (structural schema pruning drops unknown fields without an error) starts the Ray
cluster without it. Pure functions: the reconcile hands in the child as its store holds it.
"""

from __future__ import annotations

from ..render import raytoken
from ..api.phases import RAY_AUTH
from .conditions import AUTH_OPTIONS_DROPPED, AUTH_SECRET_NAME_DROPPED, TOKEN_AUTH, condition

UPGRADE = ("upgrade KubeRay to 1.6 or later (docs/compatibility.md), then delete and re-create this object: "
           "the objects made before keep what the API server stored")


def ray_auth_condition(child_kind: str, child: dict | None, own_secret: bool, generation: int) -> dict | None:
    """RayAuth, once the child exists: True when it carries ``authOptions`` as rendered; False when
    the API server dropped it (the cluster runs without token auth: ``AuthOptionsDropped``) or, for a
    child the operator names its token Secret on (``own_secret``: a job), dropped only the Secret's
    name (KubeRay 1.5.1 knows ``mode`` alone: its cluster has a token of KubeRay's own, which the
    operator's progress reads do not have: ``AuthSecretNameDropped``)."""
    if child is None:
        return None
    field = raytoken.cluster_field(child)
    path = f"spec.{field}.authOptions"
    name = (child.get("metadata") or {}).get("name", "")
    options = ((child.get("spec") or {}).get(field) or {}).get("authOptions") or {}
    if options.get("mode") != raytoken.RAY_AUTH["mode"]:
        return condition(RAY_AUTH, False, AUTH_OPTIONS_DROPPED, (
            f"the {child_kind} {name} was created with {path}.mode: token, and the API server kept "
            f"{path} = {options or 'nothing'}: the installed KubeRay's {child_kind} CRD lacks the field (KubeRay "
            f"before 1.5.1), so the Ray cluster runs WITHOUT token authentication: every pod its NetworkPolicy "
            f"admits can submit jobs and run code with the Ray pods' ServiceAccount, Workload Identity and "
            f"Secrets; {UPGRADE}"), generation)
    if own_secret and not options.get("secretName"):
        return condition(RAY_AUTH, False, AUTH_SECRET_NAME_DROPPED, (
            f"the {child_kind} {name} was created with {path}.secretName, and the API server dropped it: the "
            f"installed KubeRay's {child_kind} CRD knows only {path}.mode (KubeRay 1.5), so KubeRay gave the "
            f"Ray cluster a token of its own, which the operator does not have: the cluster has token "
            f"authentication, but the training progress cannot be read from its dashboard; {UPGRADE}"), generation)
    where = (f"the token of Secret {options['secretName']}" if options.get("secretName") else
             "the token of the Secret KubeRay made for its RayCluster")
    return condition(RAY_AUTH, True, TOKEN_AUTH,
                     f"Ray token authentication: every Ray port and the dashboard of the cluster need {where}",
                     generation)
