"""The upgrade-diff check (issue 59): every example and every golden input rendered by the previous
release (hack/releases.tsv, its operator/ extracted from git) and by this checkout; each field that
changes inside KubeRay's cluster hash (a RayService's rayClusterConfig as each KubeRay version in
status/rendering.py's KUBERAY_UNHASHED hashes it, a RayJob's rayClusterSpec) or in a RayService's
serveConfigV2 (Serve redeploys the model) must be listed under "### Upgrade" in CHANGELOG.md's
entry for this version, and each field listed there must change. A running child keeps its
rendering until its parent's next edit (render/stamp.py): these are what that edit brings."""

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

import tputorch
from tputorch import tested_versions
from tputorch.status.rendering import KUBERAY_UNHASHED, differences, hashed_changes

from ..jobs import body
from ..previous import ROOT, previous as previous_release, release
from ..services import service_body
from .test_render import CASES, GOLDEN, SERVICE_CASES

RENDER = Path(__file__).with_name("render_bodies.py")
KINDS = ("TPUTorchJob", "TPUTorchService")


def golden_bodies() -> dict:
    """The inputs behind tests/unit/render/golden, as test_render.py renders them."""
    out = {f"golden {case}": body(name=case, **spec) for case, spec in CASES.items()}
    out.update({f"golden {case}": service_body(name=case.removeprefix("service-")[:47], **spec)
                for case, spec in SERVICE_CASES.items()})
    return out


def example_bodies() -> dict:
    """Every TPUTorchJob and TPUTorchService of examples/, with what the API server would add."""
    out = {}
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in KINDS:
                meta = doc.setdefault("metadata", {})
                meta.setdefault("namespace", "default")
                meta.setdefault("uid", "00000000-1111-2222-3333-444455556666")
                meta.setdefault("generation", 1)
                out[f"{path.relative_to(ROOT)} {meta['name']}"] = doc
    return out


def render(operator: Path, given: dict, script: Path = RENDER) -> dict:
    """``script``'s output (render_bodies.py's by default) on ``given`` with the tputorch of
    ``operator`` (a directory holding tputorch/)."""
    env = {**os.environ, "PYTHONPATH": str(operator)}
    done = subprocess.run([sys.executable, str(script)], input=json.dumps(given), env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"rendering with {operator} failed:\n{done.stderr[-4000:]}"
    out = json.loads(done.stdout)
    assert Path(out["tputorch"]).resolve().is_relative_to(operator.resolve()), (
        f"rendered with {out['tputorch']}, not the tputorch of {operator}")
    return out


@pytest.fixture(scope="module")
def previous():
    """(version, commit) of the release before this checkout's version."""
    return previous_release()


@pytest.fixture(scope="module")
def previous_operator(previous, tmp_path_factory) -> Path:
    """The previous release's operator/ directory, extracted from git."""
    version, commit = previous
    where = tmp_path_factory.mktemp(f"tputorch-{version}")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "operator"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    return where / "operator"


@pytest.fixture(scope="module")
def rendered(previous_operator):
    """{"bodies", "previous", "current"}: every body, and what each tree renders of them."""
    bodies = {**golden_bodies(), **example_bodies()}
    return {"bodies": bodies, "previous": render(previous_operator, bodies),
            "current": render(ROOT / "operator", bodies)}


def child_changes(old: dict, new: dict) -> list[str]:
    """The fields of KubeRay's cluster hash (under any KubeRay version known) and of the serve config
    that differ between two renderings of one body, as CHANGELOG.md names them (list items as [])."""
    if new["kind"] == "RayService":
        found = {f"RayService rayClusterConfig.{path}" for kuberay in KUBERAY_UNHASHED
                 for path in hashed_changes(old["spec"]["rayClusterConfig"], new["spec"]["rayClusterConfig"], kuberay)}
        found |= {f"RayService serveConfigV2.{path}" for path in differences(
            yaml.safe_load(old["spec"]["serveConfigV2"]), yaml.safe_load(new["spec"]["serveConfigV2"]))}
    else:
        found = {f"RayJob rayClusterSpec.{path}"
                 for path in differences(old["spec"]["rayClusterSpec"], new["spec"]["rayClusterSpec"])}
    return sorted({re.sub(r"\[\d+\]", "[]", path) for path in found})


def covers(listed: str, changed: str) -> bool:
    """Whether a field CHANGELOG.md lists is ``changed`` or holds it."""
    return changed == listed or changed.startswith((listed + ".", listed + "["))


def changes(rendered: dict) -> dict[str, list[str]]:
    """field -> the bodies whose rendering changes it; a body the previous release refuses can have
    no running child and is left out."""
    previous, current = rendered["previous"]["rendered"], rendered["current"]["rendered"]
    out = defaultdict(list)
    for key, new in current.items():
        if key in previous:
            for field in child_changes(previous[key], new):
                out[field].append(key)
    return dict(out)


def test_every_example_and_golden_input_is_rendered_by_both_releases(rendered):
    goldens = {p.stem for p in GOLDEN.glob("*.yaml")}
    assert {k.removeprefix("golden ") for k in rendered["bodies"] if k.startswith("golden ")} == goldens
    examples = [k for k in rendered["bodies"] if not k.startswith("golden ")]
    assert {k.split()[0] for k in examples} >= {"examples/v6e-4x4.yaml", "examples/serve/qwen3-moe-v6e-4x4.yaml"}
    assert rendered["current"]["refused"] == {}, "this version refuses an example or golden input"
    # the inputs of 0.2.0's goldens and examples are ones it renders: only what a later version added
    # (a new field) may be refused by an older one
    assert set(rendered["previous"]["rendered"]) | set(rendered["previous"]["refused"]) == set(rendered["bodies"])


def test_every_change_of_a_hashed_field_since_the_previous_release_is_in_the_changelog(previous, rendered):
    listed = release.upgrade_fields(ROOT, tputorch.__version__)
    missing = {field: keys for field, keys in changes(rendered).items() if not any(covers(f, field) for f in listed)}
    assert not missing, (
        f"CHANGELOG.md's [{tputorch.__version__}] \"### Upgrade\" does not list these fields, whose rendering changed "
        f"since {previous[0]} (commit {previous[1][:12]}); list each as `RayService <path>` / `RayJob <path>` with "
        f"what a running object keeps until its next edit and what that edit does:\n"
        + "\n".join(f"  {field}: changed for {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                    for field, keys in sorted(missing.items())))


def test_every_field_the_changelog_lists_changed_since_the_previous_release(previous, rendered):
    changed = changes(rendered)
    listed = release.upgrade_fields(ROOT, tputorch.__version__)
    stale = [f for f in listed if not any(covers(f, field) for field in changed)]
    assert not stale, (f"CHANGELOG.md's [{tputorch.__version__}] \"### Upgrade\" lists fields no example or golden "
                       f"input renders differently from {previous[0]}: {stale}")


def test_the_hash_rule_of_every_tested_kuberay_version_is_known():
    assert set(tested_versions.KUBERAY) <= set(KUBERAY_UNHASHED)


def _cluster(**worker):
    pod = {"containers": [{"name": "ray-worker", "env": [{"name": "A", "value": "1"}]}]}
    group = {"groupName": "tpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "template": {"spec": pod}}
    for key, value in worker.items():
        if key in ("tolerations", "schedulingGates", "containers"):
            pod[key] = value
        else:
            group[key] = value
    return {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}}, "workerGroupSpecs": [group]}


def test_the_checks_view_of_kuberays_hash():
    """What KubeRay leaves out of its hash counts as no change; a container's env does, as does
    Kueue's suspend before KubeRay 1.7.0."""
    base = _cluster()
    unhashed = _cluster(replicas=3, minReplicas=0, maxReplicas=4, scaleStrategy={"workersToDelete": ["w-1"]},
                        tolerations=[{"key": "k", "operator": "Exists"}], schedulingGates=[{"name": "kueue"}])
    for kuberay in KUBERAY_UNHASHED:
        assert hashed_changes(base, unhashed, kuberay) == []
        assert child_changes({"kind": "RayJob", "spec": {"rayClusterSpec": base}},
                             {"kind": "RayJob", "spec": {"rayClusterSpec": base}}) == []
    env = _cluster(containers=[{"name": "ray-worker", "env": [{"name": "A", "value": "2"}]}])
    service = lambda cluster, serve: {"kind": "RayService", "spec": {"rayClusterConfig": cluster,  # noqa: E731
                                                                     "serveConfigV2": serve}}
    assert child_changes(service(base, "applications: [{name: a, args: {x: 1}}]"),
                         service(env, "applications: [{name: a, args: {x: 2}}]")) == [
        "RayService rayClusterConfig.workerGroupSpecs[].template.spec.containers[].env[].value",
        "RayService serveConfigV2.applications[].args.x"]
    assert hashed_changes(base, {**base, "suspend": True}, "1.6.2") == ["suspend"]
    assert hashed_changes(base, {**base, "suspend": True}, "1.7.0") == []
    assert covers("RayService rayClusterConfig.workerGroupSpecs[].template.spec.containers[].env",
                  "RayService rayClusterConfig.workerGroupSpecs[].template.spec.containers[].env[].value")
    assert not covers("RayService rayClusterConfig.workerGroupSpecs[].template.spec.containers[].env",
                      "RayService rayClusterConfig.workerGroupSpecs[].template.spec.containers[].envFrom")
