"""`tputorch doctor`'s checks of the cluster itself: the API server's version, this operator's
CRDs, the operator's Deployment and its leader Lease.
"""

from __future__ import annotations

from datetime import datetime

from ... import timestamps
from ...api import crd
from .result import (DOC_COMPAT_K8S, DOC_OPERATOR, DOC_OPERATOR_TROUBLE, FAIL, OK, UNKNOWN, WARN, Result,
                          Unread, _unknown, parse_version)


# docs/compatibility.md: the chart and the CRDs' CEL rules need Kubernetes 1.29 or later.
MIN_KUBERNETES = (1, 29)
LEASE_NAME = "tputorch-operator"  # `tputorch run --lease-name`'s default, the chart's too


def check_kubernetes(version: dict | Unread) -> list[Result]:
    if isinstance(version, Unread):
        return [_unknown("kubernetes", "the API server's version", version)]
    text = version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}"
    parsed = parse_version(text) or parse_version(f"{version.get('major')}.{str(version.get('minor')).rstrip('+')}")
    minimum = ".".join(map(str, MIN_KUBERNETES))
    if parsed is None:
        return [Result("kubernetes", UNKNOWN, f"Kubernetes {text!r}: not a version this tool reads")]
    if parsed[:2] < MIN_KUBERNETES:
        return [Result("kubernetes", FAIL, f"Kubernetes {text} is older than {minimum}, the minimum",
                       f"upgrade the cluster to Kubernetes {minimum} or later (the CRDs' CEL rules need it)",
                       DOC_COMPAT_K8S)]
    return [Result("kubernetes", OK, f"Kubernetes {text} (≥ {minimum})")]


# ---------------------------------------------------------------- this operator's CRDs

def check_tputorch_crds(installed: dict[str, dict | None | Unread]) -> list[Result]:
    """installed: CRD name -> the installed CRD (None: not installed). One of an earlier release
    (Helm never upgrades a chart's crds/) fails, naming its release and what to apply."""
    results = []
    for name, kind in crd.NAMES.items():
        got = installed.get(name)
        check = f"crd/{name}"
        if isinstance(got, Unread):
            results.append(_unknown(check, f"{kind} CRD", got))
        elif got is None:
            results.append(Result(check, FAIL, f"{kind} CRD ({name}) is not installed", crd.apply_commands(), DOC_OPERATOR))
        elif (why := crd.outdated(got)) is not None:
            results.append(Result(check, FAIL, why,
                                  crd.apply_commands() + "; or use the CLI that matches the installed operator", DOC_OPERATOR))
        else:
            results.append(Result(check, OK, f"{kind} CRD installed, the same schema as this CLI's"))
    return results


# ---------------------------------------------------------------- the operator

def _age(timestamp: str | None, now: datetime) -> float | None:
    when = timestamps.parse(timestamp)
    return None if when is None else (now - when).total_seconds()


def check_operator(deployments: list[dict] | Unread, lease: dict | None | Unread, now: datetime) -> list[Result]:
    """The operator's Deployment(s) (the chart's labels) and its leader Lease."""
    results = []
    if isinstance(deployments, Unread):
        results.append(_unknown("operator", "the operator's Deployment", deployments))
    elif not deployments:
        leading = isinstance(lease, dict) and check_lease(lease, now).status == OK
        results.append(Result(
            "operator", WARN if leading else FAIL,
            "no operator Deployment (labels app.kubernetes.io/part-of=tputorch, component=operator) in any namespace"
            + ("; an operator holds the leader Lease (it runs outside a Deployment)" if leading else ""),
            "" if leading else "install the operator: `helm install tputorch charts/tputorch-operator ...`",
            "" if leading else DOC_OPERATOR))
    else:
        for d in deployments:
            meta, st = d.get("metadata") or {}, d.get("status") or {}
            want = (d.get("spec") or {}).get("replicas", 1)
            ready = st.get("readyReplicas") or 0
            image = next(iter(((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []), {}).get("image", "?")
            where = f"{meta.get('namespace')}/{meta.get('name')}"
            version = (meta.get("labels") or {}).get("app.kubernetes.io/version")
            shown = f"operator {where} ({image}{', version ' + version if version else ''})"
            fix_stopped = (f"start the operator: `kubectl -n {meta.get('namespace')} scale deployment/{meta.get('name')} "
                           f"--replicas=2`, then `kubectl -n {meta.get('namespace')} describe deployment/{meta.get('name')}` "
                           "and its pods' logs say why it does not run")
            if want == 0 or ready == 0:
                results.append(Result("operator", FAIL, f"{shown}: {ready} of {want} replica(s) ready", fix_stopped,
                                      DOC_OPERATOR_TROUBLE))
            elif ready < want:
                results.append(Result("operator", WARN, f"{shown}: {ready} of {want} replica(s) ready"))
            else:
                results.append(Result("operator", OK, f"{shown}: {ready} of {want} replica(s) ready"))
    results.append(check_lease(lease, now))
    return results


def operator_args(deployment: dict) -> list[str]:
    return [a for c in ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
            for a in (c.get("command") or []) + (c.get("args") or [])]


def lease_names(deployments: list[dict]) -> list[tuple[str, str]]:
    """(namespace, name) of the Lease each operator Deployment elects its leader with (--lease-name)."""
    out = []
    for d in deployments:
        args = operator_args(d)
        if "--leader-elect" in args:
            name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--lease-name"), LEASE_NAME)
            out.append((d["metadata"]["namespace"], name))
    return out


def check_lease(lease: dict | None | Unread, now: datetime) -> Result:
    if isinstance(lease, Unread):
        return _unknown("operator-lease", "the operator's leader Lease", lease)
    if lease is None:
        return Result("operator-lease", WARN, f"no Lease {LEASE_NAME!r}: the operator runs without --leader-elect "
                      "(one replica only) or is not running")
    meta, sp = lease.get("metadata") or {}, lease.get("spec") or {}
    holder = sp.get("holderIdentity")
    duration = sp.get("leaseDurationSeconds") or 15
    age = _age(sp.get("renewTime"), now)
    where = f"Lease {meta.get('namespace')}/{meta.get('name')}"
    if not holder or age is None:
        return Result("operator-lease", FAIL, f"{where} is held by no one: no operator replica leads, nothing is reconciled",
                      "start the operator (its replicas take the Lease within 15 s)", DOC_OPERATOR_TROUBLE)
    if age > duration:
        return Result("operator-lease", FAIL, f"{where}: leader {holder} last renewed {age:.0f} s ago (lease "
                      f"{duration} s): the operator is stopped or cannot reach the API server",
                      f"look at the operator's pods: `kubectl -n {meta.get('namespace')} get pods -l "
                      "app.kubernetes.io/component=operator` and their logs", DOC_OPERATOR_TROUBLE)
    return Result("operator-lease", OK, f"{where}: held by {holder}, renewed {max(age, 0):.0f} s ago")
