"""The upgrade rule (render/stamp.py): a child keeps the rendering it was made with until its
parent's generation moves or the user asks for the new one; drift is put back to its own
rendering; a child made before the rule is stamped with what it has, its spec untouched."""

import copy

import pytest

from tputorch import render
from tputorch.render.names import INITIALIZING_TIMEOUT_ANNOTATION, RAYSERVICE_ANNOTATIONS, SPEC_HASH_ANNOTATION
from tputorch.render.service import rayservice_hash, rayservice_patch
from tputorch.api import spec as specs
from tputorch.render import stamp

from ..services import merge_patch, service_body

MANAGED = RAYSERVICE_ANNOTATIONS


def parent(generation=1, rerender=None, observed=None, **spec):
    body = service_body(**spec)
    body["metadata"]["generation"] = generation
    if rerender is not None:
        body["metadata"]["annotations"] = {stamp.RERENDER_ANNOTATION: rerender}
    if observed is not None:
        body["status"] = {"observedGeneration": observed}
    return body


def rendered(body) -> dict:
    return render.rayservice(specs.parse_service(body))


def made_by(version, body, generation=1, rerender="") -> dict:
    """The RayService an operator of ``version`` created for ``body``, stamped."""
    child = rendered(body)
    child["metadata"]["annotations"].update(stamp.annotations(version, generation, rerender, stamp.rendering(child)))
    return child


def patch_of(body, child, fresh=None):
    svc = specs.parse_service(body)
    return stamp.child_patch(body, child, fresh or (lambda: render.rayservice(svc)),
                             lambda desired: rayservice_patch(svc, child, desired), MANAGED)


def older_operators_rendering(body) -> dict:
    """What an earlier operator rendered for the same spec: a container variable it did not set."""
    child = rendered(body)
    env = child["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    env.append({"name": "OLD_OPERATORS_VARIABLE", "value": "1"})
    child["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(child)
    return child


def test_the_stamp_round_trips_and_a_spoiled_one_reads_as_no_rendering():
    child = made_by("0.2.0", parent(generation=4), generation=4, rerender="x")
    found = stamp.read(child)
    assert (found.version, found.generation, found.rerender) == ("0.2.0", 4, "x")
    assert found.rendering == stamp.rendering(rendered(parent()))
    assert stamp.RENDERING_ANNOTATION not in found.rendering["annotations"]
    child["metadata"]["annotations"][stamp.RENDERING_ANNOTATION] = "gzip+base64:bm90IGd6aXA="
    assert stamp.read(child).rendering is None
    assert stamp.read(rendered(parent())) is None  # made before the rule


def test_same_generation_under_a_new_operator_changes_nothing():
    body = parent()
    child = older_operators_rendering(body)
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(child)))
    assert stamp.decide(body, stamp.read(child)) == stamp.KEEP
    assert patch_of(body, child) is None  # today's code patches it to the new rendering


def test_a_new_generation_gets_the_new_rendering_and_a_new_stamp():
    body = parent(generation=2)
    child = older_operators_rendering(body)
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(child)))
    patch = patch_of(body, child)
    after = {**child, "metadata": {**child["metadata"], "annotations": merge_patch(child["metadata"]["annotations"],
                                                                                   patch["metadata"]["annotations"])},
             "spec": merge_patch(child["spec"], patch["spec"])}
    fresh = rendered(body)
    assert stamp.rendering(after) == stamp.rendering(fresh)
    found = stamp.read(after)
    assert (found.version, found.generation) == (stamp.OPERATOR_VERSION, 2)
    assert found.rendering == stamp.rendering(fresh)
    assert patch_of(body, after) is None  # once


def test_the_rerender_annotation_asks_once_for_the_new_rendering():
    child = older_operators_rendering(parent())
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(child)))
    body = parent(rerender="2026-12-07")
    assert stamp.decide(body, stamp.read(child)) == stamp.RERENDER
    patch = patch_of(body, child)
    assert "OLD_OPERATORS_VARIABLE" not in str(patch["spec"])
    assert patch["metadata"]["annotations"][stamp.RERENDER_ANNOTATION] == "2026-12-07"
    child["metadata"]["annotations"] = merge_patch(child["metadata"]["annotations"], patch["metadata"]["annotations"])
    assert stamp.decide(body, stamp.read(child)) == stamp.KEEP  # the same value asks nothing more


def test_drift_is_put_back_to_the_childs_own_rendering_not_the_new_one():
    body = parent()
    child = older_operators_rendering(body)
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(child)))
    own = copy.deepcopy(child["spec"])
    child["spec"]["serveConfigV2"] = "applications: []\n"  # edited behind the operator's back
    patch = patch_of(body, child)
    assert patch["spec"]["serveConfigV2"] == own["serveConfigV2"]
    assert merge_patch(child["spec"], patch["spec"]) == own  # OLD_OPERATORS_VARIABLE kept
    assert stamp.VERSION_ANNOTATION not in patch["metadata"]["annotations"]  # the stamp stays


def test_a_child_made_before_the_rule_is_stamped_with_what_it_has_and_its_spec_untouched():
    body = parent(observed=1)
    child = older_operators_rendering(body)
    child["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    assert stamp.decide(body, None) == stamp.ADOPT
    patch = patch_of(body, child)
    assert set(patch) == {"metadata"} and set(patch["metadata"]) == {"annotations"}
    found = stamp.read({"metadata": {"annotations": patch["metadata"]["annotations"]}})
    assert (found.version, found.generation) == (stamp.UNKNOWN_VERSION, 1)
    ours = {k: v for k, v in child["metadata"]["annotations"].items() if k in MANAGED}
    assert set(ours) == set(MANAGED)
    assert found.rendering == {"annotations": ours, "spec": child["spec"]}  # not kubectl's
    # then it keeps that rendering
    child["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    assert patch_of(body, child) is None


@pytest.mark.parametrize("generation, observed, asked, decision", [
    (2, 1, None, stamp.RERENDER),  # edited while no operator ran: the old one never applied it
    (2, 2, None, stamp.ADOPT),
    (2, None, None, stamp.ADOPT),
    (2, 2, "now", stamp.RERENDER),
])
def test_a_child_without_a_stamp(generation, observed, asked, decision):
    assert stamp.decide(parent(generation=generation, observed=observed, rerender=asked), None) == decision


def test_a_queued_services_timeout_stays_kueues_admission_to_give():
    body = parent(queueName="tpu", serve={"initializingTimeoutSeconds": 60})
    child = rendered(body)
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", {
        "annotations": {**child["metadata"]["annotations"], INITIALIZING_TIMEOUT_ANNOTATION: "60s"},
        "spec": child["spec"]}))
    child["metadata"]["annotations"][INITIALIZING_TIMEOUT_ANNOTATION] = "360s"  # admitted_timeout_patch's
    assert patch_of(body, child) is None


def test_a_rendering_too_large_to_record_is_left_out_and_the_child_kept_as_it_is():
    import secrets
    body = parent(env=[{"name": f"V{i}", "value": secrets.token_hex(2000)} for i in range(40)])  # incompressible
    child = rendered(body)
    stamped = stamp.annotations("0.2.0", 1, "", stamp.rendering(child))
    assert stamp.RENDERING_ANNOTATION not in stamped and stamped[stamp.VERSION_ANNOTATION] == "0.2.0"
    child["metadata"]["annotations"].update(stamped)
    child["spec"]["serveConfigV2"] = "applications: []\n"
    assert patch_of(body, child) is None  # no record to restore from, none to write again
    # a new generation's rendering replaces the record; a too large one removes the earlier
    small = made_by("0.2.0", parent())
    patch = patch_of(parent(generation=2, env=[{"name": f"V{i}", "value": secrets.token_hex(2000)} for i in range(40)]),
                     small)
    assert patch["metadata"]["annotations"][stamp.RENDERING_ANNOTATION] is None


def test_the_token_secret_a_rerendered_rayservice_names():
    """status/rendering.py token_secret_of_rerendered: the operator's name a RayService has is kept
    (from the live child, else its record); one without gets a name of its own only with a re-render
    that starts a new RayCluster anyway (authOptions is in KubeRay's cluster hash); never another's."""
    from tputorch.render.raytoken import later_ray_token_secret_name, with_ray_token_secret
    from tputorch.status.rendering import token_secret_of_rerendered

    fresh = render.rayservice(specs.parse_service(service_body()))
    child = {**copy.deepcopy(fresh), "metadata": {**fresh["metadata"], "uid": "rs-uid"}}
    running = stamp.rendering(child)
    assert token_secret_of_rerendered(child, running, stamp.rendering(fresh)) is None  # in place: none
    moved = copy.deepcopy(fresh)
    moved["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = "7"
    later = token_secret_of_rerendered(child, running, stamp.rendering(moved))
    assert later == later_ray_token_secret_name(child) == token_secret_of_rerendered(child, running, stamp.rendering(moved))
    assert later.startswith("qwen-ray-token-") and later != later_ray_token_secret_name(
        {**child, "metadata": {**child["metadata"], "uid": "another"}})
    named = copy.deepcopy(child)
    with_ray_token_secret(named, "qwen-ray-token-abc123")
    for rerendered in (fresh, moved):
        assert token_secret_of_rerendered(named, stamp.rendering(named), stamp.rendering(rerendered)) == "qwen-ray-token-abc123"
    # its authOptions edited behind the operator's back: the name its record holds
    assert token_secret_of_rerendered(child, stamp.rendering(named), stamp.rendering(moved)) == "qwen-ray-token-abc123"
    # a Secret the operator does not name (someone else's) is never kept: the re-render takes it out
    # (a new RayCluster), and names the child's own
    foreign = copy.deepcopy(child)
    with_ray_token_secret(foreign, "someone-elses")
    assert token_secret_of_rerendered(foreign, stamp.rendering(foreign), stamp.rendering(fresh)) == later


def test_a_rayservice_without_a_token_secret_is_named_none_under_upgrade_strategy_none():
    """KubeRay starts no new RayCluster under upgradeStrategy None (1.6.2 rayservice_controller.go
    isZeroDowntimeUpgradeEnabled): the running cluster keeps KubeRay's token, so a Secret named on
    the RayService would be one its cluster does not hold, whose token the slice check would present.
    The edit that sets NewCluster beside a cluster change starts one, and names it."""
    from tputorch.render.raytoken import later_ray_token_secret_name
    from tputorch.status.rendering import new_cluster, token_secret_of_rerendered

    fresh = render.rayservice(specs.parse_service(service_body(upgradeStrategy="None")))
    assert fresh["spec"]["upgradeStrategy"] == {"type": "None"}
    child = {**copy.deepcopy(fresh), "metadata": {**fresh["metadata"], "uid": "rs-uid"}}
    moved = copy.deepcopy(fresh)
    moved["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = "7"
    assert new_cluster(child["spec"], moved["spec"])  # inside the hash: what names one under NewCluster
    assert token_secret_of_rerendered(child, stamp.rendering(child), stamp.rendering(moved)) is None
    moved["spec"]["upgradeStrategy"] = {"type": "NewCluster"}
    assert (token_secret_of_rerendered(child, stamp.rendering(child), stamp.rendering(moved))
            == later_ray_token_secret_name(child))
