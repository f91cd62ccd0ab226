"""`tputorch doctor --for FILE`'s check of the identity each job or service reaches Cloud Storage
with: the ServiceAccount its spec names must exist in its namespace (the API server refuses a pod
of a missing account, so the slice would wait with no pod), and one that reaches a bucket without
naming an account runs as the namespace's `default`, which the runbook never binds (a warning, as
`tputorch validate` says: that account may be bound on purpose).
"""

from __future__ import annotations

from ...api import identity, spec
from .result import DOC_IDENTITY, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown


def accounts_named(specs: list) -> list[tuple[str, str]]:
    """(namespace, ServiceAccount) of every spec that names one, each once, in the file's order."""
    return list(dict.fromkeys((s.namespace, s.service_account_name) for s in specs if s.service_account_name))


def check_service_accounts(specs: list, accounts: dict[tuple[str, str], dict | None | Unread]) -> list[Result]:
    """accounts: (namespace, name) -> the ServiceAccount read (None: there is none)."""
    results = []
    for s in specs:
        kind = "service" if isinstance(s, spec.ServiceSpec) else "job"
        check = f"service-account/{s.namespace}/{s.name}"
        buckets = ", ".join(f"gs://{b}" for b in s.gcs_buckets)
        bucket = s.gcs_buckets[0] if s.gcs_buckets else "BUCKET"
        if not s.service_account_name:
            if s.gcs_buckets:
                results.append(Result(check, WARN, f"{kind} {s.namespace}/{s.name} reaches {buckets} as namespace "
                                      f"{s.namespace}'s default ServiceAccount, which the runbook never binds",
                                      f"set spec.serviceAccountName: {identity.RUNBOOK_ACCOUNT} (created and bound "
                                      f"as docs/tasks/bucket-access.md does), or bind `default` on purpose", DOC_IDENTITY))
            continue
        name = s.service_account_name
        found = accounts.get((s.namespace, name))
        if isinstance(found, Unread):
            results.append(_unknown(check, f"ServiceAccount {s.namespace}/{name}", found))
        elif found is None:
            results.append(Result(
                check, FAIL, f"{kind} {s.namespace}/{s.name} runs as ServiceAccount {name}, which namespace "
                f"{s.namespace} does not have: the API server refuses its pods, so it would wait with none",
                f"`kubectl -n {s.namespace} create serviceaccount {name}`, then bind it to the bucket: "
                + identity.bind_commands(s.namespace, name, bucket), DOC_IDENTITY))
        else:
            results.append(Result(check, OK, f"{kind} {s.namespace}/{s.name}: ServiceAccount {s.namespace}/{name} exists"
                                  + (f" (its binding on {buckets} is not visible from the cluster: "
                                     "`tputorch doctor --smoke --storage-path` proves a write)" if buckets else "")))
    return results
