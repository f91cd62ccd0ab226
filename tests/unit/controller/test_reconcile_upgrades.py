"""An operator upgrade changes no running child (issue 59), through the fake API adapter: a
RayService keeps the rendering it was made with until its spec changes or the user asks
(tputorch.io/rerender), drift is put back to that rendering, a child made before the rule is
stamped with what it has, a job's running attempt is never re-rendered, its Ray token Secret is
never replaced, and a refusal this operator adds keeps a child of the same generation running."""

from __future__ import annotations

import asyncio
import copy

from tputorch import render
from tputorch.render.names import SPEC_HASH_ANNOTATION
from tputorch.render.service import rayservice_hash
from tputorch.api import spec as specs
from tputorch.controller.raytoken import RayTokens
from tputorch.render import stamp

from ..fakekube import controller
from ..jobs import body as job_body
from ..services import merge_patch, service_body

SVC = "TPUTorchService"
SVC_KEY = (SVC, "ml", "qwen")
JOB = "TPUTorchJob"
JOB_KEY = (JOB, "ml", "demo")


def run(coro):
    return asyncio.run(coro)


def service(generation=1, rerender=None, status=None, **spec):
    body = service_body(**spec)
    body["metadata"].update(uid="svc-uid", resourceVersion=str(10 + generation), generation=generation)
    if rerender is not None:
        body["metadata"]["annotations"] = {stamp.RERENDER_ANNOTATION: rerender}
    if status is not None:
        body["status"] = status
    return body


def older_rayservice(parent: dict, stamped_as: str | None = "0.2.0", generation: int = 1) -> dict:
    """The RayService an earlier operator made for ``parent``: one container variable this one does
    not render (as 0.2.0's TORCH_TPU_TOPOLOGY did to 0.1.0's), stamped or (None) not."""
    child = render.rayservice(specs.parse_service(parent))
    child["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "OLD_OPERATORS_VARIABLE", "value": "1"})
    child["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(child)
    if stamped_as is not None:
        child["metadata"]["annotations"].update(stamp.annotations(stamped_as, generation, "", stamp.rendering(child)))
    child["metadata"].update(namespace="ml", uid="rs-uid", resourceVersion="50", ownerReferences=[
        {"apiVersion": "tputorch.io/v1alpha1", "kind": SVC, "name": "qwen", "uid": "svc-uid", "controller": True}])
    return child


def setup(parent: dict, child: dict | None, kind=SVC, **options):
    ctl = controller(**options)
    ctl.writes.interval = 0
    ctl.parents[kind].remember(parent)
    if child is not None:
        ctl.children[kind].remember(child)
    return ctl


def child_patches(ctl, plural="rayservices") -> list[dict]:
    return [c[4] for c in ctl.kube.called("patch") if c[1] == plural]


def applied(child: dict, patch: dict) -> dict:
    """The child as the API server has it after the merge patch."""
    out = copy.deepcopy(child)
    meta = patch.get("metadata") or {}
    if "annotations" in meta:
        out["metadata"]["annotations"] = merge_patch(out["metadata"].get("annotations") or {}, meta["annotations"])
    if "spec" in patch:
        out["spec"] = merge_patch(out["spec"], patch["spec"])
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def last_status(ctl) -> dict:
    return ctl.kube.called("patch_status")[-1][4]


def rendering_condition(status: dict) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "RenderingCurrent"), None)


def test_a_new_rayservice_is_stamped_with_its_rendering_version_and_generation():
    ctl = setup(service(generation=3), None)
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    created = ctl.kube.objects[("rayservices", "ml", "qwen")]
    found = stamp.read(created)
    assert (found.version, found.generation, found.rerender) == (stamp.OPERATOR_VERSION, 3, "")
    assert found.rendering == stamp.rendering(render.rayservice(specs.parse_service(service(generation=3))))
    assert rendering_condition(last_status(ctl)) is None


def test_an_operator_upgrade_changes_no_running_rayservice_and_says_how_to_apply_the_new_rendering():
    parent = service()
    ctl = setup(parent, older_rayservice(parent))
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    assert child_patches(ctl) == []  # the operator before this rule patched it to its own rendering
    status = last_status(ctl)
    cond = rendering_condition(status)
    assert (cond["status"], cond["reason"]) == ("False", "OlderRendering")
    assert "tputorch-operator 0.2.0" in cond["message"] and f"tputorch-operator {stamp.OPERATOR_VERSION}" in cond["message"]
    assert "new RayCluster" in cond["message"] and "tputorch rerender qwen -n ml" in cond["message"]
    # the RayService runs what it is meant to: the status does not wait for an update that never comes
    applied_cond = next(c for c in status["conditions"] if c["type"] == "SpecApplied")
    assert applied_cond["reason"] != "Updating" and status["phase"] != "Updating"


def test_an_edit_of_the_spec_applies_the_new_rendering_and_stamps_it():
    child = older_rayservice(service())
    ctl = setup(service(generation=2), child)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    after = applied(child, patch)
    fresh = render.rayservice(specs.parse_service(service(generation=2)))
    assert after["spec"] == fresh["spec"]
    found = stamp.read(after)
    assert (found.version, found.generation) == (stamp.OPERATOR_VERSION, 2)
    ctl.children[SVC]._put(ctl.children[SVC].slim(after))  # its watch event
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    assert rendering_condition(last_status(ctl)) is None


def test_the_rerender_annotation_applies_the_new_rendering_once():
    child = older_rayservice(service())
    ctl = setup(service(rerender="2026-12-07T09:00:00Z"), child)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    assert "OLD_OPERATORS_VARIABLE" not in str(patch["spec"])
    after = applied(child, patch)
    assert stamp.read(after).rerender == "2026-12-07T09:00:00Z"
    ctl.children[SVC]._put(ctl.children[SVC].slim(after))
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"


def test_drift_is_put_back_to_the_childs_own_rendering_not_this_operators():
    parent = service()
    child = older_rayservice(parent)
    own = copy.deepcopy(child["spec"])
    child["spec"]["serveConfigV2"] = "applications: []\n"  # edited behind the operator's back
    ctl = setup(parent, child)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    assert applied(child, patch)["spec"] == own  # its own older rendering, OLD_OPERATORS_VARIABLE included


def test_a_rayservice_made_before_the_rule_is_stamped_with_what_it_has_its_spec_untouched():
    parent = service(status={"observedGeneration": 1, "phase": "Ready"})
    child = older_rayservice(parent, stamped_as=None)
    ctl = setup(parent, child)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    assert list(patch) == ["metadata"] and list(patch["metadata"]) == ["annotations"]
    after = applied(child, patch)
    assert after["spec"] == child["spec"]
    found = stamp.read(after)
    assert (found.version, found.generation, found.rendering["spec"]) == (stamp.UNKNOWN_VERSION, 1, child["spec"])
    cond = rendering_condition(last_status(ctl))
    assert cond["reason"] == "OlderRendering" and "an operator before 0.3.0" in cond["message"]
    ctl.children[SVC]._put(ctl.children[SVC].slim(after))
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"


def kept_running_then_refused(parent: dict, child: dict, *fragments: str) -> None:
    """``parent``'s spec, refused by this operator, keeps ``child`` (rendered for its generation by
    0.2.0) running with RefusedByThisVersion naming ``fragments``; its next generation is refused
    as any invalid spec is."""
    ctl = setup(parent, child)
    assert run(ctl.reconcile(SVC_KEY)) == "invalid"
    status = last_status(ctl)
    assert status["phase"] == "Ready"
    cond = rendering_condition(status)
    assert (cond["status"], cond["reason"]) == ("False", "RefusedByThisVersion")
    assert all(f in cond["message"] for f in (*fragments, "0.2.0")), cond["message"]
    assert child_patches(ctl) == [] and not ctl.kube.called("delete")
    ctl.parents[SVC]._put({**parent, "metadata": {**parent["metadata"], "generation": 2, "resourceVersion": "30"}})
    run(ctl.reconcile(SVC_KEY))
    assert last_status(ctl)["phase"] == "Failed"


def test_a_refusal_this_operator_adds_keeps_a_rayservice_of_the_same_generation_running():
    parent = service(status={"observedGeneration": 1, "phase": "Ready", "conditions": []})
    child = older_rayservice(service())
    parent["spec"]["tpu"]["topology"] = "3x3"  # as if a rule this version added refused what 0.2.0 took
    kept_running_then_refused(parent, child, "spec.tpu.topology")


def test_an_ephemeral_storage_below_the_raised_floor_keeps_its_rayservice_running_until_the_next_edit(monkeypatch):
    """Issue 56: the floor of a set ephemeralStorage rose from the volumes + 1Gi to + 10Gi; a
    service 0.2.0 accepted with 101Gi over a 100Gi scratch volume keeps its RayService (rendered for
    its generation) with RefusedByThisVersion, and only its next generation is refused."""
    from tputorch.api import storage

    scratch = {"name": "scratch", "mountPath": "/scratch", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "100Gi"}}
    fields = {"volumes": [scratch], "worker": {"cpu": "100", "memory": "400Gi", "ephemeralStorage": "101Gi"}}
    parent = service(status={"observedGeneration": 1, "phase": "Ready", "conditions": []}, **fields)
    with monkeypatch.context() as m:
        m.setattr(storage, "DISK_HEADROOM", "1Gi")  # 0.2.0's floor: this spec was valid then
        child = older_rayservice(service(**fields))
    kept_running_then_refused(parent, child, "spec.worker.ephemeralStorage", "must be at least 110Gi")


def running_earlier_attempt(ctl, created: dict) -> None:
    """The store holds, in place of ``created``, the running RayJob an earlier operator rendered
    for the same job: another entrypoint."""
    older = copy.deepcopy(created)
    older["metadata"].update(uid="rj-1", resourceVersion="60")
    older["spec"]["entrypoint"] = "python old_operators_entrypoint.py"
    older["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(older)))
    older["status"] = {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}
    ctl.children[JOB]._put(ctl.children[JOB].slim(older))


def test_a_jobs_rayjob_is_stamped_and_its_running_attempt_never_re_rendered():
    parent = job_body()
    parent["metadata"].update(uid="uid-new", resourceVersion="10", generation=1)
    ctl = setup(parent, None, kind=JOB)
    assert run(ctl.reconcile(JOB_KEY)) == "created"
    created = ctl.kube.objects[("rayjobs", "ml", "demo")]
    found = stamp.read(created)
    assert (found.version, found.generation) == (stamp.OPERATOR_VERSION, 1)
    assert found.rendering["spec"] == created["spec"]
    # an earlier operator's running attempt, and the user's suspend edit (generation 2): suspend alone
    running_earlier_attempt(ctl, created)
    ctl.parents[JOB]._put({**parent, "metadata": {**parent["metadata"], "generation": 2, "resourceVersion": "11"},
                           "spec": {**parent["spec"], "suspend": True}})
    run(ctl.reconcile(JOB_KEY))
    assert child_patches(ctl, "rayjobs") == [{"spec": {"suspend": True}}]


def test_the_ray_token_secret_is_never_replaced_under_a_running_cluster():
    """A new operator (its own key) finds the RayJob's Secret there: created only, never patched,
    replaced or deleted (a new token would break the running cluster's auth)."""
    parent = job_body()
    parent["metadata"].update(uid="uid-new", resourceVersion="10", generation=1)
    ctl = setup(parent, None, kind=JOB)
    run(ctl.reconcile(JOB_KEY))
    (secret_key,) = [k for k in ctl.kube.objects if k[0] == "secrets"]
    made = copy.deepcopy(ctl.kube.objects[secret_key])
    rayjob = ctl.kube.objects[("rayjobs", "ml", "demo")]
    rayjob["status"] = {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}
    upgraded = setup(parent, rayjob, kind=JOB, ray_tokens=RayTokens(b"k" * 32))
    upgraded.kube.objects = ctl.kube.objects
    run(upgraded.reconcile(JOB_KEY))
    assert upgraded.kube.objects[secret_key] == made
    assert not [c for c in upgraded.kube.calls if c[0] in ("patch", "delete") and c[1] == "secrets"]
    assert child_patches(upgraded, "rayjobs") == []


def test_a_running_attempt_of_an_earlier_operators_rendering_is_said_and_the_next_attempt_gets_this_ones():
    parent = job_body()
    parent["metadata"].update(uid="uid-new", resourceVersion="10", generation=1)
    ctl = setup(parent, None, kind=JOB)
    run(ctl.reconcile(JOB_KEY))
    created = ctl.kube.objects[("rayjobs", "ml", "demo")]
    assert stamp.RENDERING_ANNOTATION not in ctl.children[JOB].slim(created)["metadata"]["annotations"]  # this version's
    running_earlier_attempt(ctl, created)
    run(ctl.reconcile(JOB_KEY))
    cond = rendering_condition(last_status(ctl))
    assert (cond["status"], cond["reason"]) == ("False", "OlderRendering")
    assert "spec.entrypoint" in cond["message"] and "next attempt" in cond["message"] and "0.2.0" in cond["message"]
    assert "authOptions" not in cond["message"]  # its token Secret's name is its own, not a difference
    assert child_patches(ctl, "rayjobs") == []
