"""Client for the control API of hack/fakedash (the stand-in Ray dashboard).

    from dashboard import DashboardClient
    d = DashboardClient("http://127.0.0.1:PORT")      # or DashboardClient() with TPUTORCH_DASHBOARD_URL
    d.set_job_status("ns", "my-rayjob", "SUCCEEDED")
    d.set_job_status("ns", "my-rayjob", "FAILED", message="Traceback ...")

The fake keeps one dashboard per RayCluster; the job calls here name a RayJob and act on its newest
job (the one of its current RayCluster; before KubeRay's first call, on its first job). Setting a
terminal status (SUCCEEDED, FAILED, STOPPED) also makes the fake finish the RayJob's submitter pod
(exit code `submitter_exit_code`, default 0), which KubeRay waits for before it marks a K8sJobMode
RayJob Complete/Failed. Serve state is per RayCluster too (`serve`, `set_serve_status`); a
namespace can be handed to a real Ray dashboard (`set_backend`, see hack/fakedash/__init__.py).
Standard library only.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")

# The dashboard lives on 127.0.0.1: never send control calls through a proxy.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DashboardClient:
    def __init__(self, url: str | None = None, timeout: float = 10.0) -> None:
        url = url or os.environ.get("TPUTORCH_DASHBOARD_URL")
        if not url:
            raise RuntimeError("no dashboard URL: pass one or set TPUTORCH_DASHBOARD_URL")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + "/_control" + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _opener.open(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "GET":
                return None
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/healthz"))
        except OSError:
            return False

    def set_job_status(self, namespace: str, rayjob: str, status: str, message: str = "",
                       submitter_exit_code: int = 0) -> dict:
        """Set what the dashboard reports for the Ray job of RayJob `namespace/rayjob`."""
        status = status.upper()
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        return self._call("PUT", f"/jobs/{namespace}/{rayjob}",
                          {"status": status, "message": message, "submitter_exit_code": submitter_exit_code})

    def get_job(self, namespace: str, rayjob: str) -> dict | None:
        """The fake's record of the RayJob's newest job (status, submission_id, cluster, ...), None
        if never seen."""
        return self._call("GET", f"/jobs/{namespace}/{rayjob}")

    def add_job_log(self, namespace: str, rayjob: str, lines: list[str], append: bool = True) -> dict:
        """Lines the newest job of that RayJob printed to its driver log (served by
        /api/v0/logs/file, where the operator reads tputorch.train.report()'s lines)."""
        return self._call("PUT", f"/jobs/{namespace}/{rayjob}/log", {"lines": lines, "append": append})

    def jobs(self) -> list[dict]:
        return self._call("GET", "/jobs")

    def delete_job(self, namespace: str, rayjob: str) -> bool:
        return self._call("DELETE", f"/jobs/{namespace}/{rayjob}")["deleted"]

    def requests(self, namespace: str | None = None, rayjob: str | None = None, cluster: str | None = None) -> list[dict]:
        """Dashboard API requests received (method, host, path, body, namespace, cluster, rayjob,
        status_code, backend)."""
        q = {k: v for k, v in (("namespace", namespace), ("rayjob", rayjob), ("cluster", cluster)) if v}
        return self._call("GET", "/requests" + ("?" + urllib.parse.urlencode(q) if q else ""))

    def set_default_status(self, status: str) -> None:
        """Status given to jobs the dashboard has not seen yet (initially RUNNING)."""
        self._call("PUT", "/default", {"status": status.upper()})

    def set_serve_ready_after(self, seconds: float) -> None:
        """Seconds from a Serve config PUT until its applications report RUNNING."""
        self._call("PUT", "/default", {"serve_ready_after": seconds})

    def clusters(self) -> list[dict]:
        """Every RayCluster the dashboard heard of: its jobs (by submission id) and Serve state."""
        return self._call("GET", "/clusters")

    def serve(self, namespace: str, name: str) -> dict | None:
        """Serve state of RayCluster `name` or of RayService `name`'s newest RayCluster: the config
        put, `deployed_at`, `puts`, and `details` (what GET /api/serve/applications/ answers)."""
        return self._call("GET", f"/serve/{namespace}/{name}")

    def set_serve_status(self, namespace: str, name: str, status: str | None, message: str = "") -> dict:
        """Make every application of it report `status` (e.g. DEPLOY_FAILED); None: timed again."""
        return self._call("PUT", f"/serve/{namespace}/{name}", {"status": status, "message": message})

    def set_backend(self, namespace: str, url: str, cluster: str | None = None, serve_url: str | None = None,
                    serve_variant: str | None = None, probe_period: float | None = None,
                    token: str | None = None, serve_env: dict[str, str] | None = None) -> None:
        """Send this namespace's (or one RayCluster's) dashboard calls to a real Ray dashboard; with
        `serve_url`, its Serve proxy calls (KubeRay's health check, the serve Service's port 8000)
        to that head's Serve HTTP proxy, and with serve_variant="cpu" the Serve configs KubeRay
        PUTs are made CPU ones (hack/fakedash/cpu_serving.py). `probe_period`: seconds between the
        readiness probes of its pods instead of the pods' periodSeconds (hack/fakedash/prober.py).
        `token`: that head's own auth token (each call is first checked against its RayCluster's,
        then forwarded with this one). `serve_env` (with serve_variant="cpu"): env vars the LLM
        replica gets besides the CPU ones, what the pods would give it (cpu_serving.py, 5.)."""
        body = {"url": url, **({"serve_url": serve_url, "serve_variant": serve_variant} if serve_url else {}),
                **({"serve_env": serve_env} if serve_env is not None else {}),
                **({"probe_period": probe_period} if probe_period is not None else {}),
                **({"token": token} if token else {})}
        self._call("PUT", f"/backends/{namespace}" + (f"/{cluster}" if cluster else ""), body)

    def delete_backend(self, namespace: str, cluster: str | None = None) -> bool:
        return self._call("DELETE", f"/backends/{namespace}" + (f"/{cluster}" if cluster else ""))["deleted"]

    def submitters(self, namespace: str | None = None) -> list[dict]:
        """Submitter pods the runner ran: pod, submission_id, pid, argv, exit_code, log path."""
        return self._call("GET", "/submitters" + (f"?namespace={namespace}" if namespace else ""))

    def submitter_log(self, namespace: str, pod: str) -> str | None:
        """What a submitter pod's command printed (the driver's output, via `ray job logs`)."""
        req = urllib.request.Request(f"{self.url}/_control/submitters/{namespace}/{pod}/log")
        try:
            with _opener.open(req, timeout=self.timeout) as resp:
                return resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def reset(self) -> None:
        self._call("POST", "/reset", {})


def set_job_status(namespace: str, rayjob: str, status: str, message: str = "", submitter_exit_code: int = 0) -> dict:
    """Module-level shortcut using TPUTORCH_DASHBOARD_URL."""
    return DashboardClient().set_job_status(namespace, rayjob, status, message, submitter_exit_code)
