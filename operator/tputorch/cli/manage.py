"""`tputorch get | describe | logs | delete | wait`: TPUTorchJobs and TPUTorchServices as a user
sees them. Row and text building is pure (`rows`, `describe_text`, `parse_for`, `parse_duration`);
the commands are the API calls around them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import threading

from kubernetes.client.rest import ApiException

from .. import timestamps
from . import client, display
from .display import FAILED, INTERRUPTED, INVALID, OK

# ---------------------------------------------------------------- pure helpers

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """'1h', '30m', '90s', '1h30m', or plain seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text or ""):
        return float(text)
    m = _DURATION.match(text or "")
    if not text or not m or not any(m.groups()):
        raise ValueError(f"--timeout: {text!r} must be a duration such as 90s, 30m, 1h or 1h30m")
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def parse_for(text: str) -> tuple[str, str]:
    """--for phase=Succeeded | condition=SliceReady -> ('phase', 'Succeeded') | ('condition', 'SliceReady')."""
    what, eq, value = (text or "").partition("=")
    if what not in ("phase", "condition") or not eq or not value:
        raise ValueError(f"--for: {text!r} must be phase=PHASE (e.g. phase=Succeeded) or condition=TYPE (e.g. condition=SliceReady)")
    return what, value


def describes_current_spec(obj: dict) -> bool:
    """Right after an edit (`kubectl apply`, then `tputorch wait`) the status still describes the
    previous generation until the operator has seen the edit: its Ready (or Failed) is not the
    edit's. A status without observedGeneration (an older operator's) counts as current."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    generation = (obj.get("metadata") or {}).get("generation")
    return not (isinstance(observed, int) and isinstance(generation, int) and observed < generation)


def met(obj: dict, what: str, value: str) -> bool:
    status = obj.get("status") or {}
    if not describes_current_spec(obj):
        return False
    if what == "phase":
        return status.get("phase") == value
    return any(c.get("type") == value and c.get("status") == "True" for c in status.get("conditions") or [])


def age(created: str | None, now: dt.datetime) -> str:
    then = timestamps.parse(created)
    if then is None:
        return "?"
    s = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def rows(kind: str, objs: list[dict], now: dt.datetime, all_namespaces: bool) -> list[list[str]]:
    """Table rows as `kubectl get ttj` prints them, plus KIND and, for services, the endpoint."""
    out = []
    for o in objs:
        meta, sp, st = o.get("metadata") or {}, o.get("spec") or {}, o.get("status") or {}
        tpu = sp.get("tpu") or {}
        row = [meta.get("namespace", "")] if all_namespaces else []
        row += [meta.get("name", ""), kind, str(tpu.get("accelerator", "")), str(tpu.get("topology", "")),
                st.get("phase") or "", st.get("hostsReady") or "", _step(st),
                st.get("jobStatus") or st.get("endpoint") or "", age(meta.get("creationTimestamp"), now)]
        out.append(row)
    return out


def rendering_notes(objs: list[dict]) -> list[str]:
    """One line per object whose child runs another rendering than its operator's (the
    RenderingCurrent condition, status/rendering.py), or a spec that operator refuses."""
    notes = []
    for o in objs:
        cond = next((c for c in (o.get("status") or {}).get("conditions") or []
                     if isinstance(c, dict) and c.get("type") == "RenderingCurrent" and c.get("status") == "False"), None)
        if cond is not None:
            name = (o.get("metadata") or {}).get("name", "")
            notes.append(f"{name}: RenderingCurrent=False ({cond.get('reason')}): its child keeps an earlier "
                         f"rendering; `tputorch describe {name}` says why and how to apply the new one")
    return notes


def _step(status: dict) -> str:
    step = (status.get("progress") or {}).get("step") if isinstance(status.get("progress"), dict) else None
    return str(step) if isinstance(step, int) else ""


def table(headers: list[str], body: list[list[str]]) -> str:
    all_rows = [headers] + body
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in all_rows)


def describe_text(kind: str, obj: dict, events: list[dict], pods: list[dict]) -> str:
    """What `tputorch describe` prints: spec summary, status, conditions, pods with nodes, events."""
    meta, sp, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    tpu = sp.get("tpu") or {}
    lines = [f"Name:        {meta.get('name')}", f"Namespace:   {meta.get('namespace')}", f"Kind:        {kind}",
             f"Slice:       {tpu.get('accelerator')} {tpu.get('topology')}", f"Image:       {sp.get('image')}"]
    if sp.get("entrypoint"):
        lines.append(f"Entrypoint:  {sp['entrypoint']}")
    if sp.get("model"):
        lines.append(f"Model:       {(sp['model'] or {}).get('source')}")
    lines.append(f"Phase:       {st.get('phase', '(no status yet)')}")
    if sp.get("queueName"):
        where = [f"ClusterQueue {st['clusterQueue']}"] if st.get("clusterQueue") else []
        where += [f"priority {sp['priorityClassName']}"] if sp.get("priorityClassName") else []
        where += [f"Workload {st['workload']}"] if st.get("workload") else []
        lines.append(f"Queue:       {sp['queueName']}" + (f" ({', '.join(where)})" if where else ""))
    for label, key in (("Hosts", "hostsReady"), ("Workers", "workers"), ("Ray job", "jobStatus"),
                       ("KubeRay", "jobDeploymentStatus"), ("Endpoint", "endpoint"), ("Message", "message")):
        if st.get(key) not in (None, ""):
            lines.append(f"{label + ':':<12} {st[key]}")
    if display.progress_text(st, metrics_shown=16):
        reported = (st.get("progress") or {}).get("reportedAt")
        lines.append(f"Progress:    {display.progress_text(st, metrics_shown=16)}" + (f" (read {reported})" if reported else ""))
    if st.get("lastCheckpoint"):
        lines.append(f"Checkpoint:  {st['lastCheckpoint']}")
    if display.goodput_summary(st):
        lines.append(f"Goodput:     {display.goodput_summary(st)}")
        lines += ["  " + r for r in table(*display.goodput_table(st)).splitlines()]
    if (st.get("attempts") or 1) > 1 or st.get("attemptHistory"):
        lines.append(f"Attempt:     {st.get('attempts', 1)}")
        history = st.get("attemptHistory") or []
        if history:
            lines.append("Attempts:")
            lines += ["  " + r for r in table(["#", "RESULT", "REASON", "ENDED", "MESSAGE"],
                                              [[str(a.get("attempt", "")), a.get("result", ""), a.get("reason", ""),
                                                a.get("endTime", ""), a.get("message", "")] for a in history]).splitlines()]
    conds = st.get("conditions") or []
    if conds:
        lines.append("Conditions:")
        lines += ["  " + r for r in table(["TYPE", "STATUS", "REASON", "MESSAGE"],
                                          [[c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("message", "")]
                                           for c in conds]).splitlines()]
    lines.append("Pods:" if pods else "Pods:        <none>")
    if pods:
        lines += ["  " + r for r in table(["NAME", "ROLE", "NODE", "PHASE"],
                                          [[p["name"], p["role"], p["node"] or "<unscheduled>", p["phase"]] for p in pods]).splitlines()]
    lines.append("Events:" if events else "Events:      <none>")
    if events:
        lines += ["  " + r for r in table(["TYPE", "REASON", "AGE", "MESSAGE"],
                                          [[e["type"], e["reason"], e["age"], e["message"]] for e in events]).splitlines()]
    return "\n".join(lines)


# ---------------------------------------------------------------- commands

def _api(a) -> client.Api:
    return client.connect(context=a.context, namespace=a.namespace, kubeconfig=a.kubeconfig)


def _not_found(name: str, namespace: str) -> int:
    print(f"no TPUTorchJob or TPUTorchService {name!r} in namespace {namespace}", file=sys.stderr)
    return FAILED


def cmd_get(a) -> int:
    api = _api(a)
    namespace = None if a.all_namespaces else api.namespace
    found = []
    for kind in client.KINDS:
        objs = api.list(kind, namespace)
        if a.name:
            objs = [o for o in objs if o["metadata"]["name"] == a.name]
        found += [(kind, o) for o in objs]
    if a.name and not found:
        return _not_found(a.name, api.namespace)
    if a.output == "json":
        print(json.dumps({"items": [o for _, o in found]}, indent=2))
        return OK
    if not found:
        print(f"No TPUTorchJobs or TPUTorchServices in {'any namespace' if namespace is None else 'namespace ' + namespace}.",
              file=sys.stderr)
        return OK
    now = dt.datetime.now(dt.timezone.utc)
    headers = (["NAMESPACE"] if a.all_namespaces else []) + ["NAME", "KIND", "ACCELERATOR", "TOPOLOGY", "PHASE",
                                                            "HOSTS", "STEP", "RAY JOB / ENDPOINT", "AGE"]
    body = []
    for kind in client.KINDS:
        body += rows(kind.short, [o for k, o in found if k is kind], now, a.all_namespaces)
    print(table(headers, body))
    for note in rendering_notes([o for _, o in found]):
        print(note)
    return OK


def _pod_rows(pods) -> list[dict]:
    return [{"name": p.metadata.name, "role": (p.metadata.labels or {}).get("ray.io/node-type", ""),
             "node": p.spec.node_name, "phase": p.status.phase or ""} for p in sorted(pods, key=lambda p: p.metadata.name)]


def cmd_describe(a) -> int:
    api = _api(a)
    found = api.find(a.name, api.namespace)
    if found is None:
        return _not_found(a.name, api.namespace)
    kind, obj = found
    now = dt.datetime.now(dt.timezone.utc)
    events = [{"type": e.type or "", "reason": e.reason or "", "message": (e.message or "").strip(),
               "age": age((e.last_timestamp or e.event_time or e.metadata.creation_timestamp).isoformat()
                          if (e.last_timestamp or e.event_time or e.metadata.creation_timestamp) else None, now)}
              for e in api.events(kind, a.name, api.namespace)]
    pods = _pod_rows(api.pods(kind, a.name, api.namespace))
    if kind is client.JOB:
        pods += [{**r, "role": "submitter"} for r in _pod_rows(api.submitter_pods(a.name, api.namespace))]
    print(describe_text(kind.kind, obj, events, pods))
    return OK


def cmd_logs(a) -> int:
    """The driver log: what KubeRay's submitter pod prints (`ray job logs --follow` in K8sJobMode)."""
    api = _api(a)
    found = api.find(a.name, api.namespace)
    if found is None:
        return _not_found(a.name, api.namespace)
    kind, obj = found
    if kind is not client.JOB:
        print(f"{a.name} is a {kind.kind}: logs are for TPUTorchJobs (see `tputorch describe {a.name}`)", file=sys.stderr)
        return FAILED
    pods = [p for p in api.submitter_pods(a.name, api.namespace) if (p.status.phase or "Pending") != "Pending"]
    if not pods:
        phase = (obj.get("status") or {}).get("phase") or "no status yet"
        print(f"no driver log yet: KubeRay's submitter pod for {a.name} has not started (job phase: {phase})", file=sys.stderr)
        return FAILED
    try:
        for line in api.pod_log(pods[-1].metadata.name, api.namespace, follow=a.follow):
            print(line, flush=True)
    except ApiException as err:
        print(f"driver log of pod {pods[-1].metadata.name}: {client.api_error_message(err)}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    return OK


def cmd_delete(a) -> int:
    api = _api(a)
    found = api.find(a.name, api.namespace)
    if found is None or not api.delete(found[0], a.name, api.namespace):
        return _not_found(a.name, api.namespace)
    print(f"{found[0].kind.lower()}.tputorch.io/{a.name} deleted")
    return OK


def cmd_wait(a) -> int:
    try:
        what, value = parse_for(a.for_)
        timeout = parse_duration(a.timeout)
    except ValueError as err:
        print(err, file=sys.stderr)
        return INVALID
    api = _api(a)
    found = api.find(a.name, api.namespace)
    if found is None:
        return _not_found(a.name, api.namespace)
    kind = found[0]
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.daemon = True
    timer.start()
    try:
        for obj in api.watch_object(kind, a.name, api.namespace, stop, timeout_seconds=max(1, min(30, int(timeout)))):
            if obj is None:
                print(f"{kind.kind} {api.namespace}/{a.name} was deleted", file=sys.stderr)
                return FAILED
            if not describes_current_spec(obj):
                continue
            v = display.view(kind.kind, obj)
            if v.not_applied:  # Ready, but the old spec's: the edit waited for never comes
                print(display.final_text(v, FAILED), file=sys.stderr)
                return FAILED
            if met(obj, what, value):
                print(f"{kind.kind.lower()}.tputorch.io/{a.name} {what} {value}")
                return OK
            code = display.outcome(v, value if what == "phase" else "")
            if code not in (None, OK):  # ended, and not the way waited for
                print(display.final_text(v, code), file=sys.stderr)
                return code
        print(f"timed out after {a.timeout} waiting for {a.name} {what}={value}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        stop.set()
        timer.cancel()


def register(sub, add_connection_flags) -> None:
    g = sub.add_parser("get", help="list TPUTorchJobs and TPUTorchServices (with phase, hosts, Ray job or endpoint)")
    g.add_argument("name", nargs="?")
    g.add_argument("-A", "--all-namespaces", action="store_true")
    g.add_argument("-o", "--output", choices=["table", "json"], default="table")
    add_connection_flags(g)
    g.set_defaults(func=cmd_get)

    d = sub.add_parser("describe", help="conditions, pods with their nodes, and events of a job or service")
    d.add_argument("name")
    add_connection_flags(d)
    d.set_defaults(func=cmd_describe)

    lg = sub.add_parser("logs", help="the driver log of a TPUTorchJob (KubeRay's submitter pod)")
    lg.add_argument("name")
    lg.add_argument("-f", "--follow", action="store_true")
    add_connection_flags(lg)
    lg.set_defaults(func=cmd_logs)

    rm = sub.add_parser("delete", help="delete a job or service (its RayJob/RayService and pods go with it)")
    rm.add_argument("name")
    add_connection_flags(rm)
    rm.set_defaults(func=cmd_delete)

    w = sub.add_parser("wait", help="wait until a job or service reaches a phase or condition (exit 0), else exit 1")
    w.add_argument("name")
    w.add_argument("--for", dest="for_", required=True, metavar="phase=P|condition=T",
                   help="e.g. phase=Succeeded, phase=Ready, condition=SliceReady")
    w.add_argument("--timeout", default="30m",
                   help="e.g. 90s, 30m, 1h (default 30m); a service's first start may take up to its "
                        "spec.serve.initializingTimeoutSeconds (1h by default): wait as long")
    add_connection_flags(w)
    w.set_defaults(func=cmd_wait)
