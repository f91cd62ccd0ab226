"""RL rollouts that manage their own chips (verl's TPU recipe): RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS
is allowed in a group's env, never in spec.env (the training slice), reaches only that group's
containers, and the job's status warns of it (ChipIsolation=False)."""

from __future__ import annotations

import pytest

from tputorch import render, status as statuses
from tputorch.api import spec
from tputorch.api.groups import NOSET_VISIBLE_CHIPS

from ..jobs import body

NOSET = {"name": NOSET_VISIBLE_CHIPS, "value": "1"}
ROLLOUT = {"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "2x2"}, "env": [NOSET, {"name": "VLLM_X", "value": "y"}]}


def errors(**spec_fields) -> dict[str, str]:
    with pytest.raises(spec.InvalidSpec) as info:
        spec.parse(body(**spec_fields))
    return {e.path: e.message for e in info.value.errors}


def test_a_rollout_group_may_switch_chip_isolation_off():
    job = spec.parse(body(groups=[ROLLOUT, {"name": "reward"}]))
    rollout, reward = job.groups
    assert rollout.env == (NOSET, {"name": "VLLM_X", "value": "y"}) and rollout.manages_own_chips
    assert reward.env == () and not reward.manages_own_chips


def test_never_on_the_training_slice():
    message = errors(env=[NOSET], groups=[ROLLOUT])["spec.env[0].name"]
    assert "chip isolation off, never on the training slice" in message and "spec.groups[].env" in message


@pytest.mark.parametrize("entry, why", [
    ({"name": "TPU_VISIBLE_CHIPS", "value": "0"}, "Ray sets it per worker"),
    ({"name": "TPUTORCH_ATTEMPT", "value": "9"}, "must not start with TPUTORCH_"),
    ({"name": "RAY_AUTH_MODE", "value": "disabled"}, "token authentication"),
])
def test_a_groups_env_refuses_the_other_names_spec_env_refuses(entry, why):
    assert why in errors(groups=[{"name": "rollout", "env": [entry]}])["spec.groups[0].env[0].name"]


def test_a_name_twice_in_a_groups_env_is_refused():
    assert "unique within spec.groups[0].env" in errors(groups=[{"name": "r", "env": [NOSET, NOSET]}])["spec.groups[0].env[1].name"]


def containers_env(rayjob) -> dict[str, list[set[str]]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    out = {"head": [{e["name"] for e in c["env"]} for c in cluster["headGroupSpec"]["template"]["spec"]["containers"]]}
    for group in cluster["workerGroupSpecs"]:
        out[group["groupName"]] = [{e["name"] for e in c["env"]} for c in group["template"]["spec"]["containers"]]
    return out


def test_only_the_groups_containers_get_it():
    env = containers_env(render.rayjob(spec.parse(body(groups=[ROLLOUT, {"name": "reward"}]))))
    assert all(NOSET_VISIBLE_CHIPS in names and "VLLM_X" in names for names in env["rollout"])
    for group in ("head", "tpu-slice", "reward"):
        assert env[group] and all(NOSET_VISIBLE_CHIPS not in names for names in env[group]), group


def chip_condition(job) -> dict | None:
    status = statuses.derive(job, 1, None, [], {}, "2026-12-01T10:00:00Z")
    return next((c for c in status["conditions"] if c["type"] == "ChipIsolation"), None)


def test_the_status_warns_when_a_group_manages_its_own_chips():
    cond = chip_condition(spec.parse(body(groups=[ROLLOUT])))
    assert (cond["status"], cond["reason"]) == ("False", "GroupManagesOwnChips")
    assert "rollout" in cond["message"] and NOSET_VISIBLE_CHIPS in cond["message"]
    assert statuses.events({}, {"conditions": [cond]})[0].type == "Warning"
    assert chip_condition(spec.parse(body(groups=[{"name": "reward"}]))) is None
