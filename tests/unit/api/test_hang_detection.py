"""spec.hangDetection: off without the block, its defaults, every bad value named with what is
allowed, and the environment train.py's watchdog reads (only for a job with the block)."""

import json

import pytest

from tputorch import render, watchdog
from tputorch.api import spec
from tputorch.api.job import HangDetection

from ..jobs import body


def errors_of(obj):
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse(obj)
    return [(e.path, e.value, e.message) for e in err.value.errors]


def env_of(job):
    head = render.rayjob(job)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in head["env"]}


def test_off_by_default_and_nothing_rendered():
    job = spec.parse(body())
    assert job.hang_detection is None
    assert watchdog.ENV_HANG_DETECTION not in env_of(job)
    assert watchdog.hang_settings(env_of(job)) is None


def test_an_empty_block_turns_it_on_with_the_defaults():
    job = spec.parse(body(hangDetection={}))
    assert job.hang_detection == HangDetection(timeout_s=600, first_step_timeout_s=1800, step_time_multiple=10)


def test_a_long_step_timeout_lengthens_the_unset_first_step_floor():
    job = spec.parse(body(hangDetection={"timeoutSeconds": 7200}))
    assert job.hang_detection.first_step_timeout_s == 7200


def test_the_watchdog_reads_what_was_rendered_on_every_ray_container():
    job = spec.parse(body(hangDetection={"timeoutSeconds": 120, "firstStepTimeoutSeconds": 900, "stepTimeMultiple": 4}))
    env = env_of(job)
    assert json.loads(env[watchdog.ENV_HANG_DETECTION]) == {"timeoutSeconds": 120, "firstStepTimeoutSeconds": 900,
                                                         "stepTimeMultiple": 4}
    assert watchdog.hang_settings(env) == watchdog.HangSettings(120.0, 900.0, 4.0)
    workers = render.rayjob(job)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert {"name": watchdog.ENV_HANG_DETECTION, "value": env[watchdog.ENV_HANG_DETECTION]} in workers["env"]


@pytest.mark.parametrize("block,path,value,fragment", [
    ({"timeoutSeconds": 30}, "spec.hangDetection.timeoutSeconds", 30, "between 60 and 604800"),
    ({"timeoutSeconds": "600"}, "spec.hangDetection.timeoutSeconds", "600", "must be an integer"),
    ({"firstStepTimeoutSeconds": 59}, "spec.hangDetection.firstStepTimeoutSeconds", 59, "between 60 and 604800"),
    ({"stepTimeMultiple": -1}, "spec.hangDetection.stepTimeMultiple", -1, "between 0 and 1000"),
    ({"stepTimeMultiple": True}, "spec.hangDetection.stepTimeMultiple", True, "must be an integer"),
    ({"timeoutSeconds": 900, "firstStepTimeoutSeconds": 600}, "spec.hangDetection.firstStepTimeoutSeconds", 600,
     "must be at least spec.hangDetection.timeoutSeconds (900)"),
    ({"interval": 5}, "spec.hangDetection.interval", None, "is not a known field"),
    ({"retries": 2}, "spec.hangDetection.retries", None, "is not a known field"),
])
def test_bad_values_are_named_with_what_is_allowed(block, path, value, fragment):
    found = errors_of(body(hangDetection=block))
    assert any(p == path and (value is None or v == value) and fragment in m for p, v, m in found), found


def test_not_an_object():
    assert ("spec.hangDetection", 600, "must be an object") in errors_of(body(hangDetection=600))


def test_the_hang_retries_are_their_own_budget():
    assert spec.parse(body(retries={"hang": 3})).retries == {"infrastructure": 10, "application": 0, "hang": 3}
    assert any(p == "spec.retries.hang" and "between 0 and 1000" in m for p, _, m in errors_of(body(retries={"hang": -1})))
