"""An operator upgrade changes no running child (issue 59), through the fake API adapter: a
RayService keeps the rendering it was made with until its spec changes or the user asks
(tputorch.io/rerender), drift is put back to that rendering, a child made before the rule is
stamped with what it has, a job's running attempt is never re-rendered, its Ray token Secret is
never replaced, and a refusal this operator adds keeps a child of the same generation running."""

from __future__ import annotations

import asyncio
import copy
import re

from tputorch import render
from tputorch.render.names import SPEC_HASH_ANNOTATION
from tputorch.render.service import rayservice_hash
from tputorch.api import spec as specs
from tputorch.controller import slicereads
from tputorch.controller.raytoken import RayTokens
from tputorch.status import rendering
from tputorch.render import stamp
from tputorch.render.raytoken import later_ray_token_secret_name, ray_token_secret_name, with_ray_token_secret

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
    fresh = render.rayservice(specs.parse_service(service(generation=3)))
    with_ray_token_secret(fresh, ray_token_secret_name(created))  # named at its creation, and recorded
    assert found.rendering == stamp.rendering(fresh)
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
    # a new RayCluster anyway (the variable): it gets the token Secret 0.2.0's services lacked
    with_ray_token_secret(fresh, later_ray_token_secret_name(child))
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


# --- a RayService's own Ray token Secret (issue 56: the slice check reads real services) -----------

def token_secrets(ctl) -> list[str]:
    """The token Secrets the operator asked to create, in order."""
    return [c[3] for c in ctl.kube.called("create") if c[1] == "secrets"]


def watched(ctl, patch: dict | None = None) -> dict:
    """The RayService as the API server has it (``patch`` applied), brought by its watch event."""
    key = ("rayservices", "ml", "qwen")
    if patch is not None:
        ctl.kube.objects[key] = applied(ctl.kube.objects[key], patch)
    ctl.children[SVC]._put(ctl.children[SVC].slim(ctl.kube.objects[key]))
    return ctl.kube.objects[key]


def secret_name_of(child: dict) -> str | None:
    return child["spec"]["rayClusterConfig"]["authOptions"].get("secretName")


def test_a_rayservice_is_created_naming_its_own_token_secret_made_right_after_and_owned_by_it(caplog):
    tokens = RayTokens(b"k" * 32)
    ctl = setup(service(), None, ray_tokens=tokens)
    with caplog.at_level("INFO", logger="tputorch"):
        assert run(ctl.reconcile(SVC_KEY)) == "created"
    assert "its Ray token Secret next" in caplog.text  # one line for both, as a job's
    assert [c[1] for c in ctl.kube.called("create")] == ["rayservices", "secrets"]
    made = ctl.kube.objects[("rayservices", "ml", "qwen")]
    assert made["spec"]["rayClusterConfig"]["authOptions"]["mode"] == "token"
    name = secret_name_of(made)
    assert re.fullmatch(r"qwen-ray-token-[0-9a-f]{6}", name)  # this RayService's alone
    secret = ctl.kube.objects[("secrets", "ml", name)]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["uid"]) == (
        "ray.io/v1", "RayService", "qwen", made["metadata"]["uid"])
    assert secret["metadata"]["labels"]["tputorch.io/service"] == "qwen"
    assert secret["stringData"]["auth_token"] == tokens.token("ml", name) != RayTokens(b"j" * 32).token("ml", name)
    # KubeRay holds the token the slice check presents
    assert slicereads.token_secret(made) == (True, name)
    # a RayService made again (deleted behind the operator's back) names a new Secret
    del ctl.kube.objects[("rayservices", "ml", "qwen")]
    ctl.child.expected.clear()
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    assert secret_name_of(ctl.kube.objects[("rayservices", "ml", "qwen")]) not in (None, name)


def test_the_token_secret_name_is_kept_across_every_rerender_and_restart():
    """Its cluster holds that Secret's token: no edit, rerender request, drift or restart names another."""
    ctl = setup(service(), None)
    run(ctl.reconcile(SVC_KEY))
    name = secret_name_of(watched(ctl))
    for parent in (service(generation=2, image="example.com/ray-vllm-torchtpu:2.60.1"),  # a new RayCluster
                   service(generation=3, replicas={"min": 2, "max": 2}),  # in place
                   service(generation=3, rerender="2026-12-07T09:00:00Z", replicas={"min": 2, "max": 2})):
        parent["metadata"]["resourceVersion"] += "-" + str(len(child_patches(ctl)))  # a version of its own
        ctl.parents[SVC]._put(parent)
        assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
        patch = child_patches(ctl)[-1]
        if parent["metadata"].get("annotations"):  # the rerender of the spec it runs: its stamp alone
            assert list(patch) == ["metadata"]
        else:
            assert patch["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token", "secretName": name}
        assert secret_name_of(watched(ctl, patch)) == name
        assert rendering_condition(last_status(ctl)) is None  # the name is no difference of renderings
    # drift: authOptions edited behind the operator's back is put back with the same name
    del ctl.kube.objects[("rayservices", "ml", "qwen")]["spec"]["rayClusterConfig"]["authOptions"]["secretName"]
    watched(ctl)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    assert secret_name_of(watched(ctl, child_patches(ctl)[-1])) == name
    # an operator restart: the Secret asked for again (409: there), nothing patched
    restarted = setup(ctl.parents[SVC].get(("ml", "qwen")), ctl.kube.objects[("rayservices", "ml", "qwen")])
    restarted.kube.objects = ctl.kube.objects
    assert run(restarted.reconcile(SVC_KEY)) == "unchanged"
    assert child_patches(restarted) == [] and token_secrets(restarted) == [name]
    assert token_secrets(ctl) == [name]


def kuberays_token_rayservice(parent: dict) -> dict:
    """A RayService 0.2.0 made for ``parent``, otherwise rendered as this operator renders it: its
    authOptions name no Secret (KubeRay's own holds its token)."""
    child = older_rayservice(parent)
    env = child["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "OLD_OPERATORS_VARIABLE"]
    child["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(child)
    child["metadata"]["annotations"].update(stamp.annotations("0.2.0", 1, "", stamp.rendering(child)))
    assert child["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    return child


def test_a_rayservice_without_a_token_secret_is_not_rolled_by_an_operator_restart_nor_an_in_place_edit():
    """The upgrade rule: authOptions is inside KubeRay's cluster hash, so naming a Secret there would
    start a new RayCluster (a second set of slices): a RayService 0.2.0 made keeps KubeRay's token
    through a restart and through an edit KubeRay applies in place; the slice check skips it."""
    parent = service()
    child = kuberays_token_rayservice(parent)
    ctl = setup(parent, child)
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    assert child_patches(ctl) == [] and token_secrets(ctl) == []
    assert rendering_condition(last_status(ctl)) is None
    assert slicereads.token_secret(child) == (False, None)
    bounds = service(generation=2, replicas={"min": 2, "max": 2})
    assert not rendering.new_cluster(child["spec"], render.rayservice(specs.parse_service(bounds))["spec"])
    ctl.parents[SVC]._put(bounds)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    assert patch["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    assert token_secrets(ctl) == []


def test_the_edit_that_starts_a_new_raycluster_names_the_token_secret_of_a_rayservice_without_one():
    """...and makes it at once, owned by the RayService; a reconcile before the patch's watch event
    sends the same name (drawn from the RayService's uid, not at random)."""
    tokens = RayTokens(b"k" * 32)
    child = kuberays_token_rayservice(service())
    edited = service(generation=2, image="example.com/ray-vllm-torchtpu:2.60.1")
    ctl = setup(edited, child, ray_tokens=tokens)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = child_patches(ctl)
    name = patch["spec"]["rayClusterConfig"]["authOptions"]["secretName"]
    assert re.fullmatch(r"qwen-ray-token-[0-9a-f]{6}", name) and name == later_ray_token_secret_name(child)
    assert token_secrets(ctl) == [name]
    secret = ctl.kube.objects[("secrets", "ml", name)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "rs-uid"
    assert secret["stringData"]["auth_token"] == tokens.token("ml", name)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"  # its watch event not yet here
    assert child_patches(ctl)[-1]["spec"]["rayClusterConfig"]["authOptions"]["secretName"] == name
    assert token_secrets(ctl) == [name]  # made once
    after = applied(child, patch)
    ctl.children[SVC]._put(ctl.children[SVC].slim(after))
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    assert slicereads.token_secret(after) == (True, name)


def test_a_token_secret_deleted_by_hand_is_made_again_once_its_pods_say_it_is_gone():
    """The operator may not read or watch Secrets, so it makes a child's token Secret once per
    process; a Secret deleted by hand would leave every new pod of the cluster (a slice the
    autoscaler adds, a replaced host, the next RayCluster) waiting in CreateContainerConfigError and
    KubeRay unable to call the head until an operator restart. A pod that says so brings it back,
    with the same token (derived, the key unchanged)."""
    tokens = RayTokens(b"k" * 32)
    ctl = setup(service(), None, ray_tokens=tokens)
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    made = ctl.kube.objects[("rayservices", "ml", "qwen")]
    name = secret_name_of(made)
    made["status"] = {"activeServiceStatus": {"rayClusterName": "qwen-raycluster-x7k2p"}}
    watched(ctl)

    def waiting_pod(version: str, missing: str) -> dict:
        waiting = {"reason": "CreateContainerConfigError", "message": f'secret "{missing}" not found'}
        return {"metadata": {"name": "qwen-raycluster-x7k2p-tpu-0", "namespace": "ml", "resourceVersion": version,
                             "labels": {"tputorch.io/service": "qwen", "ray.io/cluster": "qwen-raycluster-x7k2p",
                                        "ray.io/node-type": "worker"}},
                "status": {"phase": "Pending", "containerStatuses": [{"name": "ray-worker", "state": {"waiting": waiting}}]}}
    # another Secret's absence (the user's own, in the pod's env) is not this one's
    ctl.pods.remember(waiting_pod("1", "hf-token"))
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged" and token_secrets(ctl) == [name]  # made once
    first = ctl.kube.objects.pop(("secrets", "ml", name))  # deleted by hand
    ctl.pods._put(ctl.pods.slim(waiting_pod("2", name)))  # its watch event
    run(ctl.reconcile(SVC_KEY))
    assert token_secrets(ctl) == [name, name]
    assert ctl.kube.objects[("secrets", "ml", name)]["stringData"] == first["stringData"]
