"""`tputorch doctor`: can this cluster run a TPUTorchJob and a TPUTorchService, and what to fix.

Every check is a pure function over what read.py read from the cluster (plain dicts, as the API
returns them), so each is tested with dicts. A fact that could not be read is an `Unread` (its
reason), and a check over it says `?`, never `✓`. Each result: ok ✓, fail ✗ (with the fix and the
doc section), warn ! or unknown ?. Exit code 0 when nothing failed, else 1.

The checks, one module per area:
  cluster.py   the API server's version, this operator's CRDs, its Deployment and leader Lease
  kuberay.py   KubeRay: its CRDs serve what the operator writes, its version, the Ray TPU webhook
  pools.py     the TPU node pools, and (--for FILE) whether a job or service can ever be placed
  identity.py  (--for FILE) the ServiceAccount each job or service names exists in its namespace
  kueue.py     Kueue's Ray integrations, LocalQueues and pod-set cap; whether a queue can ever admit
  network.py   NetworkPolicy enforcement and the operator's policy mode
  rights.py    the GCS FUSE CSI driver and the caller's own rights in the namespace
  result.py    what they share: the statuses, a check's Result, an Unread fact, the doc sections
Around them: read.py reads the facts the checks look at, smoke.py runs `--smoke`'s Ray job (and
deletes it), and storage_probe.py is what that job runs for `--storage-path`. This module puts the
checks together and formats their results; `tputorch doctor` (cli/main.py cmd_doctor) calls it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterable

from ...status.kueue import WORKLOAD_CRD
from .cluster import check_kubernetes, check_operator, check_tputorch_crds
from .kuberay import check_kuberay, check_tpu_webhook
from .kueue import check_kueue, check_kueue_elastic, check_kueue_version, kueue_frameworks, kueue_quota_check, kueue_rayservice_enabled
from .identity import check_service_accounts
from .network import check_network
from .pools import check_placement, check_pools, pools_table
from .result import FAIL, OK, SYMBOLS, UNKNOWN, WARN, Result
from .rights import check_gcsfuse, check_rights


# ---------------------------------------------------------------- putting it together

def run_checks(facts: dict, now: datetime | None = None) -> list[Result]:
    """Every check over what was read. facts: see read.read_facts."""
    now = now or datetime.now(timezone.utc)
    kueue_rs = kueue_rayservice_enabled(facts["kueue_installed"], kueue_frameworks(facts["kueue_config"]))
    results = []
    results += check_kubernetes(facts["version"])
    results += check_tputorch_crds(facts["crds"])
    results += check_operator(facts["operator_deployments"], facts["lease"], now)
    results += check_kuberay(facts["crds"], facts["kuberay_deployments"], kueue_rs)
    results += check_tpu_webhook(facts["mutating_webhooks"], facts["validating_webhooks"])
    results += check_pools(facts["nodes"])
    results += check_network(facts["kube_system_pods"], facts["operator_deployments"], facts["kuberay_deployments"])
    results += check_kueue_version(facts["kueue_installed"], facts["kueue_deployment"])
    results += check_kueue_elastic(facts["kueue_installed"], facts["kueue_config"], facts["kueue_deployment"])
    results += check_kueue(facts["kueue_installed"], kueue_frameworks(facts["kueue_config"]),
                           facts["local_queues"].get(facts["namespace"], []), facts["namespace"],
                           facts["crds"].get(WORKLOAD_CRD))
    results += check_gcsfuse(facts["gcsfuse_driver"])
    results += check_rights(facts["rights"], facts["namespace"], facts.get("user") or "you")
    if facts.get("specs") is not None:
        results += check_placement(facts["specs"], facts["nodes"], facts["quotas"], facts["local_queues"],
                                   facts.get("cluster_queues"), facts.get("resource_flavors"),
                                   kueue_quota_check(facts.get("kueue_config")))
        results += check_service_accounts(facts["specs"], facts.get("service_accounts") or {})
    return results


def exit_code(results: Iterable[Result]) -> int:
    return 1 if any(r.status == FAIL for r in results) else 0


def format_text(results: list[Result], header: str) -> str:
    lines = [header]
    for r in results:
        lines.append(f"{SYMBOLS[r.status]} {r.message}")
        if r.check == "tpu-pools" and r.details:
            lines += ["    " + row for row in pools_table(r.details)]
        if r.status in (FAIL, WARN):
            if r.fix:
                lines.append(f"    fix: {r.fix}")
            if r.doc:
                lines.append(f"    see: {r.doc}")
    counts = {s: sum(r.status == s for r in results) for s in SYMBOLS}
    lines.append(f"{counts[OK]} ok, {counts[FAIL]} failed, {counts[WARN]} warning(s), {counts[UNKNOWN]} unknown")
    return "\n".join(lines) + "\n"


def format_json(results: list[Result], context: dict) -> str:
    return json.dumps({**context, "ok": exit_code(results) == 0, "checks": [r.as_dict() for r in results]},
                      indent=2) + "\n"
