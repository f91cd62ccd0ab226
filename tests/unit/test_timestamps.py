"""tputorch.timestamps: the one reader of the API server's RFC 3339 times, on the shapes Kubernetes
and KubeRay write."""

import datetime as dt

import pytest

from tputorch import timestamps

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

