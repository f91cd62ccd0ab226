"""Bursts of TPUTorchJobs on the local cluster: the operator against the same client creating RayJobs.

Every timestamp is taken on this process's clock (time.monotonic): a create is stamped just before
its request goes out, a RayJob/TPUTorchJob is stamped when a watch started before the burst
delivers its event. The KubeRay operator is stopped for the whole measurement so that only our
operator acts on the objects (the caller restarts it with `hack/cluster.sh up`).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tputorch import render
from tputorch.render.names import MANAGED_BY_LABEL
from tputorch.api import spec

import throughput

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
from operator_process import OperatorProcess, install_crd  # noqa: E402

GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"
RAY = ("ray.io", "v1", "rayjobs")
CREATORS = 4  # client threads issuing creates, for the operator run and the baseline alike


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def component_pid(name: str) -> int | None:
    f = Path(os.environ.get("TPUTORCH_CLUSTER_DIR", REPO / ".cluster")) / "pids" / f"{name}.pid"
    try:
        pid = int(f.read_text().strip())
        return pid if Path(f"/proc/{pid}").exists() else None
    except (OSError, ValueError):
        return None


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_REQUEST = re.compile(r'^apiserver_request_total\{([^}]*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
# every resource a job's path writes: the object, its RayJob, NetworkPolicy and token Secret, events
COUNTED = ("tputorchjobs", "rayjobs", "networkpolicies", "secrets", "events")


def apiserver_writes(api: client.ApiClient) -> dict[str, float]:
    """The API server's own count of write requests so far, by "VERB resource[/subresource]", for
    the resources a job's path writes (its /metrics, apiserver_request_total)."""
    method, url, headers, _body, _post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    answer = api.call_api(method, url, header_params=headers, _request_timeout=30)
    out: dict[str, float] = {}
    for line in answer.read().decode().splitlines():
        m = _REQUEST.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(1)))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") not in COUNTED:
            continue
        what = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{labels['verb']} {what}"
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def writes_per_job(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    return {k: (after.get(k, 0.0) - before.get(k, 0.0)) / n for k in sorted(after)
            if after.get(k, 0.0) - before.get(k, 0.0) > 0}


class Watcher(threading.Thread):
    """Watches one kind in one namespace from the current resourceVersion; records first-seen times."""

    def __init__(self, api: client.CustomObjectsApi, gvr: tuple[str, str, str], namespace: str, predicate=None):
        super().__init__(daemon=True)
        self.api, self.gvr, self.namespace = api, gvr, namespace
        self.predicate = predicate or (lambda event: event["type"] == "ADDED")
        self.seen: dict[str, float] = {}
        self.stop_flag = threading.Event()
        self.live = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        g, v, p = self.gvr
        rv = self.api.list_namespaced_custom_object(g, v, self.namespace, p, limit=1)["metadata"]["resourceVersion"]
        while not self.stop_flag.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.api.list_namespaced_custom_object, g, v, self.namespace, p,
                                      resource_version=rv, timeout_seconds=60, allow_watch_bookmarks=True,
                                      _request_timeout=90):
                    now = time.monotonic()
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    if name.startswith("sentinel"):
                        self.live.set()
                    elif name not in self.seen and self.predicate(event):
                        self.seen[name] = now
                    if self.stop_flag.is_set():
                        break
            except Exception as exc:  # a dropped watch: resume from the last resourceVersion
                self.errors.append(repr(exc))
                time.sleep(0.2)
            finally:
                w.stop()

    def wait(self, names, timeout: float) -> bool:
        end = time.monotonic() + timeout
        names = set(names)
        while time.monotonic() < end:
            if names <= self.seen.keys():
                return True
            time.sleep(0.05)
        return False


class Bench:
    def __init__(self, kubeconfig: str, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = CREATORS + 4
        self.api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.namespaces: list[str] = []

    # --- helpers ---------------------------------------------------------------------------

    def namespace(self, kind: str, n: int) -> str:
        name = f"tputorch-bench-{kind}-{n}-{uuid.uuid4().hex[:5]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=name, labels={"tputorch.local/bench": "true"})))
        self.namespaces.append(name)
        return name

    def cleanup(self) -> None:
        for ns in self.namespaces:
            try:
                self.core.delete_namespace(ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.namespaces.clear()

    def wait_namespaces_gone(self, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            left = self.core.list_namespace(label_selector="tputorch.local/bench=true").items
            if not left:
                return
            time.sleep(1)

    def _live(self, namespace: str, w: "Watcher") -> None:
        """Create sentinel RayJobs until the watch reports one: it is then surely established."""
        for attempt in range(4):
            body = render.rayjob(spec.parse(throughput.job_body(f"sentinel-{attempt}", namespace)))
            body["metadata"]["labels"] = {}  # not ours: the operator ignores it
            self.custom.create_namespaced_custom_object(*RAY[:2], namespace, RAY[2], body)
            if w.live.wait(15):
                return
        raise RuntimeError(f"RayJob watch never went live: {w.errors[-3:]}")

    def _watch(self, gvr, namespace, predicate=None) -> Watcher:
        w = Watcher(self.custom, gvr, namespace, predicate)
        w.start()
        return w

    def _burst(self, namespace: str, bodies: list[tuple[str, tuple, dict]]) -> tuple[dict[str, float], float]:
        """Create every (name, gvr, body) from CREATORS threads; returns send times and the burst start."""
        sent: dict[str, float] = {}
        failures: list[str] = []

        def create(item):
            name, gvr, body = item
            for attempt in range(5):
                sent.setdefault(name, time.monotonic())
                try:
                    self.custom.create_namespaced_custom_object(gvr[0], gvr[1], namespace, gvr[2], body)
                    return
                except ApiException as exc:
                    if exc.status == 409:
                        return
                    if exc.status in (429, 500, 503, 504) and attempt < 4:
                        time.sleep(0.2)
                        continue
                    failures.append(f"{name}: {exc.status} {exc.reason}")
                    return

        start = time.monotonic()
        with ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(create, bodies))
        if failures:
            raise RuntimeError(f"{len(failures)} creates failed, e.g. {failures[:3]}")
        return sent, start

    @staticmethod
    def _latency(sent: dict[str, float], seen: dict[str, float], start: float) -> dict:
        lat = [seen[n] - sent[n] for n in sent if n in seen]
        end = max((seen[n] for n in sent if n in seen), default=start)
        return {
            "n": len(sent), "seen": len(lat),
            "p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99),
            "mean_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
            "max_ms": 1000 * max(lat) if lat else float("nan"),
            "wall_s": end - start, "per_s": len(lat) / (end - start) if end > start else float("nan"),
        }

    # --- the two sides ---------------------------------------------------------------------

    def _measure(self, ns: str, bodies: list[tuple[str, tuple, dict]], timeout: float,
                 controller_pid: int | None = None) -> dict:
        """Create bodies in ns from CREATORS threads and time each until a RayJob of its name is
        seen; CPU of the API server, and of the controller process if any, during the burst."""
        w = self._watch(RAY, ns)
        self._live(ns, w)
        api = component_pid("kube-apiserver")
        api_cpu = cpu_s(api) if api else float("nan")
        ctl_cpu = cpu_s(controller_pid) if controller_pid else float("nan")
        self.cpu_before = ctl_cpu
        self.writes_before = apiserver_writes(self.api)
        sent, start = self._burst(ns, bodies)
        ok = w.wait(sent, timeout)
        w.stop_flag.set()
        result = self._latency(sent, w.seen, start)
        result["complete"] = ok
        result["apiserver_cpu_s"] = (cpu_s(api) - api_cpu) if api else float("nan")
        if controller_pid:
            result["operator_cpu_s"] = cpu_s(controller_pid) - ctl_cpu
        result["kuberay_running"] = component_pid("kuberay-operator") is not None
        result["burst_start"] = start
        return result

    def direct(self, n: int) -> dict:
        """Baseline: the same client creates the rendered RayJobs itself."""
        ns = self.namespace("direct", n)
        bodies = [(f"job-{i:05d}", RAY, render.rayjob(spec.parse(throughput.job_body(f"job-{i:05d}", ns))))
                  for i in range(n)]
        return self._measure(ns, bodies, 60 + n * 0.1)

    def _through_controller(self, ns: str, n: int, pid: int) -> dict:
        """Burst n TPUTorchJobs into ns while the controller process pid turns them into RayJobs."""
        bodies = [(f"job-{i:05d}", (GROUP, VERSION, PLURAL), throughput.job_body(f"job-{i:05d}", ns)) for i in range(n)]
        for _, _, b in bodies:
            del b["metadata"]["namespace"], b["metadata"]["generation"]
        return self._measure(ns, bodies, 60 + n * 0.2, controller_pid=pid)

    def minimal(self, n: int, same_work: bool = False) -> dict:
        """The yardsticks: bench/minimal_controller.py (watch, render, create the RayJob; nothing
        else), or with ``same_work`` the floor (also each RayJob's token Secret and NetworkPolicy)."""
        side = "floor" if same_work else "minimal"
        ns = self.namespace(side, n)
        env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
        with open(self.log_dir / f"{side}-{n}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "minimal_controller.py"),
                                     *(["--same-work"] if same_work else []), ns], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(2)  # its watch is established (as for the operator below)
            result = self._through_controller(ns, n, proc.pid)
            if same_work:  # its Secrets and NetworkPolicies follow the RayJobs
                self._extras_made(ns, n)
            time.sleep(2)  # it writes nothing more; the same wait as the operator's events below
            result["writes_per_job"] = writes_per_job(self.writes_before, apiserver_writes(self.api), n)
            result["cpu_ms_per_job_settled"] = 1000 * (cpu_s(proc.pid) - self.cpu_before) / n
            return result
        finally:
            proc.terminate()
            proc.wait(30)

    def operator(self, n: int, status_samples: int = 100) -> dict:
        ns = self.namespace("operator", n)
        op = OperatorProcess(self.kubeconfig, self.log_dir / f"operator-{n}.log", [ns])
        op.start()
        try:
            time.sleep(2)
            rss_idle = rss_mb(op.proc.pid)
            result = self._through_controller(ns, n, op.proc.pid)
            # Let the operator finish its status writes before measuring the idle-after RSS.
            self._settle(ns, n)
            result["all_status_s"] = time.monotonic() - result["burst_start"]
            time.sleep(2)  # the events, posted once no job waits for a reconcile
            result["writes_per_job"] = writes_per_job(self.writes_before, apiserver_writes(self.api), n)
            # its whole work for the burst: statuses and events come after the last RayJob
            result["cpu_ms_per_job_settled"] = 1000 * (cpu_s(op.proc.pid) - self.cpu_before) / n
            result["rss_idle_mb"] = rss_idle
            result["rss_loaded_mb"] = rss_mb(op.proc.pid)
            result["status"] = self.propagation(ns, sorted(f"job-{i:05d}" for i in range(n))[:status_samples])
            result["rss_after_status_mb"] = rss_mb(op.proc.pid)
            result["operator_traceback"] = "Traceback" in op.log()
        finally:
            op.stop()
        return result

    def _extras_made(self, ns: str, n: int, timeout: float = 120) -> None:
        """Until ns holds n token Secrets and n NetworkPolicies (the floor's writes after the RayJobs)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            secrets = self.core.list_namespaced_secret(ns, label_selector=MANAGED_BY_LABEL).items
            policies = self.custom.list_namespaced_custom_object("networking.k8s.io", "v1", ns, "networkpolicies")
            if len(secrets) >= n and len(policies["items"]) >= n:
                return
            time.sleep(0.5)

    def _settle(self, ns: str, n: int, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            done = sum(1 for j in items if any(c.get("type") == "RayJobCreated" and c.get("status") == "True"
                                               for c in (j.get("status") or {}).get("conditions") or []))
            if done >= n:
                return
            time.sleep(0.5)

    def propagation(self, ns: str, names: list[str]) -> dict:
        """Patch each RayJob's status subresource; time until the TPUTorchJob shows it."""
        def running(event):
            st = event["object"].get("status") or {}
            return st.get("jobDeploymentStatus") == "Running" and st.get("readyHosts") == 4

        w = self._watch((GROUP, VERSION, PLURAL), ns, running)
        time.sleep(1.0)  # list+watch established (no sentinel TPUTorchJob: it would get a RayJob)
        sent = {}
        patch = {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                            "rayClusterName": "bench-raycluster",
                            "rayClusterStatus": {"readyWorkerReplicas": 4, "desiredWorkerReplicas": 4}}}
        for name in names:  # paced: latency, not queueing
            sent[name] = time.monotonic()
            self.custom.patch_namespaced_custom_object_status(*RAY[:2], ns, RAY[2], name, patch)
            time.sleep(0.02)
        ok = w.wait(names, 60)
        w.stop_flag.set()
        lat = [w.seen[n] - sent[n] for n in names if n in w.seen]
        return {"n": len(names), "seen": len(lat), "complete": ok,
                "p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99),
                "max_ms": 1000 * max(lat) if lat else float("nan")}


def stop_kuberay(cluster_dir: Path) -> int | None:
    pidfile = cluster_dir / "pids" / "kuberay-operator.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text().strip())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    for _ in range(80):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.25)
    return pid


def restart_cluster_components() -> None:
    subprocess.run([str(REPO / "hack" / "cluster.sh"), "up"], check=True, stdout=subprocess.DEVNULL)


def ensure_crd(kubeconfig: str) -> None:
    install_crd(kubeconfig)
