"""The attempt reaches the script: TPUTORCH_ATTEMPT (and, from attempt 2 on, when its RayJob was
created) on every Ray container, tputorch.train.attempt(), and the rule that a checkpoint an earlier
attempt wrote after this one started is never the one resumed from (train.stale, newest_fresh)."""

import pytest

from tputorch import render, train
from tputorch.api import spec
from tputorch.render.env import started_of

from ..jobs import body

STARTED = "2026-12-01T10:00:00Z"
T0 = 1796119200.0  # STARTED in UNIX seconds


def containers(rayjob):
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for t in templates for c in t["spec"]["containers"]]


def test_every_ray_container_gets_the_attempt_and_from_attempt_two_its_start():
    job = spec.parse(body())
    first = render.rayjob(job)
    assert all({"name": train.ENV_ATTEMPT, "value": "1"} in c["env"] for c in containers(first))
    assert started_of(first) is None
    third = render.rayjob(job, 3, STARTED)
    for c in containers(third):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert (env[train.ENV_ATTEMPT], env[train.ENV_ATTEMPT_STARTED]) == ("3", STARTED)
    assert started_of(third) == STARTED


def test_train_attempt_reads_the_environment():
    assert train.attempt({train.ENV_ATTEMPT: "4"}) == 4
    assert train.attempt({}) == 1 and train.attempt({train.ENV_ATTEMPT: "x"}) == 1


def test_the_start_in_unix_seconds_is_what_the_stamps_compare_with():
    from tputorch import timestamps
    assert timestamps.parse(STARTED).timestamp() == T0


ENV = {train.ENV_ATTEMPT: "3", train.ENV_ATTEMPT_STARTED: STARTED}


@pytest.mark.parametrize("stamp, is_stale", [
    ({train.STAMP_ATTEMPT: 2, train.STAMP_WRITTEN: T0 + 5}, True),  # attempt 2, after attempt 3 started
    ({train.STAMP_ATTEMPT: 2, train.STAMP_WRITTEN: T0 - 5}, False),  # attempt 2 shutting down: resumed from
    ({train.STAMP_ATTEMPT: 3, train.STAMP_WRITTEN: T0 + 5}, False),  # this attempt's own
    ({}, False),  # not stamped (not reported through tputorch.train.report): cannot be told
])
def test_a_checkpoint_an_earlier_attempt_wrote_after_this_one_started_is_stale(stamp, is_stale):
    assert train.stale(stamp, ENV) is is_stale


def test_without_a_start_nothing_is_stale():
    """Attempt 1 (no earlier attempt of this object: its run name is its own)."""
    assert not train.stale({train.STAMP_ATTEMPT: 0, train.STAMP_WRITTEN: T0 + 5}, {train.ENV_ATTEMPT: "1"})


def test_the_newest_checkpoint_not_stale_is_resumed_from():
    late = ("late", {train.STAMP_ATTEMPT: 2, train.STAMP_WRITTEN: T0 + 5})
    last = ("last", {train.STAMP_ATTEMPT: 2, train.STAMP_WRITTEN: T0 - 5})
    assert train.newest_fresh([late, last], ENV) == "last"
    with pytest.raises(train.StaleCheckpoint, match="attempt 3 started"):
        train.newest_fresh([late], ENV)


def test_the_stamp_names_the_attempt_and_the_time():
    assert train.checkpoint_stamp({train.ENV_ATTEMPT: "2"}, now=T0) == {train.STAMP_ATTEMPT: 2, train.STAMP_WRITTEN: T0}
