"""The timestamps the API server hands us, read in one place.

Kubernetes writes RFC 3339 in UTC: metav1.Time at second precision ("2026-12-07T02:00:00Z": a
condition's lastTransitionTime, creationTimestamp, KubeRay's status times), metav1.MicroTime with
six fractional digits (a Lease's renewTime, an Event's eventTime). The kubernetes client's own
datetimes come back through ``isoformat()`` with a "+00:00" offset. All of them, and any other
offset, parse here; so does an offset-less time, taken as UTC (Kubernetes writes none, but the
doctor has always read one so).

Absent or unparseable gives None: each caller says what an unknown time means to it. A module of
its own, outside status/ and render/, because both (and the CLI) read timestamps and status/
imports render.
"""

from __future__ import annotations

import datetime


def parse(value: object) -> datetime.datetime | None:
    """The instant ``value`` (an RFC 3339 string, or a datetime already: what PyYAML makes of an
    unquoted timestamp) names, timezone-aware; None when it is absent or not a timestamp."""
    if isinstance(value, datetime.datetime):
        when = value
    elif isinstance(value, str) and value:
        try:
            when = datetime.datetime.fromisoformat(value)  # Python 3.11+: "Z", any fraction's length
        except ValueError:
            return None
    else:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)


def seconds(value: object) -> float | None:
    """``parse(value)`` as seconds since the epoch, or None."""
    when = parse(value)
    return None if when is None else when.timestamp()
