"""What every `tputorch doctor` check shares: the statuses, a check's Result, an Unread fact, the
doc sections the fixes link to, and reading a version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...api.identity import RUNBOOK_STEP
from ...api.quantity import quantity_value


OK, FAIL, WARN, UNKNOWN = "ok", "fail", "warn", "unknown"
SYMBOLS = {OK: "✓", FAIL: "✗", WARN: "!", UNKNOWN: "?"}

DOCS = "docs/"  # the project's docs folder
DOC_COMPAT_K8S = DOCS + "compatibility.md#kubernetes-and-gke"
DOC_COMPAT_KUBERAY = DOCS + "compatibility.md#kuberay"
DOC_COMPAT_KUEUE = DOCS + "compatibility.md#kueue"
DOC_WEBHOOK = DOCS + "compatibility.md#the-ray-tpu-webhook"
DOC_OPERATOR = DOCS + "tasks/install.md#the-operator"
DOC_OPERATOR_TROUBLE = DOCS + "troubleshooting.md#the-operator"
DOC_POOLS = DOCS + "tasks/tpu-capacity.md#one-node-pool-per-slice"
DOC_QUOTA = DOCS + "troubleshooting.md#quota-and-capacity"
DOC_KUEUE = DOCS + "tasks/kueue.md#gke-specifics"
DOC_KUEUE_ELASTIC = DOCS + "tasks/kueue.md#autoscaled-queued-services"
DOC_NETWORK = DOCS + "concepts/reconcile-and-ownership.md#policies"
DOC_GCSFUSE = DOCS + "tasks/install.md#the-cluster"
DOC_RIGHTS = DOCS + "concepts/tenancy-and-auth.md#who-may-submit-jobs"
DOC_IDENTITY = RUNBOOK_STEP  # the Workload Identity task page


@dataclass(frozen=True)
class Unread:
    """A fact the reader could not get: the API's error or a timeout."""
    reason: str


@dataclass
class Result:
    check: str  # a stable id, for -o json
    status: str
    message: str
    fix: str = ""
    doc: str = ""
    details: list = field(default_factory=list)  # e.g. the TPU pool table's rows

    def as_dict(self) -> dict:
        out = {"check": self.check, "status": self.status, "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.doc:
            out["doc"] = self.doc
        if self.details:
            out["details"] = self.details
        return out


def _unknown(check: str, what: str, fact: Unread) -> Result:
    return Result(check, UNKNOWN, f"{what}: could not read ({fact.reason})")


def parse_version(text: str) -> tuple[int, ...] | None:
    """`v1.34.4-gke.100` -> (1, 34, 4); None for something that is no version."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def image_version(deployments: list[dict]) -> str | None:
    """The version a Deployment's image tag names (quay.io/kuberay/operator:v1.6.2 -> 1.6.2; a digest
    after the tag is ignored, an image by digest alone has no version): the first container that has one."""
    for d in deployments:
        for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            name = (c.get("image") or "").partition("@")[0]
            tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
            parsed = parse_version(tag)
            if parsed:
                return ".".join(map(str, parsed))
    return None


def quantity(text: str | int | None) -> float:
    """A Kubernetes quantity as a number, read by the API's own parser (api.quantity.quantity_value);
    None (a field not there) is 0."""
    return 0.0 if text is None else float(quantity_value(text))
