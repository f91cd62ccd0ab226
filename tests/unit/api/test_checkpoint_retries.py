"""spec.checkpoint and spec.retries: defaults, every bad value named, and what the script gets:
a run name stable across attempts of one object (its uid) and the storage path, in the environment
that tputorch.train.run_config() reads."""

import pytest

from tputorch import render, train
from tputorch.api import spec

from ..jobs import body


def errors_of(obj):
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse(obj)
    return [(e.path, e.message) for e in err.value.errors]


def head_env(job):
    head = render.rayjob(job)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in head["env"]}


def test_defaults_retry_the_infrastructure_ten_times_the_application_never_and_a_hang_once():
    job = spec.parse(body())
    assert job.retries == {"infrastructure": 10, "application": 0, "hang": 1}
    assert job.storage_path is None and job.worker_retries == 1


def test_the_run_name_follows_the_objects_uid_not_its_name_alone():
    first = body(checkpoint={"storagePath": "gs://ckpt/runs"})
    again = body(checkpoint={"storagePath": "gs://ckpt/runs"})
    again["metadata"]["uid"] = "7f000000-aaaa-bbbb-cccc-000000000000"  # a new object, same name
    env1, env2 = head_env(spec.parse(first)), head_env(spec.parse(again))
    assert env1[train.ENV_RUN_NAME] == "demo-0b6c1f4e" and env2[train.ENV_RUN_NAME] == "demo-7f000000"
    assert env1[train.ENV_STORAGE_PATH] == "gs://ckpt/runs" and env1[train.ENV_WORKER_RETRIES] == "1"
    # The same object parsed again (a retry, a re-admission, an operator restart): the same run.
    assert head_env(spec.parse(first)) == env1
    assert train.ENV_STORAGE_PATH not in head_env(spec.parse(body()))


@pytest.mark.parametrize("overrides,path,fragment", [
    ({"checkpoint": {}}, "spec.checkpoint.storagePath", "is required"),
    ({"checkpoint": {"storagePath": "relative/dir"}}, "spec.checkpoint.storagePath", "absolute path"),
    ({"checkpoint": {"storagePath": "gs://b/x", "keep": 2}}, "spec.checkpoint.keep", "is not a known field"),
    ({"checkpoint": {"storagePath": "gs://b/x", "workerRetries": -2}}, "spec.checkpoint.workerRetries", "between -1 and 1000"),
    ({"retries": {"infrastructure": -1}}, "spec.retries.infrastructure", "between 0 and 1000"),
    ({"retries": {"application": "1"}}, "spec.retries.application", "must be an integer"),
    ({"retries": {"preemption": 1}}, "spec.retries.preemption", "is not a known field"),
])
def test_bad_values_are_named(overrides, path, fragment):
    found = errors_of(body(**overrides))
    assert any(p == path and fragment in m for p, m in found), found


def test_run_config_is_built_from_that_environment():
    pytest.importorskip("ray.train")
    env = {train.ENV_RUN_NAME: "demo-0b6c1f4e", train.ENV_STORAGE_PATH: "/mnt/ckpt", train.ENV_WORKER_RETRIES: "3"}
    config = train.run_config(env)
    assert (config.name, config.storage_path, config.failure_config.max_failures) == ("demo-0b6c1f4e", "/mnt/ckpt", 3)
    assert train.run_config(env, name="other").name == "other"
    with pytest.raises(train.MissingSliceEnvironment, match="TPUTORCH_WORKER_RETRIES"):
        train.run_config({train.ENV_WORKER_RETRIES: "many"})


def test_run_config_passes_ray_2_60s_preemption_options_beside_the_worker_retries():
    pytest.importorskip("ray.train")
    env = {train.ENV_WORKER_RETRIES: "2"}
    failure = train.run_config(env, max_preemption_failures=5, relax_collectives_on_preemption=True,
                               preemption_grace_s=30.0).failure_config
    assert (failure.max_failures, failure.max_preemption_failures, failure.relax_collectives_on_preemption,
            failure.preemption_grace_s) == (2, 5, True, 30.0)
    # Not given: Ray's own defaults stay (unlimited preemption retries, strict collectives, no grace).
    default = train.run_config(env).failure_config
    assert (default.max_preemption_failures, default.relax_collectives_on_preemption, default.preemption_grace_s) == \
        (-1, False, 0.0)
    assert train.run_config({}, preemption_grace_s=10).failure_config.max_failures == 0


class _Context:
    def __init__(self, rank):
        self.rank = rank

    def get_world_rank(self):
        return self.rank


def test_preemption_is_ray_2_60s_preemption_info_as_a_training_loop_acts_on_it(monkeypatch):
    """tputorch.train.preemption() over Ray's own get_preemption_info() and PreemptionInfo (patched
    by name: a Ray without them fails here): None until Ray sees one; then the time left to the
    earliest deadline, the nodes and ranks in order, and whether the calling worker is among them."""
    ray_train = pytest.importorskip("ray.train")
    seen: list = []
    monkeypatch.setattr(ray_train, "get_preemption_info", lambda: seen[-1])
    monkeypatch.setattr(ray_train, "get_context", lambda: _Context(3))
    seen.append(None)
    assert train.preemption(now=1000.0) is None
    seen.append(ray_train.PreemptionInfo(deadline_ms=1_030_500, preempted_node_to_ranks={"node-b": [5, 3], "node-a": [0]}))
    got = train.preemption(now=1000.0)
    assert got == train.Preemption(seconds_left=30.5, nodes=("node-a", "node-b"), ranks=(0, 3, 5), this_worker=True)
    monkeypatch.setattr(ray_train, "get_context", lambda: _Context(4))
    assert train.preemption(now=1000.0).this_worker is False
    assert train.preemption(now=2000.0).seconds_left == 0.0  # past the deadline: none left, never negative
    seen.append(ray_train.PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-a": [4]}))
    late = train.preemption(now=1000.0)
    assert late.seconds_left is None and late.this_worker is True
