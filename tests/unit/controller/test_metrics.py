"""/metrics through prometheus_client: every phase of each gauge (0 included), the kind label, the
work queue's and the API calls' counters, values read at scrape time."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tputorch.api.phases import SERVICE_PHASES
from tputorch.api.status_schema import GOODPUT_PARTS
from tputorch.controller.metrics import Metrics
from tputorch.controller.workqueue import WorkQueue

from ..fakekube import controller
from ..jobs import body


def samples(metrics: Metrics) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.exposition()) for s in family.samples}


def test_every_phase_of_each_kind_is_a_series_zero_included():
    ctl = controller()
    job = body()
    job["status"] = {"phase": "Running"}
    ctl.parents["TPUTorchJob"].remember(job)
    m = Metrics()
    m.sources.phases = ctl.phases
    got = samples(m)
    jobs = {dict(k[1])["phase"]: v for k, v in got.items() if k[0] == "tputorch_jobs"}
    assert jobs == {"Pending": 0, "Queued": 0, "Preempted": 0, "Running": 1, "Retrying": 0, "Succeeded": 0,
                    "Failed": 0, "Suspended": 0}  # Queued/Preempted/Retrying were missing until 0.3.0
    services = {dict(k[1])["phase"]: v for k, v in got.items() if k[0] == "tputorch_services"}
    assert set(services) == set(SERVICE_PHASES) and not any(services.values())


def test_reconciles_carry_the_kind_and_the_queue_counts_adds_retries_and_waits():
    m = Metrics()
    m.reconciled("created", 0.2, "TPUTorchJob")
    m.reconciled("created", 0.3, "TPUTorchService")

    async def queue_work():
        q = WorkQueue(metrics=m)
        q.add("a")
        q.add("a")  # coalesced: not an add
        await q.get()
        q.retry("a")
    asyncio.run(queue_work())
    got = samples(m)
    assert got[("tputorch_reconciles_total", (("kind", "TPUTorchJob"), ("result", "created")))] == 1
    assert got[("tputorch_reconciles_total", (("kind", "TPUTorchService"), ("result", "created")))] == 1
    assert got[("tputorch_reconcile_duration_seconds_count", (("kind", "TPUTorchJob"),))] == 1
    assert got[("tputorch_workqueue_adds_total", ())] == 1
    assert got[("tputorch_workqueue_retries_total", ())] == 1
    assert got[("tputorch_workqueue_queue_duration_seconds_count", ())] == 1


def test_api_calls_by_verb_and_code_timed_by_verb_and_resource_and_scrape_time_values():
    import pytest
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tputorch.controller import kube as kube_module
    from tputorch.controller.kind import RAYJOB, TPUTORCHJOB

    m = Metrics()
    kube = kube_module.Kube(client.Configuration(), 1, 1)

    class Answer:
        def drain_conn(self): ...
        def release_conn(self): ...

    class Custom:
        def create_namespaced_custom_object(self, *args, _request_timeout=None):
            raise ApiException(status=409, reason="Conflict")

        def get_namespaced_custom_object(self, *args, _request_timeout=None):
            return {}

        def patch_namespaced_custom_object_status(self, *args, _preload_content=True, _request_timeout=None,
                                                  _content_type=None):
            return Answer()
    kube.custom = Custom()
    real = kube_module.METRICS
    kube_module.METRICS = m
    try:
        with pytest.raises(ApiException):
            asyncio.run(kube.create(RAYJOB, "ml", {"metadata": {"name": "a"}}))
        for _ in range(2):
            asyncio.run(kube.get(RAYJOB, "ml", "a"))
        asyncio.run(kube.patch_status(TPUTORCHJOB, "ml", "a", {"phase": "Running"}, uid="u"))
    finally:
        kube_module.METRICS = real
    m.sources.informers = lambda: {"rayjobs": (3, 7)}
    m.sources.leader_transitions = lambda: 2
    got = samples(m)
    assert got[("tputorch_api_requests_total", (("code", "409"), ("verb", "create")))] == 1
    assert got[("tputorch_api_requests_total", (("code", "2xx"), ("verb", "get")))] == 2
    # timed whether answered or not, by verb and resource
    assert got[("tputorch_api_request_duration_seconds_count", (("resource", "rayjobs"), ("verb", "create")))] == 1
    assert got[("tputorch_api_request_duration_seconds_count", (("resource", "rayjobs"), ("verb", "get")))] == 2
    assert got[("tputorch_api_request_duration_seconds_count",
                (("resource", "tputorchjobs"), ("verb", "patch_status")))] == 1
    assert got[("tputorch_informer_relists_total", (("resource", "rayjobs"),))] == 3
    assert got[("tputorch_informer_watch_restarts_total", (("resource", "rayjobs"),))] == 7
    assert got[("tputorch_leader_transitions_total", ())] == 2
    assert got[("tputorch_queue_depth", ())] == 0 and got[("tputorch_leader", ())] == 1


def test_status_patches_and_validation_failures_carry_the_kind():
    from tputorch.controller import metrics as metrics_module, reconcile, writes

    from ..services import service_body

    m = Metrics()
    real = metrics_module.METRICS
    reconcile.METRICS = writes.METRICS = m
    try:
        ctl = controller(status_interval=0)
        bad = body()
        bad["spec"]["tpu"]["topology"] = "3x3"
        bad["metadata"]["name"] = "bad"
        ctl.parents["TPUTorchJob"].remember(bad)
        ctl.parents["TPUTorchService"].remember(service_body())
        asyncio.run(ctl.reconcile(("TPUTorchJob", "ml", "bad")))
        asyncio.run(ctl.reconcile(("TPUTorchService", "ml", service_body()["metadata"]["name"])))
    finally:
        reconcile.METRICS = writes.METRICS = real
    got = samples(m)
    assert got[("tputorch_validation_failures_total", (("kind", "TPUTorchJob"),))] == 1
    assert got[("tputorch_status_patches_total", (("kind", "TPUTorchJob"),))] == 1
    assert got[("tputorch_status_patches_total", (("kind", "TPUTorchService"),))] == 1


def test_the_goodput_ledger_is_summed_per_namespace_and_queue_never_per_job():
    ctl = controller()
    parts = dict.fromkeys(GOODPUT_PARTS, 0.0)
    for name, namespace, queue, productive, wall in (("a", "team-a", "tpu", 60.0, 100.0), ("b", "team-a", "tpu", 30.5, 50.0),
                                                     ("c", "team-a", None, 10.0, 40.0), ("d", "team-b", "tpu", 0.0, 7.0)):
        job = body(name=name)
        job["metadata"]["namespace"] = namespace
        if queue:
            job["spec"]["queueName"] = queue
        job["status"] = {"phase": "Running", "goodput": {
            "wallClockSeconds": wall, "seconds": {**parts, "productive": productive, "unaccounted": wall - productive}}}
        ctl.parents["TPUTorchJob"].remember(job)
    ctl.parents["TPUTorchJob"].remember(body(name="no-status-yet"))
    m = Metrics()
    m.sources.goodput = ctl.goodput
    got = samples(m)
    productive = {(dict(k[1])["job_namespace"], dict(k[1])["queue"]): v for k, v in got.items()
                  if k[0] == "tputorch_goodput_seconds" and dict(k[1])["part"] == "productive"}
    assert productive == {("team-a", "tpu"): 90.5, ("team-a", ""): 10.0, ("team-b", "tpu"): 0.0}
    wall = {(dict(k[1])["job_namespace"], dict(k[1])["queue"]): v for k, v in got.items()
            if k[0] == "tputorch_goodput_wall_clock_seconds"}
    assert wall == {("team-a", "tpu"): 150.0, ("team-a", ""): 40.0, ("team-b", "tpu"): 7.0}
    # every part a series, 0 included; no label names a job
    assert {dict(k[1])["part"] for k in got if k[0] == "tputorch_goodput_seconds"} == set(GOODPUT_PARTS)
    assert all(set(dict(k[1])) <= {"job_namespace", "queue", "part"} for k in got if k[0].startswith("tputorch_goodput"))
