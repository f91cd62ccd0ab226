"""The control API (`/_control/...`, sent directly, never through the proxy): what tests use to set
job and Serve statuses, give a namespace a real Ray backend, and read what KubeRay asked. `handle`
is called with the state lock held and returns (HTTP status, JSON body)."""

from __future__ import annotations

import re

from .serve_api import SERVE_APP_STATUSES, serve_details
from .logs_api import set_lines
from .state import VALID, State, apply_status


def handle(state: State, method: str, parts: list[str], query: dict, body: dict, now: float):
    """`parts`: the path's parts after `_control`."""
    q = {k: v[0] for k, v in query.items()}
    if parts == ["healthz"]:
        return 200, {"ok": True}
    if parts == ["reset"] and method == "POST":
        state.clusters.clear()
        state.presets.clear()
        state.requests.clear()
        state.backends.clear()
        state.serve_backends.clear()
        state.probe_periods.clear()
        state.backend_tokens.clear()
        state.default_status = "RUNNING"
        return 200, {"ok": True}
    if parts == ["default"]:
        if method in ("PUT", "POST"):
            if "status" in body:
                st = str(body["status"]).upper()
                if st not in VALID:
                    return 400, {"error": f"status {body['status']!r}: must be one of {sorted(VALID)}"}
                state.default_status = st
            if "serve_ready_after" in body:
                try:
                    state.serve_ready_after = float(body["serve_ready_after"])
                except (TypeError, ValueError):
                    return 400, {"error": f"serve_ready_after {body['serve_ready_after']!r}: must be seconds"}
        return 200, {"status": state.default_status, "serve_ready_after": state.serve_ready_after}
    if parts == ["requests"] and method == "GET":
        return 200, [r for r in state.requests if all(r.get(k) == q[k] for k in ("namespace", "rayjob", "cluster")
                                                      if k in q)]
    if parts == ["jobs"] and method == "GET":
        return 200, sorted(state.jobs(), key=lambda j: j["seq"])
    if parts == ["clusters"] and method == "GET":
        return 200, sorted(state.clusters.values(), key=lambda c: c["seq"])
    if parts == ["backends"] and method == "GET":
        return 200, [{"namespace": ns, "cluster": c, "url": u} for (ns, c), u in sorted(state.backends.items())]
    if parts[:1] == ["backends"] and len(parts) in (2, 3):
        key = (parts[1], parts[2] if len(parts) == 3 else "")
        if method in ("PUT", "POST"):
            url = str(body.get("url", ""))
            if not re.match(r"^http://(127\.0\.0\.1|localhost)(:\d+)?/?$", url):
                return 400, {"error": f"url {url!r}: must be http://127.0.0.1:<port> (loopback only)"}
            serve_url, variant = str(body.get("serve_url") or ""), body.get("serve_variant")
            if serve_url and not re.match(r"^http://(127\.0\.0\.1|localhost)(:\d+)?/?$", serve_url):
                return 400, {"error": f"serve_url {serve_url!r}: must be http://127.0.0.1:<port> (loopback only)"}
            if variant not in (None, "cpu"):
                return 400, {"error": f"serve_variant {variant!r}: must be \"cpu\" or absent"}
            # The LLM replica's extra env (cpu_serving.py, 5.): what the pods would give it.
            serve_env = body.get("serve_env")
            if serve_env is not None and (variant != "cpu" or not isinstance(serve_env, dict) or not all(
                    isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
                    for k, v in serve_env.items())):
                return 400, {"error": f"serve_env {serve_env!r}: must be env var names to strings, "
                                      "with serve_variant \"cpu\""}
            period = body.get("probe_period")
            if period is not None and (isinstance(period, bool) or not isinstance(period, (int, float)) or period <= 0):
                return 400, {"error": f"probe_period {period!r}: must be a number of seconds > 0 or absent"}
            state.probe_periods.pop(key, None)
            if period is not None:
                state.probe_periods[key] = float(period)
            state.backends[key] = url.rstrip("/")
            state.serve_backends.pop(key, None)
            if serve_url:
                state.serve_backends[key] = {"url": serve_url.rstrip("/"), "variant": variant, "env": serve_env}
            if body.get("token"):  # the real head's own token (it runs with RAY_AUTH_MODE=token)
                state.backend_tokens[url.rstrip("/")] = str(body["token"])
        elif method == "DELETE":
            state.serve_backends.pop(key, None)
            state.probe_periods.pop(key, None)
            return 200, {"deleted": state.backends.pop(key, None) is not None}
        url = state.backends.get(key)
        if not url:
            return 404, {"error": f"no backend for {'/'.join(parts[1:])}"}
        serve = state.serve_backends.get(key) or {}
        period = state.probe_periods.get(key)
        return 200, {"url": url, **({"serve_url": serve["url"], "serve_variant": serve["variant"]} if serve else {}),
                     **({"serve_env": serve["env"]} if serve.get("env") is not None else {}),
                     **({"probe_period": period} if period is not None else {})}
    if parts == ["submitters"] and method == "GET":
        return 200, [r for r in state.runs.values() if "namespace" not in q or r["namespace"] == q["namespace"]]
    if parts[:1] == ["serve"] and len(parts) == 3:
        c = state.serve_cluster(parts[1], parts[2])
        if c is None:
            return 404, {"error": f"no Serve config was put on RayCluster or RayService {parts[1]}/{parts[2]}"}
        if method in ("PUT", "POST"):
            st = body.get("status")
            if st is not None and str(st).upper() not in SERVE_APP_STATUSES:
                return 400, {"error": f"status {st!r}: must be one of {sorted(SERVE_APP_STATUSES)} or null"}
            c["serve"]["override"] = ({"status": str(st).upper(), "message": body.get("message", "")}
                                      if st is not None else None)
        return 200, {"cluster": c["name"], "namespace": c["namespace"], **c["serve"],
                     "details": serve_details(c["serve"], state.serve_ready_after, now)}
    if len(parts) == 4 and parts[0] == "jobs" and parts[3] == "log" and method in ("PUT", "POST"):
        job = state.newest_job(parts[1], parts[2])
        if job is None:
            return 404, {"error": f"no job of RayJob {parts[1]}/{parts[2]} yet: its driver log comes with it"}
        lines = body.get("lines")
        if not isinstance(lines, list):
            return 400, {"error": f"lines {lines!r}: must be a list of log lines"}
        return 200, set_lines(job, lines, bool(body.get("append", True)))
    if len(parts) == 3 and parts[0] == "jobs":
        ns, name = parts[1], parts[2]
        job = state.newest_job(ns, name)
        if method == "GET":
            return (200, job) if job else (404, {"error": f"no job of RayJob {ns}/{name}"})
        if method == "DELETE":
            if job is None:
                return 200, {"deleted": False}
            del state.clusters[(ns, job["cluster"])]["jobs"][job["submission_id"]]
            return 200, {"deleted": True}
        if method in ("PUT", "POST"):
            st = str(body.get("status", "")).upper()
            if st not in VALID:
                return 400, {"error": f"status {body.get('status')!r}: must be one of {sorted(VALID)}"}
            update = dict(body, status=st)
            if job is None:  # before KubeRay's first call: the RayJob's first job starts so
                state.presets[(ns, name)] = update
                return 200, {"namespace": ns, "rayjob": name, "preset": True, **update}
            apply_status(job, update)
            return 200, job
    return 404, {"error": f"{method} /_control/{'/'.join(parts)}: unknown control endpoint"}
