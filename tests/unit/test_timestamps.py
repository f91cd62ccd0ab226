"""tputorch.timestamps: the one reader of the API server's RFC 3339 times, on the shapes Kubernetes
and KubeRay write, and what each caller makes of a time it cannot read."""

import datetime as dt

import pytest

from tputorch import render, timestamps
from tputorch.render.names import INITIALIZING_TIMEOUT_ANNOTATION
from tputorch.render.service import admitted_timeout_patch
from tputorch.api import spec
from tputorch.cli import manage
from tputorch.cli.doctor.cluster import check_lease
from tputorch.cli.doctor.result import FAIL, OK
from tputorch.status import applied, attempts, kueue

from .services import service_body

UTC = dt.timezone.utc
T = dt.datetime(2026, 12, 7, 2, 24, 17, tzinfo=UTC)


@pytest.mark.parametrize("text, want", [
    ("2026-12-07T02:24:17Z", T),  # metav1.Time: creationTimestamp, lastTransitionTime, KubeRay's times
    ("2026-12-07T02:24:17.123456Z", T.replace(microsecond=123456)),  # metav1.MicroTime: renewTime, eventTime
    ("2026-12-07T02:24:17+00:00", T),  # the kubernetes client's datetimes through isoformat()
    ("2026-12-07T02:24:17.123456+00:00", T.replace(microsecond=123456)),
    ("2026-12-07T03:24:17+01:00", T),  # any other offset names the same instant
    ("2026-12-07T02:24:17.4Z", T.replace(microsecond=400000)),  # Go's RFC3339Nano drops trailing zeros
    ("2026-12-07T02:24:17.123456789Z", T.replace(microsecond=123456)),  # nanoseconds: to the microsecond
    ("2026-12-07T02:24:17", T),  # no offset: UTC (Kubernetes writes none; the doctor read it so)
])
def test_parse_reads_the_shapes_the_api_server_writes(text, want):
    got = timestamps.parse(text)
    assert got == want and got.tzinfo is not None
    assert timestamps.seconds(text) == want.timestamp()


@pytest.mark.parametrize("value", [None, "", "garbage", "2026-13-01T00:00:00Z", "Z", 1733538257, ["2026-12-07T02:24:17Z"]])
def test_absent_or_unparseable_is_none(value):
    assert timestamps.parse(value) is None
    assert timestamps.seconds(value) is None


def test_a_datetime_is_taken_as_it_is():
    """What PyYAML makes of an unquoted timestamp; a naive one is UTC, as a string without offset."""
    assert timestamps.parse(T) is T
    assert timestamps.parse(T.replace(tzinfo=None)) == T


def test_each_caller_treats_an_unreadable_time_as_unknown():
    now = dt.datetime(2026, 12, 7, 2, 25, 17, tzinfo=UTC)
    # tputorch get/describe: the age column shows "?"
    assert manage.age("garbage", now) == "?" and manage.age("2026-12-07T02:24:17Z", now) == "1m"
    # tputorch doctor: a Lease renewed at an unknown time is held by no one
    lease = {"metadata": {"name": "tputorch-operator", "namespace": "tputorch-system"},
             "spec": {"holderIdentity": "op-0_ab12cd34", "renewTime": "garbage", "leaseDurationSeconds": 15}}
    assert check_lease(lease, now).status == FAIL
    lease["spec"]["renewTime"] = "2026-12-07T02:25:10.123456Z"
    assert check_lease(lease, now).status == OK
    # a pod deleted at an unknown time (or a job ended at one) cannot be told apart from a lost one
    pod = {"metadata": {"name": "demo-tpu-0", "deletionTimestamp": "garbage"}}
    assert not attempts.deleted_after(pod, "2026-12-07T02:24:17Z")
    assert not attempts.deleted_after({"metadata": {"deletionTimestamp": "2026-12-07T02:24:17Z"}}, "garbage")
    assert attempts.deleted_after({"metadata": {"deletionTimestamp": "2026-12-07T02:24:17Z"}}, "2026-12-07T02:24:17Z")
    # a Serve reload whose KubeRay write time is unknown: looked at again after the quiet period
    waiting = {"conditions": [{"type": "SpecApplied", "reason": applied.WAITING_FOR_SERVE_RELOAD}]}
    assert applied.recheck_in(waiting, "2026-12-07T02:24:17Z", {"status": {"lastUpdateTime": "garbage"}}) == applied.RELOAD_QUIET_S
    # a queued service admitted at an unknown time: its timeout is left as it is; an unknown
    # start of initializing counts no wait
    svc = spec.parse_service(service_body(queueName="tpu", serve={"initializingTimeoutSeconds": 30}))
    created = render.rayservice(svc)
    created["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "Initializing",
                                         "lastTransitionTime": "garbage"}]}
    assert admitted_timeout_patch(svc, created, kueue.Admission(True, "Admitted", "", None, "tpu", "w", "garbage")) is None
    assert admitted_timeout_patch(svc, created, kueue.Admission(True, "Admitted", "", None, "tpu", "w", "2026-12-07T02:24:17Z")) == {
        "metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: "30s"}}}
