"""Issue 16: a restart touches no status that is right, at a size where a restart once rewrote most
of them. Jobs in several phases are made through the API with no operator running
(population.py: each job, its RayJob owned by the job's uid, the RayJob's status as KubeRay would
write it, frozen by spec.managedBy). A first operator writes each job's status once; a second one,
started after the first has stopped, must reconcile every job and write nothing: no status patch,
no RayJob create, no event, no object's resourceVersion moved."""

from __future__ import annotations

import os
import re
import time

from operator_process import OperatorProcess, tputorch_crd  # noqa: F401 (fixture)
from population import RAY, plan, populate
from test_operator_e2e import GROUP, PLURAL, VERSION

# Several phases, each with a status of its own. 500 jobs keep the test within ~2 minutes on a
# 2-core machine (making a job costs 3 API calls, its first status a patch and ~2 events, and the
# namespace's deletion waits for all of it; times in bench/RESULTS.md); TPUTORCH_RESTART_TEST_JOBS=2000
# runs it at the size of issue 16.
JOBS = int(os.environ.get("TPUTORCH_RESTART_TEST_JOBS", "500"))
SHARES = {"Succeeded": 0.4, "Failed": 0.1, "Running": 0.2, "Suspended": 0.15}
COUNTS = {phase: int(JOBS * share) for phase, share in SHARES.items()}
COUNTS["Pending"] = JOBS - sum(COUNTS.values())


def samples(op: OperatorProcess) -> dict[str, float]:
    out = {}
    for line in op.metrics().splitlines():
        m = re.match(r"^(tputorch_[a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def reconciles(s: dict[str, float]) -> float:
    return sum(v for k, v in s.items() if k.startswith("tputorch_reconciles_total{"))


def patches(s: dict[str, float]) -> float:
    """Status patches of every kind (0 before the first: a labelled counter has no series until then)."""
    return sum(v for k, v in s.items() if k.startswith("tputorch_status_patches_total{"))


def settled(op: OperatorProcess, kube, at_least: int, quiet: float = 3.0, timeout: float = 300) -> dict[str, float]:
    """/metrics once every job was reconciled, the queue is empty and no status patch came for
    ``quiet`` seconds."""
    state = {"patches": None, "since": time.monotonic()}

    def done():
        s = samples(op)
        if patches(s) != state["patches"]:
            state["patches"], state["since"] = patches(s), time.monotonic()
            return None
        ok = reconciles(s) >= at_least and s.get("tputorch_queue_depth") == 0
        return s if ok and time.monotonic() - state["since"] >= quiet else None

    return kube.wait(done, timeout, f"{at_least} jobs reconciled and no status patch for {quiet}s", interval=0.5)


def versions(kube, ns: str) -> dict[str, str]:
    out = {}
    for (g, v, p), tag in (((GROUP, VERSION, PLURAL), "job"), (RAY, "rayjob")):
        for item in kube.custom.list_namespaced_custom_object(g, v, ns, p)["items"]:
            out[f"{tag}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def events(kube, ns: str) -> int:
    from kubernetes import client

    return len(client.EventsV1Api(kube.api_client).list_namespaced_event(ns).items)


def test_a_restart_writes_no_status_that_is_right(kube, tputorch_crd, namespace, tmp_path):  # noqa: F811
    populate(kube.custom, namespace, COUNTS)
    expected = dict(plan(COUNTS))

    first = OperatorProcess(kube.kubeconfig, tmp_path / "first.log", [namespace]).start(timeout=120)
    try:
        s = settled(first, kube, JOBS)
        jobs = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
        wrong = {n: (phases.get(n), p) for n, p in expected.items() if phases.get(n) != p}
        assert not wrong, f"{len(wrong)} jobs in the wrong phase (got, want), e.g. {list(wrong.items())[:5]}"
        # One status write per job: each status was empty and one patch makes it right.
        assert patches(s) == JOBS, s
        assert s.get('tputorch_reconciles_total{kind="TPUTorchJob",result="created"}', 0) == 0, s
    finally:
        first.stop()
    assert "Traceback" not in first.log(), first.log()[-3000:]

    before, events_before = versions(kube, namespace), events(kube, namespace)
    second = OperatorProcess(kube.kubeconfig, tmp_path / "second.log", [namespace]).start(timeout=120)
    try:
        s = settled(second, kube, JOBS)
        time.sleep(2)  # anything still on its way (an event posted after its status write) lands
        s = samples(second)
    finally:
        second.stop()
    assert "Traceback" not in second.log(), second.log()[-3000:]
    assert reconciles(s) >= JOBS, s
    assert patches(s) == 0, s
    assert s.get('tputorch_reconciles_total{kind="TPUTorchJob",result="created"}', 0) == 0, s
    after = versions(kube, namespace)
    moved = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    assert not moved and len(after) == 2 * JOBS, f"{len(moved)} objects changed, e.g. {list(moved.items())[:5]}"
    assert events(kube, namespace) == events_before
