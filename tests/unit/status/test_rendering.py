"""RenderingCurrent (status/rendering.py): said when a child runs another rendering than this
operator's, naming both versions, whether KubeRay would start a new RayCluster, and how to apply
it; a spec this operator refuses keeps a child rendered for the same generation running."""

import copy

from tputorch import render
from tputorch.render.names import SPEC_HASH_ANNOTATION
from tputorch.render.service import rayservice_hash
from tputorch.api import spec as specs
from tputorch.api.reader import FieldError
from tputorch.render import stamp
from tputorch.status import conditions, rendering

from ..services import service_body

NOW = "2026-12-07T09:00:00Z"


def fresh(**spec):
    return stamp.rendering(render.rayservice(specs.parse_service(service_body(**spec))))


def rehashed(rendered: dict) -> dict:
    """A rendering edited by a test, with the spec hash its operator would have given it."""
    annotations = {k: v for k, v in rendered["annotations"].items() if k != SPEC_HASH_ANNOTATION}
    digest = rayservice_hash({"metadata": {"annotations": annotations}, "spec": rendered["spec"]})
    return {**rendered, "annotations": {**annotations, SPEC_HASH_ANNOTATION: digest}}


def test_the_same_rendering_says_nothing():
    assert rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", None, fresh(), fresh(), 1) is None


def test_an_older_rendering_names_both_versions_what_applying_it_does_and_how():
    new = fresh()
    old = copy.deepcopy(new)
    old["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "OLD", "value": "1"})
    old = rehashed(old)
    found = stamp.Stamp("0.2.0", 3, "", old)
    cond = rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", found, old, new, 3)
    assert (cond["type"], cond["status"], cond["reason"]) == ("RenderingCurrent", "False", "OlderRendering")
    assert "tputorch-operator 0.2.0" in cond["message"] and f"tputorch-operator {stamp.OPERATOR_VERSION}" in cond["message"]
    assert "new RayCluster, a second set of TPU slices" in cond["message"]
    assert "kubectl annotate tputorchservice qwen -n ml tputorch.io/rerender=" in cond["message"]
    assert "tputorch rerender qwen -n ml" in cond["message"]
    # only the worker bounds differ: KubeRay applies them in place
    bounds = copy.deepcopy(new)
    bounds["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 7
    bounds = rehashed(bounds)
    cond = rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", None, bounds, new, 3)
    assert "no new RayCluster" in cond["message"] and "an operator before 0.3.0" in cond["message"]


def test_the_condition_keeps_its_transition_time_and_goes_when_current():
    cond = conditions.condition("RenderingCurrent", False, "OlderRendering", "m", 1)
    previous = {"conditions": [{**cond, "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
    status = rendering.with_condition({"phase": "Ready", "conditions": []}, cond, previous, NOW)
    assert status["conditions"][0]["lastTransitionTime"] == "2026-12-01T00:00:00Z"
    assert rendering.with_condition(status, None, status, NOW)["conditions"] == []


def test_a_refusal_keeps_a_child_of_this_generation_running_with_a_warning():
    parent = service_body()
    parent["metadata"]["generation"] = 3
    assert rendering.keeps_running(parent, stamp.Stamp("0.2.0", 3, "", None))
    assert not rendering.keeps_running(parent, stamp.Stamp("0.2.0", 2, "", None))  # a new generation: refused
    parent["status"] = {"observedGeneration": 3, "phase": "Ready"}
    assert rendering.keeps_running(parent, None)  # made before the rule, this generation accepted then
    parent["status"]["conditions"] = [{"type": "Validated", "status": "False"}]
    assert not rendering.keeps_running(parent, None)
    previous = {"phase": "Ready", "observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": ""}]}
    status = rendering.refused_but_running("TPUTorchService", "RayService", "qwen", "ml",
                                           [FieldError("spec.x", 1, "no longer allowed")],
                                           stamp.Stamp("0.2.0", 3, "", None), 3, previous, NOW)
    assert status["phase"] == "Ready" and status["observedGeneration"] == 3
    cond = status["conditions"][-1]
    assert (cond["status"], cond["reason"]) == ("False", "RefusedByThisVersion")
    assert "no longer allowed" in cond["message"] and "0.2.0" in cond["message"]
    (event,) = conditions.events(previous, status)
    assert event.type == "Warning"


def test_a_child_made_before_the_rule_differs_only_in_what_this_operator_renders():
    new = fresh()
    stored = copy.deepcopy(new)
    stored["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["restartPolicy"] = "Always"  # a default
    stored["annotations"][SPEC_HASH_ANNOTATION] = "0123456789abcdef"
    adopted = stamp.Stamp(stamp.UNKNOWN_VERSION, 1, "", stored)
    assert rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", adopted, stored, new, 1) is None
    stored["spec"]["serveConfigV2"] = "applications: []\n"
    assert rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", adopted, stored, new, 1) is not None
    cond = rendering.rendering_condition("TPUTorchService", "RayService", "qwen", "ml", adopted, stored, new, 1)
    assert ": spec.serveConfigV2." in cond["message"] and "restartPolicy" not in cond["message"]


def test_differences_are_paths():
    assert rendering.differences({"a": [1, {"b": 2}], "c": 3}, {"a": [1, {"b": 4}], "d": 5}) == ["a[1].b", "d", "c"]
    assert rendering.differences({"a": 1, "c": 3}, {"a": 1}, exact=False) == []
