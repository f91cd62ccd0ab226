"""Two replicas with leader election, each talking to the API server through a fault proxy of its
own (tests/cluster/faultproxy.py): the API server restarted, the leader blackholed for 60 s, and
random refuse/reset/blackhole episodes while a burst of jobs and reruns goes on.

After each: at most one replica wrote in any 1-second window (writes counted at the proxies as
they leave for the API server; Lease writes excluded), every job has exactly one RayJob and its true
phase, no Succeeded/Failed job ever went back, and both replicas claimed to lead
(`tputorch_leader`) for no longer than the lease duration at a time.

A replica that loses its Lease exits (as client-go's controllers do); a supervisor here starts it
again, as the kubelet would. TPUTORCH_HA_EPISODES_SECONDS sets the random run's length and
TPUTORCH_HA_BURST the burst's size (CI: 60 s and 80 jobs; the issue's run, made by hand and recorded
in bench/RESULTS.md: 300 s and 200 jobs). Most of the test's time is KubeRay working through the
burst, not the operator.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from faultproxy import FaultProxy, writers_per_second
from operator_process import OperatorProcess, tputorch_crd  # noqa: F401 (fixture)
from test_faults import (_cluster_up, _kill_component, _require_local_cluster, create_jobs, jobs,
                         wait_consistent)
from test_operator_e2e import GROUP, PLURAL, VERSION, job_body

from tputorch.controller.leader import LEASE_DURATION

EPISODES_SECONDS = float(os.environ.get("TPUTORCH_HA_EPISODES_SECONDS", "60"))
BURST = int(os.environ.get("TPUTORCH_HA_BURST", "80"))
TERMINAL = ("Succeeded", "Failed")


def _proxied_kubeconfig(kubeconfig: str, proxy: FaultProxy, path: Path) -> str:
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"] = {"server": proxy.url}
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


class Replicas:
    """Two operator replicas behind their own proxies, restarted when they exit; samples of who
    claims to lead and of every job's phase, once a second."""

    def __init__(self, kube, namespace: str, tmp_path: Path) -> None:
        cfg = yaml.safe_load(Path(kube.kubeconfig).read_text())
        server = urlsplit(cfg["clusters"][0]["cluster"]["server"])
        ca = cfg["clusters"][0]["cluster"]["certificate-authority"]
        self.kube, self.namespace = kube, namespace
        self.proxies = [FaultProxy((server.hostname, server.port), ca, name=f"replica-{i}") for i in range(2)]
        args = ["--leader-elect", "--lease-namespace", namespace, "--lease-name", f"tputorch-{namespace}"]
        self.ops = [OperatorProcess(_proxied_kubeconfig(kube.kubeconfig, p, tmp_path / f"kubeconfig-{i}"),
                                    tmp_path / f"replica-{i}.log", [namespace], extra_args=args,
                                    extra_env={"POD_NAME": f"replica-{i}"})
                    for i, p in enumerate(self.proxies)]
        self.restarts = [0, 0]
        self.leading: list[tuple[float, int]] = []  # (time, replicas claiming to lead)
        self.phases: dict[str, list[tuple[str, str]]] = {}  # job -> [(uid, phase)] as they changed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Replicas":
        for op in self.ops:
            op.start(timeout=120)
        for target in (self._supervise, self._sample):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        for op in self.ops:
            op.stop()
        for p in self.proxies:
            p.close()

    def _supervise(self) -> None:
        while not self._stop.wait(1):
            for i, op in enumerate(self.ops):
                if op.proc is not None and op.proc.poll() is not None and not self._stop.is_set():
                    self.restarts[i] += 1
                    try:
                        op.start(timeout=120)
                    except AssertionError:
                        pass  # tried again in a second

    def _leader_claims(self) -> int:
        claims = 0
        for op in self.ops:
            try:
                claims += any(line.startswith("tputorch_leader ") and float(line.split()[1]) == 1
                              for line in op.metrics().splitlines())
            except OSError:
                pass
        return claims

    def _sample(self) -> None:
        while not self._stop.wait(1):
            self.leading.append((time.time(), self._leader_claims()))
            try:
                items = jobs(self.kube, self.namespace)
            except Exception:  # the API server restarting
                continue
            for job in items:
                name, uid = job["metadata"]["name"], job["metadata"]["uid"]
                phase = (job.get("status") or {}).get("phase") or ""
                seen = self.phases.setdefault(name, [])
                if not seen or seen[-1] != (uid, phase):
                    seen.append((uid, phase))

    # --- what must hold ---------------------------------------------------------------------------

    def check(self) -> str:
        windows = writers_per_second(self.proxies)
        both = sorted(w for w, who in windows.items() if len(who) > 1)
        assert not both, f"two replicas wrote in the same second at {both[:5]} (epoch seconds)"
        went_back = {name: seen for name, seen in self.phases.items()
                     if any(a[0] == b[0] and a[1] in TERMINAL and b[1] not in TERMINAL
                            for a, b in zip(seen, seen[1:]))}
        assert not went_back, f"terminal phases went back: {dict(list(went_back.items())[:3])}"
        longest, run = 0, 0
        for _, claims in self.leading:
            run = run + 1 if claims > 1 else 0
            longest = max(longest, run)
        assert longest < LEASE_DURATION, f"both replicas claimed to lead for {longest}s in a row"
        writes = {p.name: sum("/leases/" not in w.path for w in p.writes) for p in self.proxies}
        return (f"writes by replica {writes}, seconds with writes {len(windows)}, restarts {self.restarts}, "
                f"both claiming to lead at most {longest}s in a row")

    def leader_index(self) -> int:
        from kubernetes import client

        def holder():
            lease = client.CoordinationV1Api(self.kube.api_client).read_namespaced_lease(
                f"tputorch-{self.namespace}", self.namespace)
            return lease.spec.holder_identity or None
        who = self.kube.wait(holder, 60, "a leader")
        return next(i for i, op in enumerate(self.ops) if who.startswith(op.extra_env["POD_NAME"] + "_"))


@pytest.fixture
def replicas(kube, namespace, tputorch_crd, tmp_path):
    r = Replicas(kube, namespace, tmp_path)
    try:
        yield r.start()
    finally:
        r.stop()


def _finished_jobs(kube, dashboard, namespace: str, names: list[str]) -> None:
    """Jobs run to Succeeded (the stand-in dashboard reports it), for the 'terminal phases never
    go back' check through what follows."""
    for name in names:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                    job_body(name, topo="2x2"))
    for name in names:
        kube.wait(lambda: (jobs_by_name(kube, namespace).get(name, {}).get("status") or {}).get("phase") == "Running"
                  or None, 180, f"{name} Running")
        dashboard.set_job_status(namespace, name, "SUCCEEDED")
    _wait_terminal(kube, namespace, names, 180)


def jobs_by_name(kube, namespace: str) -> dict:
    return {j["metadata"]["name"]: j for j in jobs(kube, namespace)}


def _wait_terminal(kube, namespace: str, names: list[str], timeout: float) -> None:
    kube.wait(lambda: all((j.get("status") or {}).get("phase") in TERMINAL
                          for j in jobs(kube, namespace) if j["metadata"]["name"] in names) or None,
              timeout, f"{names} finished")


def test_the_leader_blackholed_for_60s_is_replaced_and_never_writes_after(kube, dashboard, namespace, replicas):
    first = [f"before-{i:02d}" for i in range(20)]
    create_jobs(kube, namespace, first)
    _finished_jobs(kube, dashboard, namespace, ["done-a"])
    wait_consistent(kube, namespace, set(first) | {"done-a"}, 240)
    old = replicas.leader_index()
    standby = replicas.ops[1 - old]
    kube.wait(lambda: "is a candidate" in standby.log(), 120, "the standby synced and standing")
    proxy = replicas.proxies[old]
    blackhole = threading.Thread(target=proxy.episode, args=("blackhole", 60), daemon=True)
    blackhole.start()
    # The cut is when the proxy switched, not when the test asked for it: a write let through just
    # before the switch is not a write after the cut.
    kube.wait(lambda: proxy.mode == "blackhole", 30, "the blackhole in effect", interval=0.05)
    cut = proxy.since
    during = [f"during-{i:02d}" for i in range(20)]
    create_jobs(kube, namespace, during)
    # The lease runs out 15 s after the last renewal the standby saw; the rest is the standby's retry
    # period and, on a loaded machine, its scheduling (the full suite missed a 40 s bound once).
    # [index]: replica 0 taking over must count, and 0 alone is falsy to kube.wait
    (new,) = kube.wait(lambda: (lambda i: [i] if i != old else None)(replicas.leader_index()), 120,
                       "the standby leading")
    took = time.time() - cut
    blackhole.join()
    wait_consistent(kube, namespace, set(first) | set(during) | {"done-a"}, 240)
    after_cut = [w.at for w in proxy.writes if w.at > cut and "/leases/" not in w.path]
    assert not after_cut, f"the blackholed leader wrote {len(after_cut)} times after it was cut off"
    print(f"standby {new} led {took:.1f}s after the leader was blackholed; {replicas.check()}")


def test_an_api_server_restart_under_two_replicas(kube, namespace, replicas):
    _require_local_cluster(kube)
    before = [f"before-{i:02d}" for i in range(20)]
    create_jobs(kube, namespace, before)
    wait_consistent(kube, namespace, set(before), 240)
    _kill_component("kube-apiserver")
    _cluster_up()
    after = [f"after-{i:02d}" for i in range(20)]
    create_jobs(kube, namespace, after)
    wait_consistent(kube, namespace, set(before) | set(after), 300)
    print(replicas.check())


def test_random_refuse_reset_blackhole_episodes_during_a_burst_and_reruns(kube, dashboard, namespace, replicas):
    seed = int(os.environ.get("TPUTORCH_FAULT_SEED", time.time()))
    rng = random.Random(seed)
    names = [f"burst-{i:03d}" for i in range(BURST)]
    creator = threading.Thread(target=create_jobs, args=(kube, namespace, names), daemon=True)
    _finished_jobs(kube, dashboard, namespace, ["done-b"])
    creator.start()
    end = time.monotonic() + EPISODES_SECONDS
    episodes, reruns = [], 0
    while time.monotonic() < end:
        time.sleep(rng.uniform(1, 6))
        proxy = rng.choice(replicas.proxies)
        mode, seconds = rng.choice(["refuse", "reset", "blackhole"]), rng.uniform(2, 20)
        episodes.append((proxy.name, mode, round(seconds, 1)))
        proxy.episode(mode, min(seconds, max(0.5, end - time.monotonic())))
        if not creator.is_alive() and rng.random() < 0.5:  # a rerun: the same name, a new object
            name = rng.choice(names)
            try:
                kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                kube.wait(lambda: name not in {j["metadata"]["name"] for j in jobs(kube, namespace)}, 60,
                          f"{name} deleted")
                create_jobs(kube, namespace, [name])
                reruns += 1
            except Exception:
                pass  # an episode on the test's own connection cannot happen: it is not proxied
    creator.join(300)
    assert not creator.is_alive(), "the burst did not finish"
    wait_consistent(kube, namespace, set(names) | {"done-b"}, 300)
    print(f"seed={seed} {len(episodes)} episodes in {EPISODES_SECONDS:.0f}s, {reruns} reruns; {replicas.check()}")
