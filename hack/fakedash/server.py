"""The stand-in dashboard's HTTP server: routes each request to the jobs API, the Serve API, a real
backend (forwarder) or the control API, and answers the Serve proxy health check; `main` starts it."""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import control as control_api
from . import auth, cpu_serving, jobs_api, logs_api, serve_api
from .forwarder import Reaper, forward, with_driver_env
from .kube import Kube, head_env
from .kubelet import Kubelet
from .network import Network, caller_of
from .state import State, owner_name, parse_host

SERVE_PORT = 8000  # Serve's HTTP port in KubeRay's pods and services
from .prober import Prober
from .submitters import Runner, Signaller


def make_handler(state: State, log, kube: Kube | None, network: Network | None = None):
    tokens = auth.Tokens(kube)
    network = network or Network(kube, log)

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
                # the submitter runner: a pod of the job's own (its policy admits it on every port)
                ns, cluster, path = parts[1], parts[2], "/" + "/".join(parts[3:]) + ("/" if path.endswith("/") else "")
            elif path == "/-/healthz":
                return self.serve_proxy_health(host)
            else:
                ns, cluster = parse_host(host)
                port = int(host.rsplit(":", 1)[1]) if host.rsplit(":", 1)[-1].isdigit() else 80
                if proxied and not network.admits(caller_of(self.headers), lambda: network.head_pod(ns, cluster), port):
                    return self.drop(method, host, path, ns, cluster)
                if proxied and host.endswith(f":{SERVE_PORT}"):
                    return self.to_serve(method, host, ns, cluster, path, query)
            try:
                token = tokens.token(ns, cluster)
            except Exception as exc:  # the API server is away: no answer a real head would give
                log(f"auth: token of {ns}/{cluster}: {exc!r}")
                return self.reply(503, {"error": f"fake dashboard: cannot read the token of {ns}/{cluster}: {exc}"})
            denied = auth.refusal(path, self.headers, token)
            if denied is not None:  # as that RayCluster's head refuses it (Ray 2.60, recorded)
                self.raw_body()
                with state.lock:
                    self.record(method, host, path, ns, cluster, None, denied["status"], None, query=query)
                return self.reply(denied["status"], denied["body"].encode(), denied["content_type"])
            with state.lock:
                backend = state.backend(ns, cluster)
            if backend is not None:
                return self.to_backend(backend, method, ns, cluster, path, query)
            body = self.as_json(self.raw_body()) if method in ("POST", "PUT") else None
            with state.lock:
                code, obj = self.dashboard(method, path, ns, cluster, body, urllib.parse.parse_qs(query), token)
                self.record(method, host, path, ns, cluster, body, code, obj.pop("_rayjob", None)
                            if isinstance(obj, dict) else None, query=query)
            if isinstance(obj, dict) and "_text" in obj:  # a log: plain text, with Ray's own headers
                return self.reply(code, obj["_text"].encode(), (obj.get("_headers") or {}).get("Content-Type", "text/plain"))
            self.reply(code, obj)

        def drop(self, method, host, path, ns, cluster) -> None:
            """A connection the NetworkPolicies deny: no answer at all, until the caller gives up
            (Dataplane V2 drops the packets; nothing refuses the connection)."""
            with state.lock:
                self.record(method, host, path, ns, cluster, None, None, None, query="", dropped=True)
            self.close_connection = True
            end = time.monotonic() + 600
            try:
                while time.monotonic() < end:
                    readable, _, _ = select.select([self.connection], [], [], 1.0)
                    if readable and not self.connection.recv(65536):
                        return  # the caller timed out and closed
            except OSError:
                return

        def record(self, method, host, path, ns, cluster, body, code, rayjob, backend=None, query="",
                   dropped=False) -> None:
            state.requests.append({"time": time.time(), "method": method, "host": host, "path": path, "query": query,
                                   "namespace": ns, "cluster": cluster, "body": body, "rayjob": rayjob,
                                   "status_code": code, "backend": backend, **({"dropped": True} if dropped else {})})
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
            serve = state.serve_backend(ns, cluster)
            if method == "PUT" and parts == ["api", "serve", "applications"] and isinstance(body, dict) \
                    and serve and serve.get("variant") == "cpu":
                body = cpu_serving.to_cpu(body, serve.get("env"))  # the listed CPU differences, nothing else
                raw = json.dumps(body).encode()
            if method == "POST" and parts == ["api", "jobs"] and isinstance(body, dict):
                body = with_driver_env(body, head_env(kube.raycluster(ns, cluster)) if kube else {})
                raw = json.dumps(body).encode()
                sid = body.get("submission_id")
            elif parts[:2] == ["api", "jobs"] and len(parts) >= 3:
                sid = parts[2]
            with state.lock:
                backend_token = state.backend_tokens.get(backend)
            code, ctype, data = forward(backend, method, path, query, raw, dict(self.headers), token=backend_token)
            with state.lock:
                self.record(method, self.headers.get("Host", ""), path, ns, cluster, body, code,
                            owner_name(sid) if sid else None, backend, query)
                if sid and code == 200:  # remember the job: the reaper stops it if its cluster dies
                    job = state.get_or_create(ns, cluster, sid, "backend")
                    job["real"] = True
                    if method == "GET" and len(parts) == 3:
                        info = self.as_json(data)
                        if isinstance(info, dict) and info.get("status"):
                            job.update(status=info["status"], message=info.get("message") or "")
            self.reply(code, data, ctype.split(";")[0] if ctype else "application/json")

        def to_serve(self, method: str, host: str, ns: str, cluster: str, path: str, query: str) -> None:
            """A request to a Serve endpoint (`<name>-serve-svc.<ns>...:8000`, or a head pod's Serve
            port) of a namespace whose Ray head is real: sent to that head's Serve HTTP proxy."""
            with state.lock:
                serve = state.serve_backend(ns, cluster)
            if serve is None:
                return self.reply(502, {"error": f"no real Serve proxy for {host} (namespace {ns})"})
            raw = self.raw_body() if method in ("POST", "PUT", "PATCH") else None
            code, ctype, data = forward(serve["url"], method, path, query, raw, dict(self.headers), timeout=300)
            with state.lock:
                self.record(method, host, path, ns, cluster, None, code, None, serve["url"])
            self.reply(code, data, ctype.split(";")[0] if ctype else "application/json")

        def splice(self, backend: str, path: str, query: str) -> None:
            """Pass a websocket through to the real dashboard, bytes both ways."""
            u = urllib.parse.urlsplit(backend)
            upstream = socket.create_connection((u.hostname, u.port or 80), timeout=10)
            lines = [f"GET {path}{'?' + query if query else ''} HTTP/1.1", f"Host: {u.netloc}"]
            # The caller's credential was for its RayCluster (checked above); the real head has its own.
            lines += [f"{k}: {v}" for k, v in self.headers.items()
                      if k.lower() not in ("host", "proxy-connection", "authorization", "x-ray-authorization", "cookie")]
            with state.lock:
                backend_token = state.backend_tokens.get(backend)
            if backend_token:
                lines.append(f"Authorization: Bearer {backend_token}")
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
            where, pod = None, None
            if kube is not None:
                sel = urllib.parse.quote(f"status.podIP={ip}")
                for found in kube.call("GET", f"/api/v1/pods?fieldSelector={sel}")["items"]:
                    cluster = (found["metadata"].get("labels") or {}).get("ray.io/cluster")
                    if cluster:
                        where, pod = (found["metadata"]["namespace"], cluster), found
            if where is not None and not network.admits(caller_of(self.headers), pod, SERVE_PORT):
                return self.drop("GET", host, "/-/healthz", where[0], where[1])
            with state.lock:
                serve = state.serve_backend(*where) if where else None
            if serve is not None:  # a real head: its Serve proxy answers
                code, ctype, data = forward(serve["url"], "GET", "/-/healthz", "", None, {})
                with state.lock:
                    self.record("GET", host, "/-/healthz", where[0], where[1], None, code, None, serve["url"])
                return self.reply(code, data, ctype.split(";")[0] if ctype else "text/plain")
            with state.lock:
                c = state.clusters.get(where) if where else None
                ok = c is not None and serve_api.proxy_healthy(c["serve"], state.serve_ready_after, time.time())
                self.record("GET", host, "/-/healthz", where[0] if where else "", where[1] if where else "",
                            None, 200 if ok else 503, None)
            self.reply(200 if ok else 503, "success" if ok else "Serve applications are not running (fake dashboard).",
                       "text/plain")

        # -- the Ray dashboard ------------------------------------------------------------------
        def dashboard(self, method: str, path: str, ns: str, cluster: str, body, query: dict, token: str | None):
            parts = [p for p in path.split("/") if p]
            if parts == ["api", "authentication_mode"] and method == "GET":
                return 200, {"authentication_mode": "disabled" if token is None else "token"}
            c = state.cluster(ns, cluster)  # any call names a RayCluster: it is remembered
            if parts[:2] == ["api", "jobs"]:
                return jobs_api.handle(state, method, parts[2:], path, ns, cluster, body)
            if parts[:3] == ["api", "v0", "logs"] and len(parts) == 4:
                return logs_api.handle(state, method, parts[3], {k: v[0] for k, v in query.items()}, ns, cluster)
            if parts[:3] == ["api", "serve", "applications"] and len(parts) == 3:
                return serve_api.handle(state, method, path, c, body)
            if parts[:1] == ["api"] and parts[1:2] in (["version"], ["gcs_healthz"]):
                return 200, {"version": "fake", "ray_version": "2.60.0"}
            return 404, {"error": f"{method} {path} not served by the fake dashboard"}

        # -- the control API --------------------------------------------------------------------
        def control(self, method: str, path: str, query: dict) -> None:
            parts = [p for p in path.split("/") if p][1:]
            body = self.as_json(self.raw_body()) if method in ("POST", "PUT") else None
            if parts == ["network"]:
                return self.reply(*network.control(method, body or {}))
            if parts[:1] == ["submitters"] and len(parts) == 4 and parts[3] == "log" and method == "GET":
                with state.lock:
                    run = state.runs.get((parts[1], parts[2]))
                if run is None:
                    return self.reply(404, {"error": f"no submitter run for pod {parts[1]}/{parts[2]}"})
                with open(run["log"], "rb") as f:
                    return self.reply(200, f.read(), "text/plain")
            with state.lock:
                code, obj = control_api.handle(state, method, parts, query, body or {}, time.time())
            self.reply(code, obj)

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
    p = argparse.ArgumentParser(description="A stand-in Ray dashboard for the local cluster.")
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
    p.add_argument("--no-serve-prober", action="store_true",
                   help="leave Ray pods Ready as KWOK made them (default: the readiness probe KubeRay "
                        "wrote, as GKE's kubelet runs it; see prober.py)")
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
        Kubelet(kube, log).start()  # KWOK runs no pod that names a Secret without it (kubelet.py)
        if not args.no_serve_prober:
            Prober(state, kube, log).start()
    if args.port_file:
        with open(args.port_file, "w") as f:
            f.write(f"{port}\n")
    log(f"fake Ray dashboard listening on http://{args.host}:{port}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
