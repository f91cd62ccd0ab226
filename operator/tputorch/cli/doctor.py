"""`tputorch doctor`: can this cluster run a TPUTorchJob and a TPUTorchService, and what to fix.

Every check is a pure function over what doctor_read.py read from the cluster (plain dicts, as the
API returns them), so each is tested with dicts. A fact that could not be read is an `Unread`
(its reason), and a check over it says `?`, never `✓`. Each result: ok ✓, fail ✗ (with the fix and
the doc section), warn ! or unknown ?. Exit code 0 when nothing failed, else 1.

The checks live per area beside this module (doctor_cluster, doctor_kuberay, doctor_pools,
doctor_network, doctor_kueue, doctor_rights; doctor_base what they share); this module puts them
together and is what the CLI, smoke.py, doctor_read.py and the tests import.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterable

# What callers read from `doctor`, re-exported from the module of its area.
from .doctor_base import (  # noqa: F401
    DOC_COMPAT_K8S, DOC_COMPAT_KUBERAY, DOC_GCSFUSE, DOC_KUEUE, DOC_NETWORK, DOC_OPERATOR, DOC_OPERATOR_TROUBLE,
    DOC_POOLS, DOC_QUOTA, DOC_RIGHTS, DOC_WEBHOOK, DOCS, FAIL, OK, SYMBOLS, UNKNOWN, WARN, Result, Unread,
    parse_version)
from .doctor_cluster import (  # noqa: F401
    LEASE_NAME, MIN_KUBERNETES, check_kubernetes, check_lease, check_operator, check_tputorch_crds,
    first_difference, lease_names, operator_args)
from .doctor_kuberay import (  # noqa: F401
    KNOWN_BAD_KUBERAY, KUBERAY_CRDS, check_kuberay, check_tpu_webhook, kuberay_version, representative_children,
    served_schema, unserved_fields)
from .doctor_kueue import (  # noqa: F401
    KUEUE_INTEGRATIONS, KUEUE_LOCALQUEUE_CRD, QuotaCheck, check_kueue, kueue_frameworks, kueue_quota_check,
    kueue_rayservice_enabled)
from ..status.kueue import WORKLOAD_CRD
from .doctor_network import check_network, check_policy_mode, policy_config  # noqa: F401
from .doctor_pools import Pool, check_placement, check_pools, pools_table, quantity, tpu_pools  # noqa: F401
from .doctor_rights import GCS_FUSE_DRIVER, RIGHTS, check_gcsfuse, check_rights  # noqa: F401


# ---------------------------------------------------------------- putting it together

def run_checks(facts: dict, now: datetime | None = None) -> list[Result]:
    """Every check over what was read. facts: see doctor_read.read_facts."""
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
    results += check_kueue(facts["kueue_installed"], kueue_frameworks(facts["kueue_config"]),
                           facts["local_queues"].get(facts["namespace"], []), facts["namespace"],
                           facts["crds"].get(WORKLOAD_CRD))
    results += check_gcsfuse(facts["gcsfuse_driver"])
    results += check_rights(facts["rights"], facts["namespace"], facts.get("user") or "you")
    if facts.get("specs") is not None:
        results += check_placement(facts["specs"], facts["nodes"], facts["quotas"], facts["local_queues"],
                                   facts.get("cluster_queues"), facts.get("resource_flavors"),
                                   kueue_quota_check(facts.get("kueue_config")))
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
