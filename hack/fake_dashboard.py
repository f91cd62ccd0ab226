#!/usr/bin/env python3
"""A stand-in Ray dashboard for the local cluster (pure standard library).

The KubeRay operator runs out of cluster with HTTP_PROXY pointing here, so its dashboard calls
(`http://<raycluster>-head-svc.<ns>.svc.cluster.local:8265/api/...`) arrive as proxy-form
requests (absolute URL in the request line). Loopback traffic (the API server) is not proxied:
Go never proxies loopback hosts and NO_PROXY lists them too.

One dashboard per RayCluster, as in a real cluster: every piece of state (Ray jobs, Serve
applications) is kept per (namespace, RayCluster), the RayCluster being the first label of the
head service's host name. A RayJob run again under the same name gets a new RayCluster, so it never
sees the old run's jobs (nor their stop). The same API is also reachable directly (origin form) at
`/_ray/<ns>/<raycluster>/api/...`: that is the address the submitter runner gives the Ray CLI.

Ray dashboard API served (what KubeRay v1.5's dashboard client and RayService controller use):
  GET    /api/jobs/                 job infos of that RayCluster
  GET    /api/jobs/<id>             job info; an unknown id is created with the default status
                                    (in K8sJobMode without a real backend nobody really submits)
  POST   /api/jobs/                 submit ({"submission_id": ...}) -> {"job_id", "submission_id"}
  POST   /api/jobs/<id>/stop        -> {"stopped": bool}
  DELETE /api/jobs/<id>             -> {"deleted": bool}
  GET    /api/jobs/<id>/logs        -> {"logs": "..."}
  PUT    /api/serve/applications/   Serve config (ServeDeploySchema JSON), kept per RayCluster
  GET    /api/serve/applications/   ServeDetails: each application DEPLOYING (deployments UPDATING)
                                    until --serve-ready-after seconds after its config was put,
                                    then RUNNING (HEALTHY); see serve_details()
  GET    <head pod IP>:8000/-/healthz   the Serve proxy's health check KubeRay makes before it labels
                                    the head pod `ray.io/serve=true` (needs API server access to map
                                    the pod IP to its RayCluster): 200 once its applications run

Real Ray backends: a namespace (or one RayCluster) can be given a real Ray dashboard URL on
127.0.0.1 (`PUT /_control/backends/<ns>[/<raycluster>]`). Its dashboard calls are then forwarded
there unchanged (websockets too: `ray job logs --follow`), except that a job submission gets the
RayCluster's head container env as runtime_env env_vars under its own (on GKE the driver runs in
the head container with that env; here one real head serves many RayClusters). Such a cluster's
submitter pods are run for real by the submitter runner (see Runner) and, when its RayCluster is
deleted (suspend, job end), its unfinished Ray jobs are stopped, as the head pod's death would.

Control API (any request whose path starts with /_control/, sent directly, not through the proxy):
  GET    /_control/healthz
  GET    /_control/jobs                          every job
  GET    /_control/jobs/<ns>/<rayjob>            the newest job of that RayJob (404 if none)
  PUT    /_control/jobs/<ns>/<rayjob>            {"status": "SUCCEEDED", "message": "...",
                                                  "submitter_exit_code": 0}   (POST works too);
                                                 applies to the newest job of that RayJob, or, if
                                                 it has none yet, to its first one
  DELETE /_control/jobs/<ns>/<rayjob>
  GET    /_control/clusters                      every RayCluster's jobs and Serve state
  GET    /_control/serve/<ns>/<name>             Serve state of RayCluster <name>, or of the newest
                                                 RayCluster of RayService <name>
  PUT    /_control/serve/<ns>/<name>             {"status": "DEPLOY_FAILED", "message": "..."}:
                                                 every application of it reports that status
                                                 ({"status": null} back to the timed behaviour)
  GET    /_control/requests[?namespace=&rayjob=&cluster=]   dashboard requests seen, oldest first
  PUT    /_control/default                       {"status": "PENDING", "serve_ready_after": 2.0}
  GET|PUT|DELETE /_control/backends/<ns>[/<raycluster>]    {"url": "http://127.0.0.1:8265"}
  GET    /_control/backends
  GET    /_control/submitters[?namespace=]       submitter pods the runner ran (pid, exit code, log)
  GET    /_control/submitters/<ns>/<pod>/log     what that pod's command printed (text)
  POST   /_control/reset                         forget everything (backends and runs too)

When a job is put in a terminal state (SUCCEEDED, FAILED, STOPPED) and the server was given API
server access (--kube-server/--kube-token-file/--kube-ca), it annotates the pods of the submitter
Job (same name as the RayJob) with `tputorch.local/fake-exit-code: "<code>"` (default 0); the KWOK
stage in hack/kwok-pod-stages.yaml then finishes them, as `ray job submit` would exit once the Ray
job ends. KubeRay only marks a K8sJobMode RayJob Complete/Failed once the submitter has finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import socket
import ssl
import subprocess
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
SERVE_APP_STATUSES = {"NOT_STARTED", "DEPLOYING", "DEPLOY_FAILED", "RUNNING", "UNHEALTHY", "DELETING"}
# KubeRay names a RayJob's submission id and a RayJob's/RayService's RayCluster `<name>-<5 chars>`.
_SUFFIX = re.compile(r"^(?P<name>.+)-[a-z0-9]{5}$")
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def now_ms() -> int:
    return int(time.time() * 1000)


def owner_name(generated: str) -> str:
    """The RayJob/RayService name inside a KubeRay-generated name (`<name>-<5 chars>`)."""
    m = _SUFFIX.match(generated)
    return m.group("name") if m else generated


def parse_host(host: str) -> tuple[str, str]:
    """(namespace, raycluster) of a head service host `<cluster>-head-svc.<ns>.svc...[:port]`."""
    hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    labels = hostname.split(".")
    ns = labels[1] if len(labels) >= 3 and labels[2] == "svc" else "default"
    return ns, labels[0].removesuffix("-head-svc")


class State:
    def __init__(self, serve_ready_after: float = 2.0) -> None:
        self.lock = threading.Lock()
        self.clusters: dict[tuple[str, str], dict] = {}
        self.presets: dict[tuple[str, str], dict] = {}   # (ns, rayjob) -> status for its first job
        self.requests: list[dict] = []
        self.default_status = "RUNNING"
        self.serve_ready_after = serve_ready_after
        self.backends: dict[tuple[str, str], str] = {}    # (ns, cluster or "") -> real dashboard URL
        self.runs: dict[tuple[str, str], dict] = {}       # (ns, pod) -> submitter run
        self.seq = 0

    def cluster(self, ns: str, name: str) -> dict:
        c = self.clusters.get((ns, name))
        if c is None:
            self.seq += 1
            c = self.clusters[(ns, name)] = {"namespace": ns, "name": name, "jobs": {}, "serve": None,
                                              "seq": self.seq}
        return c

    def backend(self, ns: str, cluster: str) -> str | None:
        return self.backends.get((ns, cluster)) or self.backends.get((ns, ""))

    def get_or_create(self, ns: str, cluster: str, submission_id: str, created_by: str) -> dict:
        jobs = self.cluster(ns, cluster)["jobs"]
        job = jobs.get(submission_id)
        if job is None:
            self.seq += 1
            rayjob = owner_name(submission_id)
            job = jobs[submission_id] = {
                "namespace": ns, "cluster": cluster, "rayjob": rayjob, "submission_id": submission_id,
                "status": self.default_status, "message": "", "entrypoint": "", "metadata": {},
                "runtime_env": {}, "submitted": False, "created_by": created_by, "seq": self.seq,
                "start_time": now_ms(), "end_time": 0, "submitter_exit_code": 0,
                "signalled_pods": [], "stop_requested": False,
            }
            preset = self.presets.pop((ns, rayjob), None)
            if preset:
                apply_status(job, preset)
            elif job["status"] in TERMINAL:
                job["end_time"] = now_ms()
        return job

    def jobs(self):
        return [j for c in self.clusters.values() for j in c["jobs"].values()]

    def newest_job(self, ns: str, rayjob: str) -> dict | None:
        mine = [j for j in self.jobs() if j["namespace"] == ns and j["rayjob"] == rayjob]
        return max(mine, key=lambda j: j["seq"]) if mine else None

    def serve_cluster(self, ns: str, name: str) -> dict | None:
        """RayCluster `name`, else the newest RayCluster of RayService `name`, with Serve state."""
        c = self.clusters.get((ns, name))
        if c is not None and c["serve"] is not None:
            return c
        mine = [c for c in self.clusters.values()
                if c["namespace"] == ns and owner_name(c["name"]) == name and c["serve"] is not None]
        return max(mine, key=lambda c: c["seq"]) if mine else None


def apply_status(job: dict, body: dict) -> None:
    st = body["status"]
    job["status"] = st
    job["message"] = body.get("message", "")
    job["submitter_exit_code"] = int(body.get("submitter_exit_code", 0))
    if body.get("error_type"):
        job["error_type"] = body["error_type"]
    job["end_time"] = now_ms() if st in TERMINAL else 0
    job["submitter_finished"] = False


def job_info(job: dict) -> dict:
    sid = job["submission_id"]
    info = {
        "type": "SUBMISSION", "job_id": sid, "submission_id": sid, "status": job["status"],
        "message": job["message"] or f"Job is {job['status'].lower()} (fake dashboard).",
        "entrypoint": job["entrypoint"], "metadata": job["metadata"], "runtime_env": job["runtime_env"],
        "start_time": job["start_time"], "end_time": job["end_time"] or 0,
    }
    if job["status"] == "FAILED":
        info["error_type"] = job.get("error_type") or "JOB_ENTRYPOINT_COMMAND_ERROR"
    return info


# -- Ray Serve ------------------------------------------------------------------------------------

def deployment_names(app: dict) -> list[str]:
    """The deployments an application reports: those its config names, else one named after the
    import path's attribute (the stand-in cannot import the application to find the real ones)."""
    names = [d["name"] for d in app.get("deployments") or [] if isinstance(d, dict) and d.get("name")]
    return names or [str(app.get("import_path", "app")).replace(":", ".").rsplit(".", 1)[-1]]


def serve_details(serve: dict | None, ready_after: float, now: float) -> dict:
    """Ray Serve's GET /api/serve/applications/ answer (ServeInstanceDetails, the fields KubeRay's
    ServeDetails reads plus a few more) for the config last put on a RayCluster."""
    details = {"deploy_mode": "MULTI_APP", "proxy_location": "EveryNode", "controller_info": {},
               "http_options": {"host": "0.0.0.0", "port": 8000}, "proxies": {}, "target_capacity": None,
               "applications": {}}
    if serve is None:
        return details
    config = serve["config"]
    details["target_capacity"] = config.get("target_capacity")
    override = serve.get("override")
    for app in config.get("applications") or []:
        name = app.get("name") or "default"
        if override:
            status, message = override["status"], override.get("message", "")
        elif now - serve["deployed_at"] >= ready_after:
            status, message = "RUNNING", ""
        else:
            status, message = "DEPLOYING", "Deploying app (fake dashboard)."
        dep_status = {"RUNNING": "HEALTHY", "DEPLOYING": "UPDATING"}.get(status, "UNHEALTHY")
        details["applications"][name] = {
            "name": name, "route_prefix": app.get("route_prefix", "/"), "docs_path": None,
            "status": status, "message": message, "last_deployed_time_s": serve["deployed_at"],
            "deployed_app_config": app, "source": "declarative",
            "deployments": {d: {"name": d, "status": dep_status, "status_trigger": "CONFIG_UPDATE_COMPLETED"
                                if dep_status == "HEALTHY" else "CONFIG_UPDATE_STARTED",
                                "message": message, "replicas": []} for d in deployment_names(app)},
        }
    return details


def serve_running(serve: dict | None, ready_after: float, now: float) -> bool:
    apps = serve_details(serve, ready_after, now)["applications"]
    return bool(apps) and all(a["status"] == "RUNNING" for a in apps.values())


# -- the API server -------------------------------------------------------------------------------

class Kube:
    """Just enough of a Kubernetes client (bearer token over TLS) for pods and RayClusters."""

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

    def get(self, path: str):
        """The object, or None on 404."""
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def annotate_pod(self, ns: str, pod: str, code: int | str) -> None:
        self.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}",
                  {"metadata": {"annotations": {EXIT_ANNOTATION: str(code)}}}, "application/merge-patch+json")

    def raycluster(self, ns: str, name: str):
        return self.get(f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}")


def plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def head_env(raycluster: dict | None) -> dict[str, str]:
    if not raycluster:
        return {}
    containers = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    return plain_env(containers[0])


def with_driver_env(body: dict, env: dict[str, str]) -> dict:
    """A job submission whose runtime_env carries `env` under the submitter's own env_vars."""
    runtime_env = dict(body.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    return {**body, "runtime_env": runtime_env} if runtime_env["env_vars"] else body


class Signaller(threading.Thread):
    """Finishes the submitter pods of terminal jobs (see module doc)."""

    def __init__(self, state: State, kube: Kube, log) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.state.lock:
                todo = [dict(j) for j in self.state.jobs()
                        if j["status"] in TERMINAL and not j.get("submitter_finished") and not j.get("real")]
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
            if submission_id_of(pod) not in (None, job["submission_id"]):
                continue  # a submitter of another run of this RayJob
            if pod.get("status", {}).get("phase") == "Succeeded":
                finished = True
            if (meta.get("annotations") or {}).get(EXIT_ANNOTATION) is None and not meta.get("deletionTimestamp"):
                self.kube.annotate_pod(ns, meta["name"], code)
                patched.append(meta["name"])
        # A failing submitter (exit code != 0) is retried by its Job: keep annotating new pods
        # until the Job gives up; checking the Job itself covers both cases.
        kjob = self.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
        for cond in (kjob or {}).get("status", {}).get("conditions") or []:
            if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
                finished = True
        with self.state.lock:
            live = self.state.clusters.get((ns, job["cluster"]), {}).get("jobs", {}).get(job["submission_id"])
            if live is not None:
                live["signalled_pods"] = sorted(set(live["signalled_pods"]) | set(patched))
                live["submitter_finished"] = finished
        if patched:
            self.log(f"annotated submitter pods {ns}/{patched} with {EXIT_ANNOTATION}={code}")


def submission_id_of(pod: dict) -> str | None:
    containers = pod.get("spec", {}).get("containers") or [{}]
    return plain_env(containers[0]).get("RAY_JOB_SUBMISSION_ID")


# -- real backends: forwarding, the submitter runner, the reaper ---------------------------------

def forward(backend: str, method: str, path: str, query: str, body: bytes | None, headers: dict):
    """Send one dashboard call to a real Ray dashboard: (status, content type, body bytes)."""
    url = backend.rstrip("/") + path + (f"?{query}" if query else "")
    req = urllib.request.Request(url, data=body, method=method)
    for k in ("Content-Type", "Accept"):
        if headers.get(k):
            req.add_header(k, headers[k])
    try:
        with _no_proxy.open(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", "application/json"), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", "application/json"), exc.read()
    except OSError as exc:
        return 502, "application/json", json.dumps({"error": f"real Ray dashboard {backend}: {exc}"}).encode()


class Runner(threading.Thread):
    """Runs the submitter pods of RayClusters that have a real backend, on this host.

    A running submitter pod's container command and args (KubeRay's `ray job status || ray job
    submit --no-wait ...; ray job logs --follow`) run as they are, with the pod's env, except that
    the dashboard address becomes this server's `/_ray/<ns>/<cluster>` route (the websocket of
    `ray job logs --follow` ignores HTTP_PROXY). Output goes to <log dir>/<ns>/<pod>.log; the exit
    code finishes the pod through the KWOK exit annotation. A pod deleted meanwhile (RayJob
    deleted or suspended) has its process group killed.
    """

    def __init__(self, state: State, kube: Kube, log, self_url: str, log_dir: str, ray_bin: str) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log
        self.self_url, self.log_dir, self.ray_bin = self_url, log_dir, ray_bin
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            try:
                self.tick()
            except Exception as exc:  # keep going; the API server may be restarting
                self.log(f"runner: {exc!r}")

    def tick(self) -> None:
        with self.state.lock:
            namespaces = {ns for ns, _ in self.state.backends}
        seen = set()
        for ns in sorted(namespaces):
            sel = urllib.parse.quote("batch.kubernetes.io/job-name")
            for pod in self.kube.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]:
                key = (ns, pod["metadata"]["name"])
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                seen.add(key)
                with self.state.lock:
                    started = key in self.state.runs
                if not started and pod.get("status", {}).get("phase") == "Running":
                    self.launch(pod)
        for key, proc in list(self.procs.items()):
            if proc.poll() is None and key not in seen:
                self.log(f"runner: pod {key[0]}/{key[1]} is gone: stopping its command (pid {proc.pid})")
                stop_group(proc)
            if proc.poll() is not None:
                self.finish(key, proc)

    def launch(self, pod: dict) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        env = plain_env(container)
        address = env.get("RAY_DASHBOARD_ADDRESS", "")
        if "RAY_JOB_SUBMISSION_ID" not in env or not address:
            return
        _, cluster = parse_host(address.removeprefix("http://"))
        with self.state.lock:
            if self.state.backend(ns, cluster) is None:
                return
        route = f"{self.self_url}/_ray/{ns}/{cluster}"
        old = address if address.startswith("http://") else f"http://{address}"
        argv = [a.replace(old, route) for a in (container.get("command") or []) + (container.get("args") or [])]
        env["RAY_DASHBOARD_ADDRESS"] = route
        full_env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        full_env.update(env, RAY_AUTH_MODE="disabled", PATH=self.ray_bin + os.pathsep + full_env.get("PATH", ""))
        os.makedirs(os.path.join(self.log_dir, ns), exist_ok=True)
        path = os.path.join(self.log_dir, ns, f"{name}.log")
        with open(path, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, cwd=os.path.join(self.log_dir, ns), start_new_session=True)
        self.procs[(ns, name)] = proc
        with self.state.lock:
            self.state.runs[(ns, name)] = {"namespace": ns, "pod": name, "cluster": cluster,
                                           "submission_id": env["RAY_JOB_SUBMISSION_ID"], "pid": proc.pid,
                                           "argv": argv, "log": path, "started": time.time(),
                                           "exit_code": None, "finished": None}
        self.log(f"runner: pod {ns}/{name}: started pid {proc.pid} (log {path})")

    def finish(self, key: tuple[str, str], proc: subprocess.Popen) -> None:
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        with self.state.lock:
            run = self.state.runs.get(key)
            if run is not None and run["exit_code"] is None:
                run.update(exit_code=code, finished=time.time())
        try:
            self.kube.annotate_pod(key[0], key[1], code)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        del self.procs[key]
        self.log(f"runner: pod {key[0]}/{key[1]} exited {code}")


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


class Reaper(threading.Thread):
    """Stops the unfinished Ray jobs of a real backend whose RayCluster is gone: a real Ray cluster
    dies with its head pod (KubeRay suspends a RayJob by deleting its RayCluster, without a stop)."""

    def __init__(self, state: State, kube: Kube, log) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.state.lock:
                todo = [(c["namespace"], c["name"], sid, self.state.backend(c["namespace"], c["name"]))
                        for c in self.state.clusters.values() for sid, j in c["jobs"].items()
                        if j.get("real") and not j.get("reaped") and j["status"] not in TERMINAL]
            for ns, cluster, sid, backend in todo:
                try:
                    if backend is None or self.kube.raycluster(ns, cluster) is not None:
                        continue
                    code, _, body = forward(backend, "POST", f"/api/jobs/{sid}/stop", "", b"", {})
                    self.log(f"reaper: RayCluster {ns}/{cluster} is gone: stop {sid} -> {code} {body[:200]!r}")
                    if code in (200, 404):
                        with self.state.lock:
                            self.state.clusters[(ns, cluster)]["jobs"][sid]["reaped"] = True
                except Exception as exc:
                    self.log(f"reaper: {ns}/{cluster}/{sid}: {exc!r}")


# -- HTTP ----------------------------------------------------------------------------------------

def make_handler(state: State, log, kube: Kube | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-ray-dashboard/1"

        def log_message(self, fmt, *args):  # one line per request into our log
            log("%s %s" % (self.address_string(), fmt % args))

        # -- plumbing -------------------------------------------------------------------------
        def raw_body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        @staticmethod
        def as_json(raw: bytes):
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError:
                return {"_raw": raw.decode(errors="replace")}

        def reply(self, code: int, obj, ctype: str = "application/json") -> None:
            if isinstance(obj, bytes):
                data = obj
            else:
                data = (json.dumps(obj) if ctype == "application/json" else str(obj)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def dispatch(self, method: str) -> None:
            proxied = self.path.startswith(("http://", "https://"))
            u = urllib.parse.urlsplit(self.path)
            host = u.netloc if proxied else self.headers.get("Host", "")
            path, query = u.path or "/", u.query
            if path.startswith("/_control/") and not proxied:
                return self.control(method, path, urllib.parse.parse_qs(query))
            parts = [p for p in path.split("/") if p]
            if not proxied and parts[:1] == ["_ray"] and len(parts) >= 3:
                ns, cluster, path = parts[1], parts[2], "/" + "/".join(parts[3:]) + ("/" if path.endswith("/") else "")
            elif path == "/-/healthz":
                return self.serve_proxy_health(host)
            else:
                ns, cluster = parse_host(host)
            with state.lock:
                backend = state.backend(ns, cluster)
            if backend is not None:
                return self.to_backend(backend, method, ns, cluster, path, query)
            body = self.as_json(self.raw_body()) if method in ("POST", "PUT") else None
            with state.lock:
                code, obj = self.dashboard(method, path, ns, cluster, body)
                self.record(method, host, path, ns, cluster, body, code, obj.pop("_rayjob", None)
                            if isinstance(obj, dict) else None)
            self.reply(code, obj)

        def record(self, method, host, path, ns, cluster, body, code, rayjob, backend=None) -> None:
            state.requests.append({"time": time.time(), "method": method, "host": host, "path": path,
                                   "namespace": ns, "cluster": cluster, "body": body, "rayjob": rayjob,
                                   "status_code": code, "backend": backend})
            del state.requests[:-5000]

        # -- a real Ray dashboard behind -------------------------------------------------------
        def to_backend(self, backend: str, method: str, ns: str, cluster: str, path: str, query: str) -> None:
            if self.headers.get("Upgrade", "").lower() == "websocket":
                with state.lock:
                    self.record(method, self.headers.get("Host", ""), path, ns, cluster, None, 101, None, backend)
                return self.splice(backend, path, query)
            raw = self.raw_body() if method in ("POST", "PUT", "PATCH") else None
            body = self.as_json(raw) if raw else None
            sid = None
            parts = [p for p in path.split("/") if p]
            if method == "POST" and parts == ["api", "jobs"] and isinstance(body, dict):
                body = with_driver_env(body, head_env(kube.raycluster(ns, cluster)) if kube else {})
                raw = json.dumps(body).encode()
                sid = body.get("submission_id")
            elif parts[:2] == ["api", "jobs"] and len(parts) >= 3:
                sid = parts[2]
            code, ctype, data = forward(backend, method, path, query, raw, dict(self.headers))
            with state.lock:
                self.record(method, self.headers.get("Host", ""), path, ns, cluster, body, code,
                            owner_name(sid) if sid else None, backend)
                if sid and code == 200:  # remember the job: the reaper stops it if its cluster dies
                    job = state.get_or_create(ns, cluster, sid, "backend")
                    job["real"] = True
                    if method == "GET" and len(parts) == 3:
                        info = self.as_json(data)
                        if isinstance(info, dict) and info.get("status"):
                            job.update(status=info["status"], message=info.get("message") or "")
            self.reply(code, data, ctype.split(";")[0] if ctype else "application/json")

        def splice(self, backend: str, path: str, query: str) -> None:
            """Pass a websocket through to the real dashboard, bytes both ways."""
            u = urllib.parse.urlsplit(backend)
            upstream = socket.create_connection((u.hostname, u.port or 80), timeout=10)
            lines = [f"GET {path}{'?' + query if query else ''} HTTP/1.1", f"Host: {u.netloc}"]
            lines += [f"{k}: {v}" for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            client = self.connection
            self.close_connection = True
            upstream.settimeout(None)
            client.settimeout(None)
            socks = [client, upstream]
            try:
                while True:
                    readable, _, _ = select.select(socks, [], [], 3600)
                    if not readable:
                        return
                    for s in readable:
                        data = s.recv(65536)
                        if not data:
                            return
                        (upstream if s is client else client).sendall(data)
            except OSError:
                return
            finally:
                upstream.close()

        # -- the Serve proxy's health check ----------------------------------------------------
        def serve_proxy_health(self, host: str) -> None:
            ip = host.rsplit(":", 1)[0]
            where = None
            if kube is not None:
                sel = urllib.parse.quote(f"status.podIP={ip}")
                for pod in kube.call("GET", f"/api/v1/pods?fieldSelector={sel}")["items"]:
                    cluster = (pod["metadata"].get("labels") or {}).get("ray.io/cluster")
                    if cluster:
                        where = (pod["metadata"]["namespace"], cluster)
            with state.lock:
                c = state.clusters.get(where) if where else None
                ok = c is not None and serve_running(c["serve"], state.serve_ready_after, time.time())
                self.record("GET", host, "/-/healthz", where[0] if where else "", where[1] if where else "",
                            None, 200 if ok else 503, None)
            self.reply(200 if ok else 503, "success" if ok else "Serve applications are not running (fake dashboard).",
                       "text/plain")

        # -- the Ray dashboard ------------------------------------------------------------------
        def dashboard(self, method: str, path: str, ns: str, cluster: str, body):
            parts = [p for p in path.split("/") if p]
            c = state.cluster(ns, cluster)
            if parts[:2] == ["api", "jobs"]:
                rest = parts[2:]
                if not rest:
                    if method == "GET":
                        return 200, [job_info(j) for _, j in sorted(c["jobs"].items())]
                    if method == "POST":
                        sid = (body or {}).get("submission_id") or f"raysubmit_{now_ms()}"
                        job = c["jobs"].get(sid)
                        if job is not None and job["submitted"]:
                            return 500, {"_rayjob": job["rayjob"], "error": f"Job with submission_id {sid} already exists. "
                                                                             "Please use a different submission_id."}
                        job = state.get_or_create(ns, cluster, sid, "submit")
                        job.update(submitted=True, entrypoint=(body or {}).get("entrypoint", ""),
                                   metadata=(body or {}).get("metadata") or {},
                                   runtime_env=(body or {}).get("runtime_env") or {})
                        return 200, {"_rayjob": job["rayjob"], "job_id": sid, "submission_id": sid}
                    return 405, {"error": f"{method} not allowed"}
                sid, tail = rest[0], rest[1:]
                name = owner_name(sid)
                if method == "GET" and not tail:
                    return 200, dict(job_info(state.get_or_create(ns, cluster, sid, "get")), _rayjob=name)
                job = c["jobs"].get(sid)
                if method == "GET" and tail == ["logs"]:
                    if job is None:
                        return 404, {"_rayjob": name, "error": "no such job"}
                    return 200, {"_rayjob": name, "logs": f"fake logs of {sid}: {job['status']}\n"}
                if method == "POST" and tail == ["stop"]:
                    if job is None:
                        return 404, {"_rayjob": name, "error": "no such job"}
                    job["stop_requested"] = True
                    if job["status"] in TERMINAL:
                        return 200, {"_rayjob": name, "stopped": False}
                    job.update(status="STOPPED", message="Job was stopped (fake dashboard).", end_time=now_ms())
                    return 200, {"_rayjob": name, "stopped": True}
                if method == "DELETE" and not tail:
                    return 200, {"_rayjob": name, "deleted": c["jobs"].pop(sid, None) is not None}
                return 404, {"_rayjob": name, "error": f"{method} {path} not served by the fake dashboard"}
            if parts[:3] == ["api", "serve", "applications"] and len(parts) == 3:
                if method == "GET":
                    return 200, serve_details(c["serve"], state.serve_ready_after, time.time())
                if method == "PUT":
                    if not isinstance(body, dict) or not isinstance(body.get("applications"), list):
                        return 400, {"error": "expected a ServeDeploySchema JSON object with an 'applications' list"}
                    old = c["serve"]
                    if old is None or old["config"] != body:
                        c["serve"] = {"config": body, "deployed_at": time.time(),
                                      "override": old.get("override") if old else None,
                                      "puts": (old or {}).get("puts", 0) + 1}
                    return 200, {}
                if method == "DELETE":
                    c["serve"] = None
                    return 200, {}
            if parts[:1] == ["api"] and parts[1:2] in (["version"], ["gcs_healthz"]):
                return 200, {"version": "fake", "ray_version": "2.60.0"}
            return 404, {"error": f"{method} {path} not served by the fake dashboard"}

        # -- the control API --------------------------------------------------------------------
        def control(self, method: str, path: str, query: dict) -> None:
            parts = [p for p in path.split("/") if p][1:]
            body = self.as_json(self.raw_body()) if method in ("POST", "PUT") else None
            if parts[:1] == ["submitters"] and len(parts) == 4 and parts[3] == "log" and method == "GET":
                with state.lock:
                    run = state.runs.get((parts[1], parts[2]))
                if run is None:
                    return self.reply(404, {"error": f"no submitter run for pod {parts[1]}/{parts[2]}"})
                with open(run["log"], "rb") as f:
                    return self.reply(200, f.read(), "text/plain")
            with state.lock:
                code, obj = self._control(method, parts, query, body or {})
            self.reply(code, obj)

        def _control(self, method, parts, query, body):
            q = {k: v[0] for k, v in query.items()}
            if parts == ["healthz"]:
                return 200, {"ok": True}
            if parts == ["reset"] and method == "POST":
                state.clusters.clear()
                state.presets.clear()
                state.requests.clear()
                state.backends.clear()
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
                    state.backends[key] = url.rstrip("/")
                elif method == "DELETE":
                    return 200, {"deleted": state.backends.pop(key, None) is not None}
                url = state.backends.get(key)
                return (200, {"url": url}) if url else (404, {"error": f"no backend for {'/'.join(parts[1:])}"})
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
                             "details": serve_details(c["serve"], state.serve_ready_after, time.time())}
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
    p.add_argument("--serve-ready-after", type=float, default=2.0,
                   help="seconds from a Serve config PUT until its applications report RUNNING")
    p.add_argument("--submitter-log-dir", default=None,
                   help="where the submitter runner keeps each pod's output (default: a temp dir)")
    p.add_argument("--ray-bin", default=os.path.dirname(sys.executable),
                   help="directory holding the `ray` CLI the submitter runner uses")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        sys.stderr.flush()

    state = State(serve_ready_after=args.serve_ready_after)
    kube = None
    if args.kube_server:
        token = open(args.kube_token_file).read().strip()
        kube = Kube(args.kube_server, token, args.kube_ca)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state, log, kube))
    server.daemon_threads = True
    port = server.server_address[1]
    if kube is not None:
        import tempfile

        log_dir = args.submitter_log_dir or tempfile.mkdtemp(prefix="fake-dashboard-submitters-")
        Signaller(state, kube, log).start()
        Runner(state, kube, log, f"http://{args.host}:{port}", log_dir, args.ray_bin).start()
        Reaper(state, kube, log).start()
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
