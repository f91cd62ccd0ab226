"""The local API server's audit log (hack/audit-policy.yaml: writes to RayJobs and RayServices, with
their request bodies): who wrote what to KubeRay's objects, as the API server saw it."""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPERATOR_AGENT = "OpenAPI-Generator/"  # the kubernetes Python client's user agent: the operator's writes


def writes(ns: str, resource: str = "rayjobs", verbs=("update", "patch")) -> list[dict]:
    """Audit entries of writes to this namespace's `resource`, the status subresource left out."""
    path = Path(os.environ.get("TPUTORCH_CLUSTER_DIR", REPO / ".cluster")) / "logs" / "audit.log"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if (e.get("objectRef") or {}).get("namespace") == ns
            and (e.get("objectRef") or {}).get("resource") == resource
            and not (e.get("objectRef") or {}).get("subresource") and e.get("verb") in verbs]


def agent(entry: dict) -> str:
    return entry.get("userAgent") or ""


def by_operator(entries: list[dict]) -> list[dict]:
    return [e for e in entries if agent(e).startswith(OPERATOR_AGENT)]
