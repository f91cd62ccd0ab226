"""A real Ray 2.60 head on 127.0.0.1 with the hosts of a rendered RayJob's TPU slice attached.

The local cluster's stand-in dashboard forwards a namespace's dashboard calls here
(`DashboardClient.set_backend`), its submitter runner runs the submitter pods' `ray job submit`
against it, and the Ray job then really runs: the driver on this head, Ray Train workers on the
simulated TPU hosts (one Ray node per TPU host, made by tests/raysim's slicesim from the rendered
RayJob's worker pod: `TPU` resource, the container env, what GKE's webhook and device plugin add).

The Ray cluster lives in a server process of its own (this file run as a script, driven over
stdin/stdout): the test process never connects to Ray, so it does not clash with tests/raysim's head
in the same pytest session. That process starts the head (with the dashboard) and the hosts with
Ray's own `ray.cluster_utils.Cluster`, as slicesim does; `ray start` cannot be used for the hosts
(with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 it refuses to join a cluster, without it it resolves
127.0.0.1 to the machine's routable address). Everything binds to 127.0.0.1. Token auth is on
(`RAY_AUTH_MODE=token`, as KubeRay 1.6 starts a head whose RayCluster has `authOptions`): every
dashboard call needs `Authorization: Bearer <token>`. One head serves the RayClusters of many
tests, each with the token KubeRay generated into its own Secret, and a head has one token: the
head's is `RealRay.token`, and the stand-in dashboard checks each caller's token against its
RayCluster's Secret before it forwards the call here with this one (hack/fakedash/auth.py).
Stopping is Cluster.shutdown() and then a kill of the server's session (never `ray stop`, which
kills every Ray process on the machine by name).

    ray = RealRay(workdir).start()          # head + dashboard, warmed with a no-op job
    ray.attach(rayjob_dict)                 # worker nodes of that slice and of its spec.groups (kept
                                            # for the same shape; a killed host is started again)
    ray.add_slice(rayservice, replica)      # one more slice of that shape, for KubeRay's pod replica
    ray.kill_host(1)                        # remove host 1's Ray node (a preempted TPU VM)
    ray.url                                 # http://127.0.0.1:<dashboard port>
    ray.token                               # the head's auth token (ray.headers() for a call)
    ray.job(submission_id)                  # the dashboard's job info, None if unknown
    ray.stop()
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "tests"))
from fakedash.prober import POD_REPLICA_LABEL, SERVE_PORT_LABEL  # noqa: E402 (labels the stand-in's prober reads)
from freeports import free_port  # noqa: E402 (never the same port twice: one Ray node's components)
# The simulated-slice code of the Ray tests: the one place to change if that folder moves.
SLICESIM = REPO / "tests" / "raysim" / "slicesim.py"
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB
RAY_ENV = {
    "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
    # On a busy 2-core machine a node's dashboard agent can take longer to come up than Ray's
    # default wait, and the raylet then aborts: wait longer.
    "RAY_agent_register_timeout_ms": "180000", "RAY_raylet_start_wait_time_s": "180",
}
# An AF_UNIX socket path holds at most 107 bytes, and Ray 2.60 puts each dashboard module's socket at
# <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/dash_<Module> (the longest module name is
# TaskEventsHead, 14 bytes; 16 leaves room). Deeper than that (make test's per-half temp roots), the
# dashboard dies at start: "Module MetricsHead failed to start. Received EOF from pipe".
UNIX_SOCKET_PATH_MAX = 107
RAY_SOCKET_TAIL = len("/session_2026-12-05_19-45-13_160239_4194304/sockets/dash_") + 16


def ray_temp_dir(prefix: str = "tt-ray-") -> str:
    """A new, empty temp dir for a Ray head: under the temp root (TMPDIR) when Ray's socket paths
    fit below it, else under /tmp (still this head's own dir, removed by whoever made it)."""
    root = tempfile.gettempdir()
    if len(os.path.join(root, prefix + "x" * 8).encode()) + RAY_SOCKET_TAIL > UNIX_SOCKET_PATH_MAX:
        root = "/tmp"
    return tempfile.mkdtemp(prefix=prefix, dir=root)


_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
REPORTED: dict[str, dict[str, float]] = {}  # figures the tests print at the session's end (conftest.py)


def load_slicesim():
    if "slicesim" in sys.modules:
        return sys.modules["slicesim"]
    spec = importlib.util.spec_from_file_location("slicesim", SLICESIM)
    module = importlib.util.module_from_spec(spec)
    sys.modules["slicesim"] = module
    spec.loader.exec_module(module)
    return module


def http_json(method: str, url: str, body: dict | None = None, timeout: float = 10, token: str | None = None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with _no_proxy.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait(predicate, timeout: float, what: str, interval: float = 0.3):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = predicate()
            if last:
                return last
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes and all their descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo, seen = 0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class RealRay:
    """Client side: runs `python ray_backend.py` (the server below) in its own session and sends it
    commands; the test process itself never connects to Ray (tests/raysim's session may have)."""

    def __init__(self, workdir: Path | None = None, python: str | None = None, env: dict | None = None) -> None:
        # Ray's socket paths must stay short: its temp dir is right under the temp root (make test: the
        # run's own, as on a new machine) when they fit there, never deep in pytest's tmp_path.
        self.temp_dir = ray_temp_dir()
        self.workdir = Path(workdir or self.temp_dir)
        self.dashboard_port = free_port()
        self.token = secrets.token_urlsafe(32)
        self.proc: subprocess.Popen | None = None
        self.current = None  # the attached slice: {"name", "pod_type", "topology", "hosts", "node_ids"}
        self.timings: dict[str, float] = {}
        # The interpreter of the head and its nodes (the serving venv's for vLLM, see start_serve).
        self.python = python or sys.executable
        self.env = dict(env or {})  # more environment for every Ray process of this head
        self.serve_port: int | None = None
        self.gcs_address: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _call(self, command: dict, timeout: float = 300) -> dict:
        assert self.proc is not None and self.proc.poll() is None, f"Ray backend not running; see {self.workdir}"
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"Ray backend: no answer to {command.get('cmd')} in {timeout}s; "
                               f"log: {self.log()[-3000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"Ray backend: {command.get('cmd')}: {answer['error']}")
        return answer

    def log(self) -> str:
        path = self.workdir / "ray-backend.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, warm: bool = True) -> "RealRay":
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        # The driver runs on the head: `python` there is this interpreter (with tputorch and Ray).
        env["PATH"] = str(Path(self.python).parent) + os.pathsep + env.get("PATH", "")
        env.update(RAY_ENV, RAY_AUTH_TOKEN=self.token)
        # Ray's default temp dir (where cluster_utils writes the cluster's address file, whatever
        # temp_dir the head gets) is this head's own: never a /tmp/ray that another Ray left, or that
        # a new machine lacks (issue 31: every real-Ray test errored at setup there).
        env["RAY_TMPDIR"] = self.temp_dir
        env.update(self.env)
        log = open(self.workdir / "ray-backend.log", "ab")
        self.proc = subprocess.Popen([self.python, __file__, "--dashboard-port", str(self.dashboard_port),
                                      "--temp-dir", self.temp_dir],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                     cwd=self.workdir, start_new_session=True)
        log.close()
        try:
            answer = self._call({"cmd": "start", "warm": warm})
            self.timings.update(answer["timings"])
            self.gcs_address = answer["gcs_address"]  # what Ray's autoscaler connects to (real_autoscaler.py)
        except BaseException:
            self.stop()
            raise
        return self

    def attach(self, rayjob: dict) -> dict:
        """Attach the simulated TPU hosts of `rayjob`'s slice (a rendered or live RayJob dict).
        Hosts of the same shape stay attached between calls. A host whose raylet Ray reports "timed
        out during startup" (its GCS missed the new node's heartbeats: seen once in 2026-12-06's
        make test, right after a test that killed a host) is the harness's, not the product's: the
        slice is detached and attached once more, and the retry is printed."""
        try:
            answer = self._call({"cmd": "attach", "rayjob": rayjob})
        except RuntimeError as exc:
            if "timed out during startup" not in str(exc):
                raise
            print(f"Ray backend: attach retried after a host's startup timed out: {str(exc)[:300]}")
            self.detach()
            answer = self._call({"cmd": "attach", "rayjob": rayjob})
        self.current = answer["slice"]
        self.timings.update(answer["timings"])
        return self.current

    def add_slice(self, rayservice: dict, replica: str) -> dict[int, str]:
        """Attach one more slice of `rayservice`'s shape, standing for the worker pod replica
        `replica` that KubeRay made when the group's replicas went up (as Ray's autoscaler raises
        them on GKE): the Ray nodes that pod's hosts would start, labelled as that replica's (the
        stand-in's prober probes its pods against them). Returns {TPU worker id: node id} (the ids
        ints again: the backend's answer is JSON, whose keys are strings)."""
        nodes = self._call({"cmd": "add_slice", "rayjob": rayservice, "replica": replica})["node_ids"]
        return {int(worker): node for worker, node in nodes.items()}

    def remove_slice(self, replica: str) -> None:
        self._call({"cmd": "remove_slice", "replica": replica})

    def kill_host(self, index: int) -> str:
        """Kill the Ray node of host `index` (TPU_WORKER_ID) of the attached slice; returns its node
        id. The next attach() of the same slice starts a new node for it."""
        node_id = self._call({"cmd": "kill_host", "index": index})["node_id"]
        self.current["node_ids"] = {k: v for k, v in self.current["node_ids"].items() if v != node_id}
        return node_id

    def detach(self) -> None:
        self._call({"cmd": "detach"})
        self.current = None

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    def start_serve(self) -> str:
        """Start Ray Serve on the head, its HTTP proxy on 127.0.0.1 on a free port (a config PUT
        later keeps these options); returns the proxy's URL."""
        self.serve_port = free_port()
        self.timings.update(self._call({"cmd": "start_serve", "port": self.serve_port}, timeout=600)["timings"])
        return self.serve_url

    def kill_serve_replica(self, deployment_prefix: str) -> str:
        """Kill the Ray actor of a live replica of the Serve deployment named `deployment_prefix...`
        (as a lost host or a preempted slice would); returns the actor's name."""
        return self._call({"cmd": "kill_serve_replica", "prefix": deployment_prefix}, timeout=120)["actor"]

    def delete_serve_apps(self) -> None:
        """Delete every Serve application (Serve and its proxy stay up), as a head pod's death would
        end them on GKE; removes the vLLM shared-memory segments they leaked."""
        self._call({"cmd": "delete_serve_apps"}, timeout=300)

    def metrics(self) -> dict[str, str]:
        """Each live Ray node's Prometheus exposition (its metrics export port, KubeRay's "metrics"
        port 8080 on GKE), by node id: Ray's own series and those Ray records for its users (Serve's,
        and vLLM's engine metrics that Ray Serve LLM records)."""
        return self._call({"cmd": "metrics"}, timeout=120)["metrics"]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._call({"cmd": "stop"}, timeout=120)
            except (RuntimeError, OSError, ValueError):
                pass
        _stop_session(self.proc)
        self.proc = None
        if self.workdir != Path(self.temp_dir):  # Ray's session files only; the log is in workdir
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def memory_bytes(self) -> int:
        return rss_bytes([self.proc.pid]) if self.proc else 0

    # -- jobs ----------------------------------------------------------------------------------
    def job(self, submission_id: str) -> dict | None:
        try:
            return http_json("GET", f"{self.url}/api/jobs/{submission_id}", token=self.token)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def jobs(self) -> list[dict]:
        return http_json("GET", f"{self.url}/api/jobs/", token=self.token)

    def logs(self, submission_id: str) -> str:
        return http_json("GET", f"{self.url}/api/jobs/{submission_id}/logs", token=self.token)["logs"]


# -- the server: one process that owns the Ray cluster --------------------------------------------

class _Server:
    def __init__(self, dashboard_port: int, temp_dir: str) -> None:
        self.dashboard_port = dashboard_port
        self.temp_dir = temp_dir
        self.cluster = None
        self.hosts = None  # contextlib.ExitStack of the attached slice
        self.key = None
        self.sim = None
        self.groups = {}  # spec.groups' name -> its simulated hosts (slicesim.SimSlice)
        self.added = {}  # pod replica name -> contextlib.ExitStack of a slice add_slice attached

    def start(self, warm: bool) -> dict:
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        from ray._common.utils import get_default_ray_temp_dir

        # Ray writes its default temp dir's files without making the dir (RAY_TMPDIR is ours: start).
        os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
        slicesim = load_slicesim()  # sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray reads it
        ray_constants.ENABLE_RAY_CLUSTER = False
        _patient_node_start()
        gcs_port = free_port()
        # Every process of this cluster inherits its address: a Ray process that looks for "the"
        # cluster (address "auto") must not pick another Ray cluster running on this machine.
        os.environ["RAY_ADDRESS"] = f"{slicesim.LOOPBACK}:{gcs_port}"
        os.environ["DASHBOARD_METRIC_PORT"] = str(free_port())
        t0 = time.monotonic()
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            ray_client_server_port=free_port(), **_node_ports(),
            gcs_server_port=gcs_port, num_cpus=1, node_ip_address=slicesim.LOOPBACK, include_dashboard=True,
            dashboard_host=slicesim.LOOPBACK,
            dashboard_port=self.dashboard_port, object_store_memory=OBJECT_STORE_BYTES, temp_dir=self.temp_dir))
        # Ray's job supervisor finds the cluster of a job's driver as address "auto": the address
        # file in the head's temp dir (which `ray start --head` writes and cluster_utils does not),
        # else any Ray cluster running on this machine.
        from ray._private.utils import write_ray_address

        write_ray_address(self.cluster.address, self.temp_dir)
        add_node = self.cluster.add_node  # the hosts slicesim adds get free ports too
        self.cluster.add_node = lambda **kwargs: add_node(**{**_node_ports(), **kwargs})
        ray.init(address=self.cluster.address, logging_level="WARNING", log_to_driver=False)
        url = f"http://127.0.0.1:{self.dashboard_port}"
        token = os.environ["RAY_AUTH_TOKEN"]
        wait(lambda: http_json("GET", f"{url}/api/version", token=token), 120, "the Ray dashboard")
        timings = {"head_start_s": time.monotonic() - t0}
        if warm:  # the first job pays for the job agent and a worker process: not the tests
            t1 = time.monotonic()
            # The dashboard answers /api/version before its job module can take a job (500 then).
            sid = wait(lambda: http_json("POST", f"{url}/api/jobs/", {"entrypoint": "true"}, 60,
                                         token)["submission_id"], 120, "the warm-up job to be accepted", interval=2)
            job = wait(lambda: (lambda j: j if j["status"] in ("SUCCEEDED", "FAILED", "STOPPED") else None)(
                http_json("GET", f"{url}/api/jobs/{sid}", token=token)), 120, "the warm-up job")
            if job["status"] != "SUCCEEDED":
                raise RuntimeError(f"warm-up job: {job}")
            timings["warmup_job_s"] = time.monotonic() - t1
        return {"timings": timings, "gcs_address": self.cluster.address}

    def attach(self, rayjob: dict) -> dict:
        import contextlib

        from ray._common.utils import get_default_ray_temp_dir

        # Ray writes its default temp dir's files without making the dir (RAY_TMPDIR is ours: start).
        os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
        slicesim = load_slicesim()
        rayjob = _as_rayjob(rayjob)
        probe = slicesim.slice_from_rayjob(rayjob)
        groups = _groups(slicesim, rayjob)
        key = (probe.pod_type, probe.topology, probe.chips_per_host, len(probe.hosts), probe.cpus_per_host,
               tuple((name, g.pod_type, g.topology, len(g.hosts), g.gpus_per_host) for name, g in groups.items()))
        timings = {}
        if key != self.key:
            self.detach()
            sim = slicesim.slice_from_rayjob(rayjob, slice_name=f"sim-{probe.pod_type}-{probe.topology}")
            sim.hosts = [_own_serve_port(h) for h in sim.hosts]
            t0 = time.monotonic()
            stack = contextlib.ExitStack()
            stack.enter_context(slicesim.attached(self.cluster, sim))
            for group in groups.values():
                stack.enter_context(slicesim.attached(self.cluster, group))
            self.hosts, self.key, self.sim, self.groups = stack, key, sim, groups
            timings[f"attach_{sim.pod_type}_{len(sim.hosts)}_hosts_s"] = time.monotonic() - t0
        else:
            missing = [h for h in self.sim.hosts if h.index not in self.sim.node_ids]
            if missing:  # a host killed by kill_host: a new attempt gets the whole slice again
                t0 = time.monotonic()
                nodes = {h.index: slicesim.add_host(self.cluster, self.sim, h) for h in missing}
                for node in nodes.values():
                    self.hosts.callback(slicesim.remove_if_present, self.cluster, node)
                slicesim.record_node_ids(self.cluster, self.sim, nodes)
                timings[f"readd_{len(missing)}_hosts_s"] = time.monotonic() - t0
        s = self.sim
        return {"slice": {"name": s.name, "pod_type": s.pod_type, "topology": s.topology, "hosts": len(s.hosts),
                          "chips_per_host": s.chips_per_host, "node_ids": s.node_ids,
                          "groups": {name: sorted(g.node_ids.values()) for name, g in self.groups.items()}},
                "timings": timings}

    def add_slice(self, rayjob: dict, replica: str) -> dict:
        import contextlib

        slicesim = load_slicesim()
        sim = slicesim.slice_from_rayjob(_as_rayjob(rayjob), slice_name=f"sim-{replica}")
        sim.hosts = [_own_serve_port(h, {POD_REPLICA_LABEL: replica}) for h in sim.hosts]
        self.remove_slice(replica)
        stack = contextlib.ExitStack()
        stack.enter_context(slicesim.attached(self.cluster, sim))
        self.added[replica] = stack
        return {"node_ids": sim.node_ids}

    def remove_slice(self, replica: str) -> dict:
        stack = self.added.pop(replica, None)
        if stack is not None:
            stack.close()
        return {}

    def kill_host(self, index: int) -> dict:
        """Remove one attached host's Ray node with Ray's own Cluster.remove_node (its raylet and
        every worker process on it die at once, as on a preempted TPU VM)."""
        node_id = self.sim.node_ids.pop(index)
        (node,) = [n for n in self.cluster.worker_nodes if n.node_id == node_id]
        self.cluster.remove_node(node, allow_graceful=False)
        return {"node_id": node_id}

    def detach(self) -> dict:
        for replica in list(self.added):
            self.remove_slice(replica)
        if self.hosts is not None:
            self.hosts.close()
        self.hosts = self.key = self.sim = None
        self.groups = {}
        return {}

    def start_serve(self, port: int) -> dict:
        from ray import serve

        t0 = time.monotonic()
        self.shm_before = set(_shm_segments())
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        wait(lambda: _answers(f"http://127.0.0.1:{port}/-/healthz"), 120, "the Serve proxy")
        return {"timings": {"serve_start_s": time.monotonic() - t0}}

    def metrics(self) -> dict:
        import ray

        texts = {}
        for node in ray.nodes():
            if node["Alive"]:
                url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
                try:
                    with urllib.request.urlopen(url, timeout=60) as resp:
                        texts[node["NodeID"]] = resp.read().decode()
                except OSError as exc:  # an agent not exporting yet: the caller scrapes again
                    texts[node["NodeID"]] = f"# {url}: {exc!r}\n"
        return {"metrics": texts}

    def kill_serve_replica(self, prefix: str) -> dict:
        import ray
        from ray.util.state import list_actors

        names = sorted(a["name"] for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000)
                       if a.get("name") and prefix in a["name"] and a["name"].startswith("SERVE_REPLICA"))
        if not names:
            raise RuntimeError(f"no live Serve replica actor of {prefix!r}")
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        return {"actor": names[0]}

    def delete_serve_apps(self) -> dict:
        from ray import serve

        for name in list(serve.status().applications):
            serve.delete(name)
        self._remove_leaked_shm()
        return {}

    def _remove_leaked_shm(self) -> None:
        """What killed vLLM replicas leave in /dev/shm (message queues of ~400 MiB each, semaphores).
        Only those made since Serve started here that no live process maps (not another user's)."""
        mapped = set()
        for maps in Path("/proc").glob("[0-9]*/maps"):
            try:
                mapped.update(line.split(maxsplit=5)[-1].strip() for line in maps.read_text().splitlines()
                              if "/dev/shm/" in line)
            except OSError:
                pass
        for path in set(_shm_segments()) - getattr(self, "shm_before", set()) - mapped:
            try:
                os.unlink(path)
            except OSError:
                pass

    def stop(self) -> dict:
        import ray

        self.detach()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        if hasattr(self, "shm_before"):
            self._remove_leaked_shm()
        return {}


def _groups(slicesim, rayjob: dict) -> dict:
    """The hosts of the RayJob's spec.groups (every worker group but the training slice): a TPU
    group's slice (one replica) as slicesim makes the training slice, a GPU or CPU group's pods as
    Ray nodes with the group's labels, resources and GPUs."""
    spec = rayjob["spec"]["rayClusterSpec"]
    out = {}
    for group in spec["workerGroupSpecs"] if len(spec["workerGroupSpecs"]) > 1 else []:
        name = group["groupName"]
        if name == "tpu-slice":
            continue
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        out[name] = (slicesim.slice_from_rayjob(rayjob, slice_name=f"sim-{name}", group_name=name)
                     if slicesim.TPU_RESOURCE in limits else slicesim.nodes_from_group(rayjob, name))
    return out


def _own_serve_port(host, labels: dict[str, str] | None = None):
    """The host with a Serve proxy port of its own (Ray Serve's per-worker-node override; all nodes
    share 127.0.0.1 here, on GKE each pod has its own :8000), named in a node label so that the stand-in
    dashboard's prober can run a RayService worker pod's readiness probe against this node's proxy;
    and `labels`, more node labels."""
    import dataclasses

    port = str(free_port())
    return dataclasses.replace(host, env={**host.env, "RAY_SERVE_WORKER_PROXY_HTTP_PORT": port},
                               labels={**host.labels, SERVE_PORT_LABEL: port, **(labels or {})})


def _as_rayjob(obj: dict) -> dict:
    """A RayService as slicesim reads a RayJob: its rayClusterConfig is the same cluster spec."""
    if "rayClusterConfig" in obj.get("spec", {}):
        return {**obj, "spec": {"rayClusterSpec": obj["spec"]["rayClusterConfig"]}}
    return obj


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at all (the Serve proxy says 503 until it has a route)."""
    try:
        _no_proxy.open(url, timeout=5).close()
    except urllib.error.HTTPError:
        pass
    return True


def _shm_segments() -> list[str]:
    """vLLM's message queues (psm_*) and Python multiprocessing's named semaphores (sem.mp-*)."""
    return [str(p) for pattern in ("psm_*", "sem.mp-*") for p in Path("/dev/shm").glob(pattern)]


def _node_ports() -> dict:
    """Ports for a node's agents. Ray's defaults are fixed (they clash with any other Ray cluster on
    this machine) or picked by the agent and then awaited by the raylet for a fixed time, which a
    slow agent on a busy machine misses: give each a free port."""
    return {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port(),
            "runtime_env_agent_port": free_port(), "metrics_agent_port": free_port()}


def _patient_node_start(wait_s: float = 180) -> None:
    """Ray's Node gives a new node's raylet a fixed 30 s to register with the GCS; on a busy 2-core
    machine its dashboard agent alone can take longer. Make the registration lookup itself wait."""
    from ray._private import services

    if getattr(services.get_node, "_patient", False):
        return
    get_node = services.get_node

    def patient_get_node(*args, **kwargs):
        end = time.monotonic() + wait_s
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)

    patient_get_node._patient = True
    services.get_node = patient_get_node


def _serve(argv: list[str]) -> int:
    import argparse
    import traceback

    p = argparse.ArgumentParser()
    p.add_argument("--dashboard-port", type=int, required=True)
    p.add_argument("--temp-dir", required=True)
    args = p.parse_args(argv)
    server = _Server(args.dashboard_port, args.temp_dir)
    out = sys.stdout
    sys.stdout = sys.stderr  # Ray's prints must not mix with the answers
    for line in sys.stdin:
        command = json.loads(line)
        try:
            cmd = command.pop("cmd")
            answer = getattr(server, cmd)(**command)
        except Exception as exc:
            traceback.print_exc()
            answer = {"error": f"{type(exc).__name__}: {exc}{_newest_raylet_logs(args.temp_dir, exc)}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if cmd == "stop":
            break
    return 0


def _newest_raylet_logs(temp_dir: str, exc: Exception, chars: int = 1500) -> str:
    """For a node that did not register in time (Ray's "timed out during startup"): the tails of the
    newest raylet's logs, which the session's removal at stop() would take along."""
    if "timed out during startup" not in str(exc):
        return ""
    logs = Path(temp_dir).glob("session_*/logs/raylet*.*")
    newest = sorted(logs, key=lambda p: p.stat().st_mtime)[-2:]
    return "".join(f"\n--- {p.name} (tail) ---\n{p.read_text(errors='replace')[-chars:]}" for p in newest)


def _stop_session(proc: subprocess.Popen) -> None:
    """`ray start --block` stops its node's processes on SIGTERM; anything left in the session goes
    with a SIGKILL of the process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1:]))
