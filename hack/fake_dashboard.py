#!/usr/bin/env python3
"""A stand-in Ray dashboard for the local cluster (pure standard library).

The KubeRay operator runs out of cluster with HTTP_PROXY pointing here, so its dashboard calls
(`http://<cluster>-head-svc.<ns>.svc.cluster.local:8265/api/jobs/...`) arrive as proxy-form
requests (absolute URL in the request line). Loopback traffic (the API server) is not proxied:
Go never proxies loopback hosts and NO_PROXY lists them too.

Ray dashboard API served (the subset KubeRay v1.5's dashboard client uses):
  GET    /api/jobs/                 list of job infos of that head service's namespace
  GET    /api/jobs/<id>             job info; an unknown id is created with the default status
                                    (in K8sJobMode nobody really submits: the submitter pod is fake)
  POST   /api/jobs/                 submit ({"submission_id": ...}) -> {"job_id", "submission_id"}
  POST   /api/jobs/<id>/stop        -> {"stopped": bool}
  DELETE /api/jobs/<id>             -> {"deleted": bool}
  GET    /api/jobs/<id>/logs        -> {"logs": "..."}
  GET    /api/serve/applications/   -> {"applications": {}}    PUT -> 200 (RayService, minimal)

Jobs are keyed by (namespace, RayJob name). The namespace comes from the Host; the RayJob name from
the submission id, which KubeRay makes as `<rayjob>-<5 random chars>`.

Control API (any request whose path starts with /_control/, sent directly, not through the proxy):
  GET    /_control/healthz
  GET    /_control/jobs                          every job
  GET    /_control/jobs/<ns>/<rayjob>            one job (404 if the dashboard never saw it)
  PUT    /_control/jobs/<ns>/<rayjob>            {"status": "SUCCEEDED", "message": "...",
                                                  "submitter_exit_code": 0}   (POST works too)
  DELETE /_control/jobs/<ns>/<rayjob>
  GET    /_control/requests[?namespace=&rayjob=] dashboard requests seen, oldest first
  PUT    /_control/default                       {"status": "PENDING"}: status of new jobs
  POST   /_control/reset                         forget everything

When a job is put in a terminal state (SUCCEEDED, FAILED, STOPPED) and the server was given API
server access (--kube-server/--kube-token-file/--kube-ca), it annotates the pods of the submitter
Job (same name as the RayJob) with `tputorch.local/fake-exit-code: "<code>"` (default 0); the KWOK
stage in hack/kwok-pod-stages.yaml then finishes them, as `ray job submit` would exit once the Ray
job ends. KubeRay only marks a K8sJobMode RayJob Complete/Failed once the submitter has finished.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
VALID = {"PENDING", "RUNNING"} | TERMINAL
EXIT_ANNOTATION = "tputorch.local/fake-exit-code"
_SUFFIX = re.compile(r"^(?P<name>.+)-[a-z0-9]{5}$")


def now_ms() -> int:
    return int(time.time() * 1000)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[tuple[str, str], dict] = {}
        self.requests: list[dict] = []
        self.default_status = "RUNNING"

    def get_or_create(self, ns: str, rayjob: str, submission_id: str | None, created_by: str) -> dict:
        key = (ns, rayjob)
        job = self.jobs.get(key)
        if job is None:
            status = self.default_status
            job = self.jobs[key] = {
                "namespace": ns, "rayjob": rayjob, "submission_id": submission_id,
                "status": status, "message": "", "entrypoint": "", "metadata": {},
                "runtime_env": {}, "submitted": False, "created_by": created_by,
                "start_time": now_ms(), "end_time": 0, "submitter_exit_code": 0,
                "signalled_pods": [], "stop_requested": False,
            }
            if status in TERMINAL:
                job["end_time"] = now_ms()
        if submission_id and not job["submission_id"]:
            job["submission_id"] = submission_id
        return job


def rayjob_of(submission_id: str) -> str:
    m = _SUFFIX.match(submission_id)
    return m.group("name") if m else submission_id


def job_info(job: dict) -> dict:
    sid = job["submission_id"] or job["rayjob"]
    info = {
        "type": "SUBMISSION", "job_id": sid, "submission_id": sid, "status": job["status"],
        "message": job["message"] or f"Job is {job['status'].lower()} (fake dashboard).",
        "entrypoint": job["entrypoint"], "metadata": job["metadata"], "runtime_env": job["runtime_env"],
        "start_time": job["start_time"], "end_time": job["end_time"] or 0,
    }
    if job["status"] == "FAILED":
        info["error_type"] = job.get("error_type") or "JOB_ENTRYPOINT_COMMAND_ERROR"
    return info


class Kube:
    """Just enough of a Kubernetes client (bearer token over TLS) to annotate pods."""

    def __init__(self, server: str, token: str, ca: str) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca)
        # Never proxy the API server, whatever the environment says.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=self.ctx))

    def call(self, method: str, path: str, body: dict | None = None, ctype: str = "application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", ctype)
        with self.opener.open(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")


class Signaller(threading.Thread):
    """Finishes the submitter pods of terminal jobs (see module doc)."""

    def __init__(self, state: State, kube: Kube, log) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.state.lock:
                todo = [dict(j) for j in self.state.jobs.values()
                        if j["status"] in TERMINAL and not j.get("submitter_finished")]
            for job in todo:
                try:
                    self.signal(job)
                except Exception as exc:  # keep going; the API server may be restarting
                    self.log(f"signal {job['namespace']}/{job['rayjob']}: {exc}")

    def signal(self, job: dict) -> None:
        ns, name = job["namespace"], job["rayjob"]
        sel = urllib.parse.quote(f"batch.kubernetes.io/job-name={name}")
        pods = self.kube.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]
        code = str(job["submitter_exit_code"])
        finished, patched = False, []
        for pod in pods:
            meta = pod["metadata"]
            if pod.get("status", {}).get("phase") == "Succeeded":
                finished = True
            if (meta.get("annotations") or {}).get(EXIT_ANNOTATION) is None and not meta.get("deletionTimestamp"):
                self.kube.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{meta['name']}",
                               {"metadata": {"annotations": {EXIT_ANNOTATION: code}}},
                               "application/merge-patch+json")
                patched.append(meta["name"])
        # A failing submitter (exit code != 0) is retried by its Job: keep annotating new pods
        # until the Job gives up; checking the Job itself covers both cases.
        try:
            kjob = self.kube.call("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
            for cond in kjob.get("status", {}).get("conditions") or []:
                if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
                    finished = True
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        with self.state.lock:
            live = self.state.jobs.get((ns, name))
            if live is not None:
                live["signalled_pods"] = sorted(set(live["signalled_pods"]) | set(patched))
                live["submitter_finished"] = finished
        if patched:
            self.log(f"annotated submitter pods {ns}/{patched} with {EXIT_ANNOTATION}={code}")


def make_handler(state: State, log):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-ray-dashboard/1"

        def log_message(self, fmt, *args):  # one line per request into our log
            log("%s %s" % (self.address_string(), fmt % args))

        # -- plumbing -------------------------------------------------------------------------
        def body_json(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError:
                return {"_raw": raw.decode(errors="replace")}

        def reply(self, code: int, obj, ctype: str = "application/json") -> None:
            data = (json.dumps(obj) if ctype == "application/json" else str(obj)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def target(self):
            """(host, path, query) of the request, proxy-form or origin-form."""
            if self.path.startswith(("http://", "https://")):
                u = urllib.parse.urlsplit(self.path)
                return u.netloc, u.path or "/", u.query
            u = urllib.parse.urlsplit(self.path)
            return self.headers.get("Host", ""), u.path, u.query

        def dispatch(self, method: str) -> None:
            host, path, query = self.target()
            proxied = self.path.startswith(("http://", "https://"))
            if path.startswith("/_control/") and not proxied:
                return self.control(method, path, urllib.parse.parse_qs(query))
            hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host
            labels = hostname.split(".")
            ns = labels[1] if len(labels) >= 3 and labels[2] == "svc" else "default"
            cluster = labels[0].removesuffix("-head-svc")
            body = self.body_json() if method in ("POST", "PUT") else None
            with state.lock:
                code, obj = self.dashboard(method, path, ns, body)
                state.requests.append({"time": time.time(), "method": method, "host": host, "path": path,
                                       "namespace": ns, "cluster": cluster, "body": body,
                                       "rayjob": obj.pop("_rayjob", None) if isinstance(obj, dict) else None,
                                       "status_code": code})
                del state.requests[:-5000]
            self.reply(code, obj)

        # -- the Ray dashboard ------------------------------------------------------------------
        def dashboard(self, method: str, path: str, ns: str, body):
            parts = [p for p in path.split("/") if p]
            if parts[:2] == ["api", "jobs"]:
                rest = parts[2:]
                if not rest:
                    if method == "GET":
                        return 200, [job_info(j) for (n, _), j in sorted(state.jobs.items()) if n == ns]
                    if method == "POST":
                        sid = (body or {}).get("submission_id") or f"raysubmit_{now_ms()}"
                        name = rayjob_of(sid)
                        job = state.jobs.get((ns, name))
                        if job is not None and job["submitted"] and job["submission_id"] == sid:
                            return 500, {"_rayjob": name, "error": f"Job with submission_id {sid} already exists. "
                                                                  "Please use a different submission_id."}
                        job = state.get_or_create(ns, name, sid, "submit")
                        job.update(submitted=True, entrypoint=(body or {}).get("entrypoint", ""),
                                   metadata=(body or {}).get("metadata") or {},
                                   runtime_env=(body or {}).get("runtime_env") or {})
                        return 200, {"_rayjob": name, "job_id": sid, "submission_id": sid}
                    return 405, {"error": f"{method} not allowed"}
                sid, tail = rest[0], rest[1:]
                name = rayjob_of(sid)
                if method == "GET" and not tail:
                    job = state.get_or_create(ns, name, sid, "get")
                    return 200, dict(job_info(job), _rayjob=name)
                if method == "GET" and tail == ["logs"]:
                    job = state.jobs.get((ns, name))
                    if job is None:
                        return 404, {"_rayjob": name, "error": "no such job"}
                    return 200, {"_rayjob": name, "logs": f"fake logs of {sid}: {job['status']}\n"}
                if method == "POST" and tail == ["stop"]:
                    job = state.jobs.get((ns, name))
                    if job is None:
                        return 404, {"_rayjob": name, "error": "no such job"}
                    job["stop_requested"] = True
                    if job["status"] in TERMINAL:
                        return 200, {"_rayjob": name, "stopped": False}
                    job.update(status="STOPPED", message="Job was stopped (fake dashboard).", end_time=now_ms())
                    return 200, {"_rayjob": name, "stopped": True}
                if method == "DELETE" and not tail:
                    job = state.jobs.pop((ns, name), None)
                    return 200, {"_rayjob": name, "deleted": job is not None}
                return 404, {"_rayjob": name, "error": f"{method} {path} not served by the fake dashboard"}
            if parts[:3] == ["api", "serve", "applications"]:
                if method == "GET":
                    return 200, {"applications": {}}
                if method == "PUT":
                    return 200, {}
            if parts[:1] == ["api"] and parts[1:2] in (["version"], ["gcs_healthz"]):
                return 200, {"version": "fake", "ray_version": "2.60.0"}
            return 404, {"error": f"{method} {path} not served by the fake dashboard"}

        # -- the control API --------------------------------------------------------------------
        def control(self, method: str, path: str, query: dict) -> None:
            parts = [p for p in path.split("/") if p][1:]
            body = self.body_json() if method in ("POST", "PUT") else None
            with state.lock:
                code, obj = self._control(method, parts, query, body or {})
            self.reply(code, obj)

        def _control(self, method, parts, query, body):
            if parts == ["healthz"]:
                return 200, {"ok": True}
            if parts == ["reset"] and method == "POST":
                state.jobs.clear()
                state.requests.clear()
                state.default_status = "RUNNING"
                return 200, {"ok": True}
            if parts == ["default"]:
                if method in ("PUT", "POST"):
                    st = str(body.get("status", "")).upper()
                    if st not in VALID:
                        return 400, {"error": f"status must be one of {sorted(VALID)}"}
                    state.default_status = st
                return 200, {"status": state.default_status}
            if parts == ["requests"] and method == "GET":
                ns = (query.get("namespace") or [None])[0]
                rj = (query.get("rayjob") or [None])[0]
                return 200, [r for r in state.requests
                             if (ns is None or r["namespace"] == ns) and (rj is None or r["rayjob"] == rj)]
            if parts == ["jobs"] and method == "GET":
                return 200, list(state.jobs.values())
            if len(parts) == 3 and parts[0] == "jobs":
                ns, name = parts[1], parts[2]
                if method == "GET":
                    job = state.jobs.get((ns, name))
                    return (200, job) if job else (404, {"error": f"no job {ns}/{name}"})
                if method == "DELETE":
                    return 200, {"deleted": state.jobs.pop((ns, name), None) is not None}
                if method in ("PUT", "POST"):
                    st = str(body.get("status", "")).upper()
                    if st not in VALID:
                        return 400, {"error": f"status must be one of {sorted(VALID)}"}
                    job = state.get_or_create(ns, name, None, "control")
                    job["status"] = st
                    job["message"] = body.get("message", "")
                    job["submitter_exit_code"] = int(body.get("submitter_exit_code", 0))
                    if body.get("error_type"):
                        job["error_type"] = body["error_type"]
                    job["end_time"] = now_ms() if st in TERMINAL else 0
                    job["submitter_finished"] = False
                    return 200, job
            return 404, {"error": f"{method} /_control/{'/'.join(parts)}: unknown control endpoint"}

        def do_GET(self):
            self.dispatch("GET")

        def do_POST(self):
            self.dispatch("POST")

        def do_PUT(self):
            self.dispatch("PUT")

        def do_DELETE(self):
            self.dispatch("DELETE")

        def do_PATCH(self):
            self.dispatch("PATCH")

        def do_CONNECT(self):  # HTTPS through the proxy: nothing real to reach
            self.reply(405, {"error": "CONNECT not supported by the fake dashboard"})

    return Handler


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--kube-server", help="API server URL, e.g. https://127.0.0.1:6443")
    p.add_argument("--kube-token-file")
    p.add_argument("--kube-ca")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        sys.stderr.flush()

    state = State()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state, log))
    server.daemon_threads = True
    if args.kube_server:
        token = open(args.kube_token_file).read().strip()
        Signaller(state, Kube(args.kube_server, token, args.kube_ca), log).start()
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file, "w") as f:
            f.write(f"{port}\n")
    log(f"fake Ray dashboard listening on http://{args.host}:{port}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
