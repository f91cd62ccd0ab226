"""`tputorch upgrade-plan` and `tputorch rerender` (cli/upgrades.py)."""

import copy
import json

from tputorch import render
from tputorch.render.names import SPEC_HASH_ANNOTATION
from tputorch.render.raytoken import with_ray_token_secret
from tputorch.render.service import rayservice_hash
from tputorch.api import spec as specs
from tputorch.cli import client, main, upgrades
from tputorch.render import stamp

from ..jobs import body as job_body
from ..services import service_body


def stamped(child, version="0.2.0", generation=1):
    """``child`` as an operator of ``version`` made it: its spec hash and stamp of what it has."""
    child = copy.deepcopy(child)
    if SPEC_HASH_ANNOTATION in (child["metadata"].get("annotations") or {}):
        child["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(child)
    child["metadata"]["annotations"] = {**(child["metadata"].get("annotations") or {}),
                                        **stamp.annotations(version, generation, "", stamp.rendering(child))}
    return child


def rayservice(parent):
    return render.rayservice(specs.parse_service(parent))


def test_a_service_rendered_as_this_version_would_changes_nothing():
    parent = service_body()
    row = upgrades.plan_row("TPUTorchService", parent, stamped(rayservice(parent), version=stamp.OPERATOR_VERSION))
    assert (row["change"], row["fields"], row["renderedBy"], row["generation"]) == ("none", [], stamp.OPERATOR_VERSION, "1")


def test_a_service_whose_cluster_would_change_is_a_new_raycluster_and_bounds_alone_are_in_place():
    parent = service_body()
    old = rayservice(parent)
    old["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "GONE", "value": "1"})
    row = upgrades.plan_row("TPUTorchService", parent, stamped(old))
    assert row["change"] == "new RayCluster" and row["renderedBy"] == "0.2.0"
    # 0.2.0's RayService names no token Secret: the edit that starts it a new RayCluster names one
    assert row["fields"] == ["spec.rayClusterConfig.authOptions.secretName",
                             "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].env"]
    bounds = rayservice(parent)
    bounds["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 9
    row = upgrades.plan_row("TPUTorchService", parent, stamped(bounds))
    assert row["change"] == "in place" and all("authOptions" not in f for f in row["fields"])


def test_a_services_token_secret_named_at_its_creation_is_no_change():
    parent = service_body()
    child = rayservice(parent)
    with_ray_token_secret(child, "qwen-ray-token-abc123")
    row = upgrades.plan_row("TPUTorchService", parent, stamped(child, version=stamp.OPERATOR_VERSION))
    assert (row["change"], row["fields"]) == ("none", [])
    child["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "GONE", "value": "1"})
    row = upgrades.plan_row("TPUTorchService", parent, stamped(child))
    assert row["fields"] == ["spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].env"]


def test_a_child_made_before_the_rule_is_compared_on_what_this_version_renders():
    parent = service_body()
    child = rayservice(parent)
    child["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    child["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["restartPolicy"] = "Always"  # KubeRay's default
    row = upgrades.plan_row("TPUTorchService", parent, child)
    assert (row["change"], row["renderedBy"]) == ("none", stamp.UNKNOWN_VERSION)


def test_a_job_changes_on_its_next_attempt_only_and_its_token_secret_is_no_change():
    parent = job_body()
    parent["metadata"]["namespace"] = "ml"
    child = render.rayjob(specs.parse(parent))
    with_ray_token_secret(child, "demo-ray-token-abc123")
    assert upgrades.plan_row("TPUTorchJob", parent, stamped(child))["change"] == "none"
    child["spec"]["entrypoint"] = "python old.py"
    assert upgrades.plan_row("TPUTorchJob", parent, stamped(child))["change"] == "next attempt"


def test_a_refused_spec_and_a_missing_child_are_said():
    parent = service_body()
    child = stamped(rayservice(parent))
    parent["spec"]["tpu"]["topology"] = "3x3"
    assert upgrades.plan_row("TPUTorchService", parent, child)["change"].startswith("refused: spec.tpu.topology")
    assert upgrades.plan_row("TPUTorchService", parent, None)["change"] == "no child"


class FakeApi:
    namespace = "ml"

    def __init__(self, services=(), jobs=()):
        self.objects = {client.SERVICE: list(services), client.JOB: list(jobs)}
        self.children = {}
        self.annotated = []

    def list(self, kind, namespace):
        return [o for o in self.objects[kind] if namespace in (None, o["metadata"]["namespace"])]

    def find(self, name, namespace):
        for kind in client.KINDS:
            for o in self.objects[kind]:
                if o["metadata"]["name"] == name and o["metadata"]["namespace"] == namespace:
                    return kind, o
        return None

    def child(self, kind, name, namespace):
        return self.children.get((kind.child_plural, namespace, name))

    def annotate(self, kind, name, namespace, annotations):
        self.annotated.append((kind.kind, namespace, name, annotations))


def run(monkeypatch, api, *argv):
    monkeypatch.setattr(upgrades, "_api", lambda a: api)
    return main.main(list(argv))


def test_rerender_annotates_the_named_services_or_all_and_refuses_a_job(monkeypatch, capsys):
    job = job_body()
    job["metadata"]["namespace"] = "ml"
    api = FakeApi([service_body("a"), service_body("b"), service_body("c", namespace="other")], [job])
    assert run(monkeypatch, api, "rerender", "a") == 0
    (kind, namespace, name, annotations), = api.annotated
    assert (kind, namespace, name) == ("TPUTorchService", "ml", "a") and set(annotations) == {stamp.RERENDER_ANNOTATION}
    api.annotated.clear()
    assert run(monkeypatch, api, "rerender", "--all") == 0
    assert [(n, m) for _, n, m, _ in api.annotated] == [("ml", "a"), ("ml", "b")]
    api.annotated.clear()
    assert run(monkeypatch, api, "rerender", "demo") == 1
    assert api.annotated == [] and "next attempt" in capsys.readouterr().err
    assert run(monkeypatch, api, "rerender") == 1  # neither names nor --all


def test_upgrade_plan_lists_every_object_with_its_child(monkeypatch, capsys):
    svc = service_body("a")
    api = FakeApi([svc])
    api.children[("rayservices", "ml", "a")] = stamped(rayservice(svc))
    assert run(monkeypatch, api, "upgrade-plan", "-o", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["operatorVersion"] == stamp.OPERATOR_VERSION
    assert [(r["name"], r["change"]) for r in out["items"]] == [("a", "none")]
    assert run(monkeypatch, api, "upgrade-plan") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["NAMESPACE", "NAME", "KIND", "RENDERED"]
    assert row.split() == ["ml", "a", "TPUTorchService", "0.2.0", "1", "none"]


def test_the_commands_are_guarded_against_api_errors():
    parser = main.build_parser()
    for name in ("upgrade-plan", "rerender"):
        sub = parser._subparsers._group_actions[0].choices[name]
        assert sub.get_default("func").__name__ == "run"  # submit._guarded
