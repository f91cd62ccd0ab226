"""RayService statuses as KubeRay 1.6.2's controller wrote them in
test_edits_kuberay_never_applies_and_an_upgrade_that_cannot_start_are_said, kept for the unit tests
of the operator's status (tests/unit/status/data/rayservice-recorded.yaml). Each run compares what
KubeRay wrote with the recording, in what the operator's decisions read of it (`shape`), so the
recording cannot drift from the KubeRay the suite runs; TPUTORCH_RECORD_RAYSERVICES=1 writes it anew."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

FILE = Path(__file__).resolve().parents[1] / "unit" / "status" / "data" / "rayservice-recorded.yaml"
HEADER = ("# RayService statuses recorded from KubeRay v1.6.2 on the local cluster by tests/cluster/\n"
          "# recorded_rayservices.py (test_service_e2e.py): per service, before and after its edit.\n")


def keep(rs: dict) -> dict:
    """What the unit tests use of a RayService: its generation and KubeRay's status."""
    return {"generation": rs["metadata"]["generation"], "status": rs.get("status") or {}}


def _cluster(part: dict | None) -> dict:
    part = part or {}
    apps = part.get("applicationStatuses") or {}
    return {"cluster": bool(part.get("rayClusterName")),
            "apps": {name: app.get("status") for name, app in sorted(apps.items())}}


def shape(kept: dict) -> dict:
    """What the operator's status derivation reads of a RayService status, without names and times."""
    st = kept["status"]
    return {"current": st.get("observedGeneration") == kept["generation"],
            "serviceStatus": st.get("serviceStatus"),
            "serving": bool(st.get("numServeEndpoints")),
            "conditions": sorted((c["type"], c["status"], c["reason"]) for c in st.get("conditions") or []),
            "active": _cluster(st.get("activeServiceStatus")), "pending": _cluster(st.get("pendingServiceStatus"))}


def check_or_record(live: dict[str, dict[str, dict]]) -> None:
    """live: stage -> service name -> RayService."""
    now = {name: {stage: keep(by_name[name]) for stage, by_name in live.items()}
           for name in next(iter(live.values()))}
    if os.environ.get("TPUTORCH_RECORD_RAYSERVICES") == "1":
        FILE.write_text(HEADER + yaml.safe_dump(now, sort_keys=True, width=200))
        return
    recorded = yaml.safe_load(FILE.read_text())
    got = {name: {stage: shape(k) for stage, k in stages.items()} for name, stages in now.items()}
    want = {name: {stage: shape(k) for stage, k in stages.items()} for name, stages in recorded.items()}
    assert got == want, f"KubeRay's statuses differ from {FILE.name}'s (record anew: TPUTORCH_RECORD_RAYSERVICES=1)"
