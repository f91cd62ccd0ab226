"""Issue 16's measures on the local cluster, besides the bursts of bench/burst.py:

- ``end_to_end``: apply -> every TPU worker pod of the slice bound and Running, the operator's
  path (a TPUTorchJob) against the same RayJob applied by hand, alternately; KubeRay running.
- ``existing``: thousands of finished and running jobs made through the API while the operator is
  stopped (tests/cluster/population.py); the first start, a restart (which must write nothing),
  idle CPU afterwards, and a burst on top of them against the same burst on an empty cluster.
- ``unrelated_pods``: the operator's RSS with thousands of pods that are not its own, and without.
- ``waiting``: status writes of jobs that wait for a busy slice (their pods Unschedulable).

Every timestamp is on this process's clock; every figure carries the load average at its time.
"""

from __future__ import annotations

import copy
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tputorch import render
from tputorch.render.names import JOB_LABEL
from tputorch.render.names import JOB_LABEL
from tputorch.api import spec

import burst
from burst import OperatorProcess, cpu_s, percentile, rss_mb

REPO = Path(__file__).resolve().parents[1]
import population  # noqa: E402  (tests/cluster is on sys.path through burst)

GROUP, VERSION, PLURAL = burst.GROUP, burst.VERSION, burst.PLURAL
RAY = burst.RAY
BENCH_NODE_LABEL = "tputorch.local/bench-node"


def load() -> float:
    return round(os.getloadavg()[0], 1)


# --- the operator's /metrics ----------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def scrape(op: OperatorProcess) -> dict[str, float] | None:
    """Every sample of the operator's /metrics by its name with labels; None while it is not served."""
    try:
        text = op.metrics()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def settle(op: OperatorProcess, started: float, objects: int, quiet: float = 3.0, timeout: float = 900) -> dict:
    """Poll /metrics until every object was reconciled at least once, the queue is empty and no
    status patch came for ``quiet`` seconds. Times are from ``started`` (the operator's spawn)."""
    end = started + timeout
    served = reconciled = last_patch_at = None
    patches = -1.0
    while time.monotonic() < end:
        s = scrape(op)
        now = time.monotonic()
        if s is None:
            time.sleep(0.25)
            continue
        served = served or now
        p = total(s, "tputorch_status_patches_total")
        if p != patches:
            patches, last_patch_at = p, now
        if reconciled is None and total(s, "tputorch_reconciles_total") >= objects:
            reconciled = now
        if reconciled and s.get("tputorch_queue_depth", 1) == 0 and now - last_patch_at >= quiet:
            return {"served_s": served - started, "reconciled_s": reconciled - started,
                    "last_patch_s": (last_patch_at - started) if patches else 0.0,
                    "status_writes": patches, "creates": s.get('tputorch_reconciles_total{kind="TPUTorchJob",result="created"}', 0.0),
                    "reconciles": total(s, "tputorch_reconciles_total"),
                    "reconcile_results": {k.split('"')[1]: v for k, v in s.items()
                                          if k.startswith("tputorch_reconciles_total{")},
                    "complete": True}
        time.sleep(0.25)
    return {"complete": False, "status_writes": patches}


# --- cluster helpers ------------------------------------------------------------------------------

def delete_namespace(bench: burst.Bench, name: str, timeout: float = 600) -> None:
    try:
        bench.core.delete_namespace(name, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
    if name in bench.namespaces:
        bench.namespaces.remove(name)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            bench.core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(1)


def versions(bench: burst.Bench, ns: str) -> dict[str, str]:
    """resourceVersion of every TPUTorchJob and RayJob in ns."""
    out = {}
    for (g, v, p), tag in (((GROUP, VERSION, PLURAL), "job"), (RAY, "rayjob")):
        for item in bench.custom.list_namespaced_custom_object(g, v, ns, p)["items"]:
            out[f"{tag}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def event_count(bench: burst.Bench, ns: str) -> int:
    events = client.EventsV1Api(bench.api)
    return len(events.list_namespaced_event(ns).items)


def bench_nodes(bench: burst.Bench, tpu_2x2: int) -> list[str]:
    """KWOK nodes for the bench: one large CPU node (heads, submitters) and ``tpu_2x2`` more v6e
    2x2 hosts, copied from hack/nodes.yaml. Not labelled type=kwok: hack/cluster.sh counts those."""
    items = yaml.safe_load((REPO / "hack" / "nodes.yaml").read_text())["items"]
    pool = lambda n: n["metadata"]["labels"].get("cloud.google.com/gke-nodepool")  # noqa: E731
    cpu = next(n for n in items if pool(n) == "cpu-pool")
    tpu = next(n for n in items if pool(n) == "tpu-v6e-2x2")
    nodes = []
    big = copy.deepcopy(cpu)
    big["status"]["capacity"] = big["status"]["allocatable"] = {"cpu": "1000", "memory": "4000Gi", "pods": "2000"}
    nodes.append(("bench-cpu-0", "bench-cpu-pool", big))
    nodes += [(f"bench-v6e-2x2-{i:03d}", "bench-v6e-2x2", copy.deepcopy(tpu)) for i in range(tpu_2x2)]
    names = []
    for name, pool_name, node in nodes:
        meta = node["metadata"]
        meta["name"] = name
        meta["labels"].update({"kubernetes.io/hostname": name, "cloud.google.com/gke-nodepool": pool_name,
                               "type": "kwok-bench", BENCH_NODE_LABEL: "true"})
        try:
            bench.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        names.append(name)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        ready = [n for n in bench.core.list_node(label_selector=f"{BENCH_NODE_LABEL}=true").items
                 if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
        if len(ready) >= len(names):
            break
        time.sleep(1)
    return names


def remove_bench_nodes(bench: burst.Bench) -> None:
    bench.core.delete_collection_node(label_selector=f"{BENCH_NODE_LABEL}=true")


class PodWatch(threading.Thread):
    """Watches the pods of a namespace; records when each job first has all its TPU worker pods
    bound and Running."""

    def __init__(self, core: client.CoreV1Api, namespace: str, hosts: int) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace, self.hosts = core, namespace, hosts
        self.running: dict[str, set[str]] = {}  # job -> worker pods Running
        self.done: dict[str, float] = {}
        self.live = threading.Event()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        rv = self.core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
        self.live.set()
        while not self.stop_flag.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace, resource_version=rv,
                                                  label_selector=JOB_LABEL, timeout_seconds=30):
                    now = time.monotonic()
                    pod = event["object"]
                    rv = pod.metadata.resource_version
                    labels = pod.metadata.labels or {}
                    if labels.get("ray.io/node-type") != "worker":
                        continue
                    job = labels[JOB_LABEL]
                    up = event["type"] != "DELETED" and pod.spec.node_name and pod.status.phase == "Running"
                    pods = self.running.setdefault(job, set())
                    (pods.add if up else pods.discard)(pod.metadata.name)
                    if len(pods) >= self.hosts and job not in self.done:
                        self.done[job] = now
                    if self.stop_flag.is_set():
                        return
            except Exception:  # an expired resourceVersion or a dropped stream: start again from now
                rv = self.core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
                time.sleep(0.2)

    def wait(self, jobs, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if set(jobs) <= self.done.keys():
                return True
            time.sleep(0.02)
        return False


def _wait_empty(bench: burst.Bench, ns: str, timeout: float = 300) -> None:
    """Until no pod, RayJob or TPUTorchJob is left in ns (the slice is free again)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not bench.core.list_namespaced_pod(ns, limit=1).items and \
                not bench.custom.list_namespaced_custom_object(*RAY[:2], ns, RAY[2], limit=1)["items"] and \
                not bench.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, limit=1)["items"]:
            return
        time.sleep(0.25)
    raise RuntimeError(f"{ns} not empty after {timeout}s")


def _job(name: str, topo: str) -> dict:
    body = population.job_body(name, suspend=False)
    body["spec"]["tpu"]["topology"] = topo
    return body


def _rayjob(name: str, ns: str, topo: str) -> dict:
    return render.rayjob(spec.parse({**_job(name, topo), "metadata": {"name": name, "namespace": ns}}))


# --- measure 1: end to end with KubeRay --------------------------------------------------------------

def end_to_end(bench: burst.Bench, samples: int, concurrent: int, rounds: int = 1) -> dict:
    """One v6e 4x4 job at a time (``samples`` each way, alternating which goes first), then
    ``concurrent`` v6e 2x2 jobs at once each way (4x4 slices for all would need 4 nodes each),
    ``rounds`` times with the order turned each round (the side that goes second runs while the
    first one's clean-up still settles): p50 over every round's jobs, and each round's ratio."""
    op_ns, hand_ns = bench.namespace("e2e-operator", samples), bench.namespace("e2e-hand", samples)
    op = OperatorProcess(bench.kubeconfig, bench.log_dir / "e2e-operator.log", [op_ns]).start()
    watches = {}
    result = {"single": {"operator": [], "hand": []}, "rayjob_s": {"operator": [], "hand": []}, "load": [],
              "writes": {"operator": {}, "hand": {}}, "writes_jobs": {"operator": 0, "hand": 0}}
    try:
        def one(side: str, names: list[str], topo: str, hosts: int) -> list[float]:
            ns = op_ns if side == "operator" else hand_ns
            w = PodWatch(bench.core, ns, hosts)
            w.start()
            rj = burst.Watcher(bench.custom, RAY, ns)  # splits the wait: create -> RayJob -> pods
            rj.start()
            w.live.wait(10)
            time.sleep(1)
            sent = {}
            before = burst.apiserver_writes(bench.api)

            def create(name):
                sent[name] = time.monotonic()
                if side == "operator":
                    bench.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _job(name, topo))
                else:
                    bench.custom.create_namespaced_custom_object(*RAY[:2], ns, RAY[2], _rayjob(name, ns, topo))

            with ThreadPoolExecutor(burst.CREATORS) as pool:
                list(pool.map(create, names))
            ok = w.wait(names, 120 + 2 * len(names))
            # Every write to the job's objects while the user waited (ours, KubeRay's, the scheduler's events).
            for k, v in burst.writes_per_job(before, burst.apiserver_writes(bench.api), 1).items():
                result["writes"][side][k] = result["writes"][side].get(k, 0.0) + v
            result["writes_jobs"][side] += len(names)
            w.stop_flag.set()
            rj.stop_flag.set()
            lat = [w.done[n] - sent[n] for n in names if n in w.done]
            result["rayjob_s"][side] += [rj.seen[n] - sent[n] for n in names if n in rj.seen]
            if not ok:
                print(f"   {side}: {len(lat)}/{len(names)} jobs reached Running", flush=True)
            g, v, p = (GROUP, VERSION, PLURAL) if side == "operator" else RAY
            bench.custom.delete_collection_namespaced_custom_object(g, v, ns, p, propagation_policy="Background")
            _wait_empty(bench, ns)
            return lat

        for i in range(samples):
            order = ("operator", "hand") if i % 2 == 0 else ("hand", "operator")
            for side in order:
                result["single"][side] += one(side, [f"one-{i:03d}"], "4x4", 4)
            result["load"].append(load())
        single = {side: {"n": len(v), "p50_s": percentile(v, 0.5), "p90_s": percentile(v, 0.9)}
                  for side, v in result["single"].items()}
        result["single_summary"] = single
        result["rayjob_p50_s"] = {side: percentile(v, 0.5) for side, v in result["rayjob_s"].items()}
        result["single_p50_ratio"] = single["operator"]["p50_s"] / single["hand"]["p50_s"]
        print(f"   one at a time: operator p50 {single['operator']['p50_s']:.3f}s, "
              f"hand {single['hand']['p50_s']:.3f}s ({result['single_p50_ratio']:.2f}x)", flush=True)
        if concurrent:
            pooled: dict[str, list[float]] = {"hand": [], "operator": []}
            loads: dict[str, list[float]] = {"hand": [], "operator": []}
            per_round = []
            for r in range(rounds):
                this = {}
                for side in ("hand", "operator") if r % 2 == 0 else ("operator", "hand"):
                    lat = one(side, [f"many-{r}-{i:03d}" for i in range(concurrent)], "2x2", 1)
                    pooled[side] += lat
                    loads[side].append(load())
                    this[side] = percentile(lat, 0.5)
                this["p50_ratio"] = this["operator"] / this["hand"]
                per_round.append(this)
                print(f"   {concurrent} at once, round {r + 1}/{rounds}: operator p50 {this['operator']:.2f}s, "
                      f"hand {this['hand']:.2f}s ({this['p50_ratio']:.2f}x)", flush=True)
            many = {side: {"n": len(lat), "of": concurrent * rounds, "at_once": concurrent, "p50_s": percentile(lat, 0.5),
                           "p99_s": percentile(lat, 0.99), "max_s": max(lat, default=float("nan")),
                           "load": max(loads[side])} for side, lat in pooled.items()}
            many["p50_ratio"] = many["operator"]["p50_s"] / many["hand"]["p50_s"]
            many["max_ratio"] = many["operator"]["max_s"] / many["hand"]["max_s"]
            many["rounds"] = per_round
            result["concurrent"] = many
            print(f"   {concurrent} at once, {rounds} round(s) pooled: operator p50 {many['operator']['p50_s']:.2f}s, "
                  f"hand {many['hand']['p50_s']:.2f}s ({many['p50_ratio']:.2f}x)", flush=True)
        result["writes_per_job"] = {side: {k: v / max(1, result["writes_jobs"][side]) for k, v in w.items()}
                                    for side, w in result["writes"].items()}
        result["operator_traceback"] = "Traceback" in op.log()
    finally:
        op.stop()
        for ns in (op_ns, hand_ns):
            delete_namespace(bench, ns)
    return result


# --- measure 3: thousands of existing objects, a first start and a restart -------------------------

def existing(bench: burst.Bench, objects: int, burst_n: int, idle_s: float) -> dict:
    # 9 in 10 finished (half of those with their RayJob deleted since, as clean-ups do), 1 in 10 running.
    running = objects // 10
    failed = (objects - running) // 9
    cleaned = (objects - running - failed) // 2
    counts = {"Succeeded": objects - running - failed - cleaned, "Cleaned": cleaned, "Failed": failed,
              "Running": running}
    res: dict = {"objects": objects, "counts": counts}

    # The same burst on an empty cluster first (the yardstick for the burst on top).
    empty_ns = bench.namespace("burst-empty", burst_n)
    op = OperatorProcess(bench.kubeconfig, bench.log_dir / "existing-empty.log", [empty_ns]).start()
    try:
        time.sleep(2)
        res["burst_empty"] = {**bench._through_controller(empty_ns, burst_n, op.proc.pid), "load": load()}
    finally:
        op.stop()
    delete_namespace(bench, empty_ns)

    pop_ns = bench.namespace("existing", objects)
    loaded_ns = bench.namespace("burst-loaded", burst_n)
    print(f"   making {objects} jobs with their RayJobs and statuses ({counts})", flush=True)
    res["populate"] = {**population.populate(bench.custom, pop_ns, counts, job_status=True), "load": load()}
    print(f"   made in {res['populate']['seconds']:.0f}s", flush=True)

    def start(label: str) -> tuple[OperatorProcess, dict]:
        op = OperatorProcess(bench.kubeconfig, bench.log_dir / f"existing-{label}.log", [pop_ns, loaded_ns])
        started = time.monotonic()
        op.start(timeout=300)
        out = settle(op, started, objects)
        out.update(rss_mb=rss_mb(op.proc.pid), cpu_s=cpu_s(op.proc.pid), load=load())
        print(f"   {label}: {out}", flush=True)
        return op, out

    def changed(before: dict, after: dict) -> int:
        return sum(1 for k, v in after.items() if before.get(k) != v) + len(before.keys() - after.keys())

    # Every status is already right: the first start over them must write nothing either.
    before, events_before = versions(bench, pop_ns), event_count(bench, pop_ns)
    op, res["first_start"] = start("first-start")
    op.stop()
    after = versions(bench, pop_ns)
    res["first_start"]["objects_changed"] = changed(before, after)
    res["first_start"]["events_posted"] = event_count(bench, pop_ns) - events_before
    before, events_before = after, event_count(bench, pop_ns)
    op, restart = start("restart")
    try:
        cpu0 = cpu_s(op.proc.pid)
        time.sleep(idle_s)
        restart["idle_cpu_ms_per_s"] = 1000 * (cpu_s(op.proc.pid) - cpu0) / idle_s
        after = versions(bench, pop_ns)
        restart["objects_changed"] = changed(before, after)
        restart["events_posted"] = event_count(bench, pop_ns) - events_before
        restart["rss_after_idle_mb"] = rss_mb(op.proc.pid)
        res["restart"] = restart
        print(f"   restart: {restart['status_writes']:.0f} status writes, {restart['objects_changed']} objects changed, "
              f"{restart['events_posted']} events, idle {restart['idle_cpu_ms_per_s']:.1f} ms CPU/s", flush=True)
        res["burst_loaded"] = {**bench._through_controller(loaded_ns, burst_n, op.proc.pid), "load": load()}
        res["burst_p50_ratio"] = res["burst_loaded"]["p50_ms"] / res["burst_empty"]["p50_ms"]
        res["operator_traceback"] = "Traceback" in op.log()
    finally:
        op.stop()
        delete_namespace(bench, loaded_ns)
        delete_namespace(bench, pop_ns)
    return res


# --- measure 4: pods that are not the operator's ----------------------------------------------------

def _pod(name: str) -> dict:
    # Gated: the scheduler never looks at it, no kubelet runs it; it just exists, as pods of other
    # workloads do.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "unrelated"}},
            "spec": {"schedulingGates": [{"name": "tputorch.local/bench"}], "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": "example.com/app:1",
                                     "env": [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(8)]}]}}


def _make_pods(bench: burst.Bench, ns: str, n: int) -> float:
    def create(i):
        for attempt in range(20):
            try:
                bench.core.create_namespaced_pod(ns, _pod(f"unrelated-{i:05d}"))
                return
            except ApiException as exc:  # the namespace's default service account may not exist yet
                if exc.status in (403, 409, 429, 500, 503) and attempt < 19:
                    if exc.status == 409:
                        return
                    time.sleep(0.5)
                    continue
                raise
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(n)))
    return time.monotonic() - started


def _operator_rss(bench: burst.Bench, label: str, settle_s: float = 5.0) -> dict:
    """A cluster-wide operator's RSS once it has listed everything (its /metrics answers) and idled."""
    op = OperatorProcess(bench.kubeconfig, bench.log_dir / f"pods-{label}.log", None)
    started = time.monotonic()
    op.start(timeout=300)
    try:
        while scrape(op) is None:
            time.sleep(0.2)
        listed = time.monotonic() - started
        time.sleep(settle_s)
        return {"rss_mb": rss_mb(op.proc.pid), "listed_s": listed, "load": load()}
    finally:
        op.stop()


def unrelated_pods(bench: burst.Bench, pods: int) -> dict:
    res = {"pods": pods, "none": _operator_rss(bench, "none")}
    ns = bench.namespace("pods", pods)
    try:
        res["create_s"] = _make_pods(bench, ns, pods)
        res["with"] = _operator_rss(bench, "with")
    finally:
        delete_namespace(bench, ns)
    res["none_after"] = _operator_rss(bench, "none-after")
    base = (res["none"]["rss_mb"] + res["none_after"]["rss_mb"]) / 2
    res["rss_delta_mb"] = res["with"]["rss_mb"] - base
    print(f"   RSS {res['none']['rss_mb']:.1f} / {res['with']['rss_mb']:.1f} / {res['none_after']['rss_mb']:.1f} MB "
          f"(none / {pods} pods / none)", flush=True)
    return res


# --- measure 5: jobs waiting for a busy slice ---------------------------------------------------------

def _slice_reasons(bench: burst.Bench, ns: str) -> dict[str, str]:
    out = {}
    for job in bench.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
        cond = next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "SliceReady"), {})
        out[job["metadata"]["name"]] = cond.get("reason", "")
    return out


class ModifiedCounter(threading.Thread):
    """Counts MODIFIED events per TPUTorchJob of ``names`` in a namespace, from now on."""

    def __init__(self, custom, namespace: str, names: set[str]) -> None:
        super().__init__(daemon=True)
        self.custom, self.namespace, self.names = custom, namespace, names
        self.counts: dict[str, int] = {}
        self.live = threading.Event()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        rv = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["metadata"]["resourceVersion"]
        self.live.set()
        while not self.stop_flag.is_set():
            try:
                for event in watch.Watch().stream(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                                  self.namespace, PLURAL, resource_version=rv, timeout_seconds=30):
                    rv = event["object"]["metadata"]["resourceVersion"]
                    name = event["object"]["metadata"]["name"]
                    if event["type"] == "MODIFIED" and name in self.names and not self.stop_flag.is_set():
                        self.counts[name] = self.counts.get(name, 0) + 1
            except Exception:  # a dropped stream: resume from the last resourceVersion
                time.sleep(0.5)


def waiting(bench: burst.Bench, jobs: int, window_s: float) -> dict:
    """One v6e 4x4 job holds the pool's only slice; ``jobs`` more wait for it. Status writes of
    the waiting jobs over ``window_s`` once all of them show SliceReady=False Unschedulable."""
    ns = bench.namespace("waiting", jobs)
    op = OperatorProcess(bench.kubeconfig, bench.log_dir / "waiting.log", [ns]).start()
    res: dict = {"jobs": jobs, "window_s": window_s}
    try:
        bench.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _job("holder", "4x4"))
        end = time.monotonic() + 120
        while _slice_reasons(bench, ns).get("holder") != "AllHostsReady":
            if time.monotonic() > end:
                raise RuntimeError("the holder job never got its slice")
            time.sleep(1)
        names = [f"wait-{i:03d}" for i in range(jobs)]
        with ThreadPoolExecutor(burst.CREATORS) as pool:
            list(pool.map(lambda n: bench.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                                 _job(n, "4x4")), names))
        started = time.monotonic()
        while True:
            reasons = _slice_reasons(bench, ns)
            if all(reasons.get(n) == "Unschedulable" for n in names):
                break
            if time.monotonic() - started > 300:
                raise RuntimeError(f"not all jobs Unschedulable: {sorted(set(reasons.values()))}")
            time.sleep(2)
        res["all_unschedulable_s"] = time.monotonic() - started
        # Writes to the waiting jobs only (the holder's own status moves with its pods): every
        # MODIFIED event of a waiting job in the window, which only the operator's writes cause.
        counter = ModifiedCounter(bench.custom, ns, set(names))
        counter.start()
        counter.live.wait(30)
        s0 = scrape(op)
        time.sleep(window_s)
        s1 = scrape(op)
        counter.stop_flag.set()
        writes = sum(counter.counts.values())
        res.update(status_writes=writes, all_status_writes=total(s1, "tputorch_status_patches_total") - total(s0, "tputorch_status_patches_total"),
                   reconciles=total(s1, "tputorch_reconciles_total") - total(s0, "tputorch_reconciles_total"),
                   per_job_per_5min=writes / jobs * 300 / window_s, load=load(),
                   most_written=max(counter.counts.values(), default=0),
                   reasons=sorted(set(_slice_reasons(bench, ns).values())))
        res["operator_traceback"] = "Traceback" in op.log()
        print(f"   {jobs} waiting jobs, {window_s:.0f}s: {writes:.0f} status writes "
              f"({res['per_job_per_5min']:.2f} per job per 5 min), {res['reconciles']:.0f} reconciles", flush=True)
    finally:
        op.stop()
        delete_namespace(bench, ns)
    return res
