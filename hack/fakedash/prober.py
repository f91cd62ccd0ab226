"""The readiness prober the local cluster lacks: KWOK marks every pod Ready, GKE's kubelet runs the
readiness probe KubeRay wrote into the Ray container. This thread runs that probe, as written, for
every running Ray pod (head and workers) and patches the pod's Ready condition as kubelet would.

The probe (one place for the rule: `readiness_probe` reads it, `next_ready` applies kubelet's
thresholds) is a list of HTTP checks against the pod's own Ray processes (KubeRay 1.5: `wget
localhost:52365/api/local_raylet_healthz | grep success`, on the head also the dashboard's
`:8265/api/gcs_healthz`; KubeRay 1.6 with Ray >= 2.53: an httpGet of the dashboard agent's
`/api/healthz`); a RayService worker's probe also asks the Serve proxy on its node
(`:8000/-/healthz`, failureThreshold 1), and Serve runs a proxy only on nodes that host a Serve
replica, so a TPU host that runs only vLLM workers stays NotReady while the model serves.

Where a check is answered:
- Real-Ray mode (the pod's RayCluster has a real Ray backend): against the Ray node that stands for
  the pod: the head pod -> the head node; a worker pod -> the newest node whose `ray.io/tpu-worker-id`
  label (what Ray reads from TPU_WORKER_ID) is the pod's TPU_WORKER_ID (GKE's webhook sets it) and,
  for a pod of spec.groups, whose `tputorch.io/group` label is the pod's (a CPU or GPU group's pod has
  no worker id: the newest node of its group).
  Ports: the agent's is the node's own `dashboardAgentListenPort`, the dashboard's the backend URL,
  the Serve proxy's the head's Serve URL or, on a worker node, the port in its
  `tputorch.local/serve-proxy-port` label (tests/cluster/ray_backend.py starts each simulated host
  with its own proxy port, Ray Serve's RAY_SERVE_WORKER_PROXY_HTTP_PORT). No node -> the check fails.
- Stand-in mode: there is no Ray process; the raylet, agent and GCS checks pass (a stand-in node is
  always up) and the Serve proxy check passes only on the host taken to run the LLM replica (the
  first host, by name, of each slice replica) while the RayCluster's Serve applications run.

Thresholds (`next_ready`): Ready on a passing probe; a pod that never passed is NotReady; a Ready pod
turns NotReady once its probe has failed failureThreshold times in a row, periodSeconds apart
(RayJob pods: 10 x 5 s; RayService workers: 1). The prober looks every second (a kubelet every
periodSeconds), so a pod can be Ready up to a period sooner than on GKE, never NotReady later; not
modelled: initialDelaySeconds (10 s before the first probe), the liveness probe (a container
restart after 120 failures). A backend may be given a shorter `probe_period` (seconds, instead of
the pod's periodSeconds) so that a test sees a lost node's pod turn NotReady in less than 50 s."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from . import serve_api
from .kube import Kube, Poller, plain_env
from .state import State

SERVE_PROXY_PATH = "/-/healthz"
RAY_POD_SELECTOR = "ray.io/node-type in (head,worker)"
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
REPLICA_LABEL = "ray.io/worker-group-replica-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"         # Ray's node label, from TPU_WORKER_ID
# spec.groups: the group's pods and its Ray nodes carry this label (KubeRay puts a worker group's
# top-level labels on both; tputorch.train.GROUP_LABEL, not imported: the stand-in runs without it).
GROUP_LABEL = "tputorch.io/group"
SERVE_PORT_LABEL = "tputorch.local/serve-proxy-port"  # a simulated host's own Serve proxy port
# A simulated slice attached for one worker pod replica (a slice added after the first, as Ray's
# autoscaler adds one): its nodes stand for that replica's pods only.
POD_REPLICA_LABEL = "tputorch.local/pod-replica"
# KubeRay's defaults (utils/constant.go) and the `ray start` params that change them.
AGENT, DASHBOARD, SERVE = "agent", "dashboard", "serve"
DEFAULT_PORTS = {AGENT: 52365, DASHBOARD: 8265, SERVE: 8000}
START_PARAMS = {AGENT: "dashboard-agent-listen-port", DASHBOARD: "dashboard-port"}
_URL = re.compile(r"http://(?:localhost|127\.0\.0\.1):(\d+)(/[^\s'\"|]*)")
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Check:
    endpoint: str           # AGENT, DASHBOARD, SERVE, or "port:<n>" for a port that is none of them
    path: str               # "/api/healthz"
    needs: str | None       # text the answer must contain (`| grep success`); None: any 2xx/3xx


@dataclass(frozen=True)
class Probe:
    checks: tuple[Check, ...]
    period: float
    failure_threshold: int
    timeout: float


def _ray_container(pod: dict) -> dict:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return containers[0]  # KubeRay's RayContainerIndex


def _ports(container: dict) -> dict[int, str]:
    """Port number -> endpoint, from KubeRay's defaults and what the container's `ray start` sets."""
    args = " ".join(str(a) for a in (container.get("command") or []) + (container.get("args") or []))
    ports = dict(DEFAULT_PORTS)
    for endpoint, param in START_PARAMS.items():
        m = re.search(rf"--{param}[= ](\d+)", args)
        if m:
            ports[endpoint] = int(m.group(1))
    for p in container.get("ports") or []:
        if p.get("name") == "serve" and p.get("containerPort"):
            ports[SERVE] = int(p["containerPort"])
    return {n: e for e, n in ports.items()}


def readiness_probe(pod: dict) -> Probe | None:
    """The Ray container's readiness probe as KubeRay wrote it (exec `wget ... | grep success`
    joined by `&&`, KubeRay's Python variant, or an httpGet); None without one or with a probe of
    another shape (left to KWOK)."""
    container = _ray_container(pod)
    spec = container.get("readinessProbe")
    if not spec:
        return None
    ports = _ports(container)

    def endpoint(port) -> str:
        if isinstance(port, str):  # a named container port
            port = next((p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == port), port)
        return ports.get(int(port), f"port:{port}") if str(port).isdigit() else f"port:{port}"

    if spec.get("httpGet"):
        get = spec["httpGet"]
        checks = (Check(endpoint(get.get("port")), get.get("path") or "/", None),)
    elif (spec.get("exec") or {}).get("command"):
        script = " ".join(spec["exec"]["command"])
        checks = []
        for part in script.split("&&"):
            m = _URL.search(part)
            if not m:
                return None
            checks.append(Check(endpoint(int(m.group(1))), m.group(2), "success" if "success" in part else None))
        checks = tuple(checks)
    else:
        return None
    return Probe(checks, float(spec.get("periodSeconds") or 10), int(spec.get("failureThreshold") or 3),
                 float(spec.get("timeoutSeconds") or 1))


def next_ready(ready: bool | None, failing_since: float | None, passed: bool, probe: Probe, now: float,
               period: float | None = None) -> tuple[bool, float | None]:
    """kubelet's thresholds: (Ready, since when the probe has been failing) after one probe result.
    `ready` None: not probed yet (a container starts NotReady until its probe first passes)."""
    if passed:
        return True, None
    since = failing_since if failing_since is not None else now
    if not ready:
        return False, since
    # failureThreshold failures in a row, `period` apart: the last one (threshold - 1) periods after the first.
    window = (probe.failure_threshold - 1) * (period if period is not None else probe.period)
    return (now - since < window), since


def replica_hosts(pods: list[dict]) -> set[str]:
    """Stand-in mode: the pods taken to host the LLM replica: the first (by name) of each slice
    replica, or of the whole cluster when KubeRay's replica label is absent."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        groups.setdefault((labels.get(CLUSTER_LABEL, ""), labels.get(REPLICA_LABEL, "")), []).append(p["metadata"]["name"])
    return {min(names) for names in groups.values()}


def stand_in_passes(check: Check, serving: bool, replica_host: bool) -> bool:
    """A check in stand-in mode: the stand-in's Ray processes are always up; its Serve proxy runs
    on the LLM replica's host while the applications run."""
    return serving and replica_host if check.endpoint == SERVE else True


def pod_replica(pod: dict) -> str:
    """The worker pod replica a pod belongs to: KubeRay's replica label (it labels multi-host
    replicas only), else the pod itself (a single-host replica is one pod)."""
    return (pod["metadata"].get("labels") or {}).get(REPLICA_LABEL) or pod["metadata"]["name"]


def node_for(pod: dict, nodes: list[dict]) -> dict | None:
    """The Ray node (an entry of the dashboard's /nodes?view=summary `raylet`) that stands for the pod:
    the head node for the head pod, else the newest node with the pod's TPU worker id and, for a pod
    of spec.groups, its group (a CPU or GPU group's pod, without a TPU worker id: a node of its group);
    a node attached for a pod replica (POD_REPLICA_LABEL) stands for that replica's pods only, and
    before the other nodes."""
    labels = pod["metadata"].get("labels") or {}
    if labels.get(NODE_TYPE_LABEL) == "head":
        mine = [n for n in nodes if n.get("isHeadNode")]
    else:
        worker_id, group = plain_env(_ray_container(pod)).get("TPU_WORKER_ID"), labels.get(GROUP_LABEL)
        replica = pod_replica(pod)

        def stands_for(node: dict) -> bool:
            node_labels = node.get("labels") or {}
            if node.get("isHeadNode") or (group is not None and node_labels.get(GROUP_LABEL) != group):
                return False
            if node_labels.get(POD_REPLICA_LABEL, replica) != replica:
                return False
            return node_labels.get(WORKER_ID_LABEL) == worker_id if worker_id is not None else group is not None

        mine = [n for n in nodes if stands_for(n)]
    return max(mine, key=lambda n: (POD_REPLICA_LABEL in (n.get("labels") or {}), int(n.get("startTimeMs") or 0)),
               default=None)


def node_endpoints(node: dict | None, dashboard_url: str, serve_url: str | None) -> dict[str, str]:
    """Endpoint -> base URL of what answers it on that Ray node (absent: nothing listens there)."""
    if node is None:
        return {}
    host = node.get("nodeManagerAddress") or "127.0.0.1"
    out = {AGENT: f"http://{host}:{node['dashboardAgentListenPort']}"} if node.get("dashboardAgentListenPort") else {}
    if node.get("isHeadNode"):
        out[DASHBOARD] = dashboard_url
        if serve_url:
            out[SERVE] = serve_url
    elif (node.get("labels") or {}).get(SERVE_PORT_LABEL):
        out[SERVE] = f"http://{host}:{node['labels'][SERVE_PORT_LABEL]}"
    return out


def http_passes(check: Check, endpoints: dict[str, str], timeout: float) -> bool:
    """What wget/kubelet would see: an answer below 400 within the timeout (and, for `| grep
    success`, that word in it)."""
    base = endpoints.get(check.endpoint)
    if base is None:
        return False
    try:
        with _no_proxy.open(base.rstrip("/") + check.path, timeout=timeout) as resp:
            body = resp.read(65536).decode(errors="replace")
    except (OSError, ValueError):  # refused, timed out, HTTP >= 400
        return False
    return check.needs is None or check.needs in body


def ready_conditions(ready: bool, now: str, unready: str) -> list[dict]:
    """The pod's ContainersReady and Ready conditions as kubelet writes them (`unready`: the names
    of the containers not ready, space-separated)."""
    status = "True" if ready else "False"
    extra = {} if ready else {"reason": "ContainersNotReady", "message": f"containers with unready status: [{unready}]"}
    return [{"type": t, "status": status, "lastTransitionTime": now, **extra} for t in ("ContainersReady", "Ready")]


def status_patch(ready: bool, now: str, container: str = "ray-worker") -> dict:
    """A strategic merge patch of the pod's status (conditions merge by type), as kubelet writes it."""
    return {"status": {"conditions": ready_conditions(ready, now, container)}}


def ready_of(pod: dict) -> bool | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return None


def _cluster_key(pod: dict) -> tuple[str, str]:
    return pod["metadata"]["namespace"], (pod["metadata"].get("labels") or {}).get(CLUSTER_LABEL, "")


def probed_pods(pods: list[dict], lost_nodes: set[str] = frozenset()) -> list[tuple[dict, Probe]]:
    """The running, not deleted Ray pods with a readiness probe this prober can read, but not those
    on a Kubernetes node that is not Ready (`lost_nodes`): no kubelet reports there, and the node
    lifecycle controller's NotReady must stay."""
    out = []
    for p in pods:
        if (p.get("status") or {}).get("phase") != "Running" or p["metadata"].get("deletionTimestamp") \
                or (p.get("spec") or {}).get("nodeName") in lost_nodes:
            continue
        probe = readiness_probe(p)
        if probe is not None:
            out.append((p, probe))
    return out


def hosts_up(pods: list[dict], lost_nodes: set[str] = frozenset()) -> dict[tuple[str, str], bool]:
    """(namespace, RayCluster) -> whether all its worker pods (the TPU hosts) run, on a node that
    is not lost; False for a cluster none of whose workers exist yet."""
    up: dict[tuple[str, str], bool] = {}
    for p in pods:
        if (p["metadata"].get("labels") or {}).get(NODE_TYPE_LABEL) != "worker" or p["metadata"].get("deletionTimestamp"):
            continue
        running = (p.get("status") or {}).get("phase") == "Running" and (p.get("spec") or {}).get("nodeName") not in lost_nodes
        key = _cluster_key(p)
        up[key] = up.get(key, True) and running
    return up


def stand_in_results(pods: list[tuple[dict, Probe]], serving: dict[tuple[str, str], bool]) -> dict[tuple[str, str], bool]:
    """(namespace, pod) -> whether its probe passes now, for stand-in pods.
    `serving`: (namespace, RayCluster) -> whether its Serve applications run.
    Only pods whose probe asks the Serve proxy: for the others GKE's answer is KWOK's (Ready while
    running), and the node lifecycle controller's NotReady on a lost node must stay."""
    pods = [(p, probe) for p, probe in pods if any(c.endpoint == SERVE for c in probe.checks)]
    hosts = replica_hosts([p for p, _ in pods])
    return {(p["metadata"]["namespace"], p["metadata"]["name"]):
            all(stand_in_passes(c, serving.get(_cluster_key(p), False), p["metadata"]["name"] in hosts)
                for c in probe.checks)
            for p, probe in pods}


class Prober(Poller):
    what = "prober"

    def __init__(self, state: State, kube: Kube, log, interval: float = 1.0) -> None:
        super().__init__(kube, log, interval)
        self.state = state
        state.hosts_watched = True
        self.seen: dict[tuple[str, str, str], tuple[bool | None, float | None]] = {}  # (ns, pod, uid) -> next_ready's

    def _nodes(self, url: str, token: str | None) -> list[dict] | None:
        req = urllib.request.Request(f"{url}/nodes?view=summary")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with _no_proxy.open(req, timeout=10) as resp:
                return [n["raylet"] for n in json.loads(resp.read())["data"]["summary"]]
        except (OSError, ValueError, KeyError) as exc:
            self.log(f"prober: nodes of {url}: {exc!r}")
            return None  # unknown: leave that backend's pods as they are this time

    def tick(self) -> None:
        sel = urllib.parse.quote(RAY_POD_SELECTOR)
        lost = {n["metadata"]["name"] for n in self.kube.call("GET", "/api/v1/nodes")["items"]
                if not any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (n.get("status") or {}).get("conditions") or [])}
        every = self.kube.call("GET", f"/api/v1/pods?labelSelector={sel}")["items"]
        pods = probed_pods(every, lost)
        up = hosts_up(every, lost)
        now = time.time()
        with self.state.lock:
            for key, c in self.state.clusters.items():
                c["hosts_up"] = up.get(key, False)
            serving = {key: serve_api.serve_running(c["serve"], self.state.serve_ready_after, now, c["hosts_up"])
                       for key, c in self.state.clusters.items()}
            backends = {_cluster_key(p): self.state.backend(*_cluster_key(p)) for p, _ in pods}
            serve_urls = {k: (self.state.serve_backend(*k) or {}).get("url") for k, url in backends.items() if url}
            tokens = {url: self.state.backend_tokens.get(url) for url in backends.values() if url}
            periods = {k: self.state.probe_period(*k) for k, url in backends.items() if url}
        results = stand_in_results([(p, probe) for p, probe in pods if not backends[_cluster_key(p)]], serving)
        nodes = {url: self._nodes(url, tokens[url]) for url in set(backends.values()) if url}
        for p, probe in pods:
            key = _cluster_key(p)
            url = backends[key]
            if url and nodes[url] is not None:
                endpoints = node_endpoints(node_for(p, nodes[url]), url, serve_urls.get(key))
                results[(key[0], p["metadata"]["name"])] = all(http_passes(c, endpoints, probe.timeout)
                                                               for c in probe.checks)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        seen = {}
        for p, probe in pods:
            ns, name, uid = p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"].get("uid", "")
            if (ns, name) not in results:
                if (ns, name, uid) in self.seen:  # not probed this time (backend unreachable): keep its count
                    seen[(ns, name, uid)] = self.seen[(ns, name, uid)]
                continue
            prev_ready, since = self.seen.get((ns, name, uid), (None, None))
            period = periods.get(_cluster_key(p))
            ready, since = next_ready(prev_ready, since, results[(ns, name)], probe, time.time(), period)
            seen[(ns, name, uid)] = (ready, since)
            if ready_of(p) == ready:
                continue
            try:
                self.kube.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                               status_patch(ready, stamp, _ray_container(p).get("name") or "ray"),
                               "application/strategic-merge-patch+json")
                where = "Ray node" if backends[_cluster_key(p)] else "stand-in"
                self.log(f"prober: pod {ns}/{name} Ready={ready} (readiness probe against its {where})")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
        self.seen = seen
