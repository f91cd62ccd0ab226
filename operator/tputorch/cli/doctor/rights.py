"""`tputorch doctor`'s checks of what a user needs: the GCS FUSE CSI driver, and the caller's own
rights in the namespace (SelfSubjectAccessReviews).
"""

from __future__ import annotations

from ...api import crd
from ...render.volumes import GCS_FUSE_DRIVER
from .result import DOC_GCSFUSE, DOC_RIGHTS, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown


def check_gcsfuse(driver: dict | None | Unread) -> list[Result]:
    if isinstance(driver, Unread):
        return [_unknown("gcsfuse", f"CSIDriver {GCS_FUSE_DRIVER}", driver)]
    if driver is None:
        return [Result("gcsfuse", WARN, f"no CSIDriver {GCS_FUSE_DRIVER}: a spec.volumes gcs volume cannot mount",
                       "enable the add-on: `gcloud container clusters update CLUSTER --update-addons GcsFuseCsiDriver=ENABLED`",
                       DOC_GCSFUSE)]
    return [Result("gcsfuse", OK, f"Cloud Storage FUSE CSI driver ({GCS_FUSE_DRIVER})")]


# What a user of the operator does (submit, serve, get, logs, delete), each a SelfSubjectAccessReview.
RIGHTS = (
    ("create", crd.GROUP, crd.PLURAL, "", "submit jobs"),
    ("create", crd.GROUP, crd.SERVICE_PLURAL, "", "serve models"),
    ("watch", crd.GROUP, crd.PLURAL, "", "follow jobs"),
    ("delete", crd.GROUP, crd.PLURAL, "", "delete jobs"),
    ("list", "", "pods", "", "find the Ray pods"),
    ("get", "", "pods", "log", "read driver logs"),
    ("list", "", "events", "", "see events"),
)


def check_rights(allowed: dict[tuple, bool | Unread], namespace: str, user: str) -> list[Result]:
    """allowed: RIGHTS entry -> the review's answer."""
    denied, unread = [], []
    for right in RIGHTS:
        answer = allowed.get(right)
        if isinstance(answer, Unread) or answer is None:
            unread.append(right)
        elif not answer:
            denied.append(right)
    if denied:
        shown = "; ".join(f"{v} {r}{'/' + sub if sub else ''} ({why})" for v, _, r, sub, why in denied)
        return [Result("rights", FAIL, f"{user} may not, in namespace {namespace}: {shown}",
                       f"bind the chart's tputorch-user ClusterRole: `kubectl -n {namespace} create rolebinding "
                       f"tputorch-user --clusterrole=tputorch-user --user=YOU`", DOC_RIGHTS)]
    if unread:
        return [Result("rights", UNKNOWN, f"could not review {len(unread)} of the caller's rights in {namespace}")]
    return [Result("rights", OK, f"{user} may submit, serve, follow, read logs and delete in {namespace}")]
