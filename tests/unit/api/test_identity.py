"""api/identity.py: every field that reaches Cloud Storage with the pods' identity is found, and every
example that reaches a bucket names the ServiceAccount the runbook binds (issue 55)."""

import copy
from pathlib import Path

import pytest
import yaml

from tputorch import render
from tputorch.api import identity, spec
from tputorch.render.volumes import GCS_FUSE_DRIVER

ROOT = Path(__file__).resolve().parents[3]
KINDS = {"TPUTorchJob", "TPUTorchService"}
RUNBOOK_ACCOUNT = "ray-tpu"  # docs/tasks/bucket-access.md creates and binds it


def example_objects() -> list[tuple[str, dict]]:
    found = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in KINDS:
                found.append((f"{path.relative_to(ROOT)}:{doc['metadata']['name']}", doc))
    return found


def pod_specs(obj: object, path: str = "") -> list[tuple[str, dict]]:
    """(where, PodSpec) of every pod template under ``obj``."""
    found = []
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            found.append((path, obj))
        for key, value in obj.items():
            found += pod_specs(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += pod_specs(value, f"{path}[{i}]")
    return found


def account_problems(doc: dict) -> list[str]:
    """Where an example's pods would reach Cloud Storage as another identity than the account the
    runbook binds: its spec's serviceAccountName and, as GKE sees the identity (the pod template's
    ServiceAccount), every Ray pod of what it renders to (KubeRay's submitter only submits: it reaches
    no bucket). A plain object (the weights download Job) is checked by its own pod templates when it
    names gs:// or mounts a bucket through the GCS FUSE driver."""
    if doc.get("kind") in KINDS:
        if not identity.gcs_references(doc["spec"]):
            return []
        problems = [] if doc["spec"].get("serviceAccountName") == RUNBOOK_ACCOUNT else [
            f"spec.serviceAccountName is {doc['spec'].get('serviceAccountName')!r}, reaching "
            f"{identity.gcs_references(doc['spec'])[0]}"]
        pods = [(where, p) for where, p in pod_specs(render.render_any(spec.parse_any(doc)))
                if ".submitterPodTemplate" not in where]
        assert pods, "no Ray pod rendered"
    else:
        text = yaml.safe_dump(doc)
        if "gs://" not in text and GCS_FUSE_DRIVER not in text:
            return []
        problems, pods = [], pod_specs(doc)
    return problems + [f"the pods at {where} run as {p.get('serviceAccountName') or 'default'}"
                       for where, p in pods if p.get("serviceAccountName") != RUNBOOK_ACCOUNT]


def every_example_document() -> list[tuple[str, dict]]:
    return [(f"{path.relative_to(ROOT)}:{i}", doc) for path in sorted((ROOT / "examples").rglob("*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if isinstance(doc, dict)]


EXAMPLES = example_objects()
DOCUMENTS = every_example_document()


def test_every_field_that_reaches_a_bucket_is_found():
    spec = {
        "entrypoint": "python train.py --storage-path gs://b1/ckpt --epochs 2",
        "env": [{"name": "A", "value": "1"}, {"name": "OUT", "value": "gs://b2/out"}, {"name": "S", "valueFrom": {}}],
        "checkpoint": {"storagePath": "gs://b3/c"},
        "runtimeEnv": {"working_dir": "gs://b4/code.zip", "py_modules": ["gs://b5/m.zip", "/local"]},
        "model": {"source": "gs://b6/model"},
        "lora": {"path": "gs://b7/adapters"},
        "volumes": [{"name": "v", "gcs": {"bucket": "b8"}}, {"name": "e", "emptyDir": {}}],
    }
    assert identity.gcs_references(spec) == [
        ("spec.entrypoint", "gs://b1/ckpt"),
        ("spec.env[1] (OUT)", "gs://b2/out"),
        ("spec.checkpoint.storagePath", "gs://b3/c"),
        ("spec.runtimeEnv.working_dir", "gs://b4/code.zip"),
        ("spec.runtimeEnv.py_modules[0]", "gs://b5/m.zip"),
        ("spec.model.source", "gs://b6/model"),
        ("spec.lora.path", "gs://b7/adapters"),
        ("spec.volumes[0].gcs.bucket", "gs://b8"),
    ]


def test_no_bucket_no_warning_and_a_named_account_no_warning():
    assert identity.gcs_references({"entrypoint": "python t.py", "env": [{"name": "P", "value": "/tmp/x"}]}) == []
    assert identity.missing_identity({"entrypoint": "python t.py --storage-path /tmp/c"}) is None
    assert identity.missing_identity({"entrypoint": "x gs://b/c", "serviceAccountName": "ray-tpu"}) is None


def test_the_warning_names_the_field_the_value_and_the_fix():
    warning = identity.missing_identity({"checkpoint": {"storagePath": "gs://team-ckpt/run"},
                                         "runtimeEnv": {"working_dir": "gs://team-ckpt/code.zip"}})
    assert warning.startswith("spec.checkpoint.storagePath is gs://team-ckpt/run (and 1 more)")
    assert "spec.serviceAccountName is unset" in warning and "ray-tpu" in warning


def test_the_examples_reach_buckets():
    """The check below is not vacuous: the training, RL and serving examples do reach gs://."""
    reaching = [name for name, doc in EXAMPLES if identity.gcs_references(doc["spec"])]
    assert len(reaching) >= 8, reaching
    assert any(name.startswith("examples/serve/") for name in reaching)


@pytest.mark.parametrize("name,doc", DOCUMENTS, ids=[n for n, _ in DOCUMENTS])
def test_every_example_that_reaches_a_bucket_runs_its_pods_as_the_bound_account(name, doc):
    """Every document of every file under examples/, as the file has it (the download Job too): its
    spec and every Ray pod it renders to name the account the runbook binds."""
    assert account_problems(doc) == [], name
    if doc.get("kind") in KINDS and identity.gcs_references(doc["spec"]):
        assert identity.missing_identity(doc["spec"]) is None


def test_an_example_without_its_service_account_fails_the_check():
    """The check above can fail: each example that reaches a bucket, its serviceAccountName removed
    (from the spec, or from a plain object's pod templates), has a problem for its spec and each Ray pod."""
    reaching = [(name, doc) for name, doc in DOCUMENTS
                if doc.get("kind") in KINDS and identity.gcs_references(doc["spec"])
                or doc.get("kind") not in KINDS and any(p.get("serviceAccountName") for _, p in pod_specs(doc))]
    assert len(reaching) >= 9 and any(doc["kind"] == "Job" for _, doc in reaching), [n for n, _ in reaching]
    for name, doc in reaching:
        stripped = copy.deepcopy(doc)
        if doc["kind"] in KINDS:
            del stripped["spec"]["serviceAccountName"]
        for _, pod in pod_specs(stripped):
            pod.pop("serviceAccountName", None)
        problems = account_problems(stripped)
        assert problems and all(p.endswith("run as default") for p in problems[doc["kind"] in KINDS:]), (name, problems)
        if doc["kind"] in KINDS:
            assert problems[0].startswith("spec.serviceAccountName is None") and len(problems) >= 3, (name, problems)


@pytest.mark.parametrize("spec", [
    {"env": "x", "checkpoint": [], "runtimeEnv": "gs://b/x", "model": "gs://b/m", "lora": 3, "volumes": {"gcs": 1}},
    {"env": [None, 3, {"value": 4}], "runtimeEnv": {"py_modules": "gs://b/m"}, "volumes": [None, {"gcs": "b"}]},
    {"entrypoint": 5, "serviceAccountName": ["x"]},
])
def test_a_spec_of_the_wrong_shape_is_read_without_a_crash(spec):
    """The parser refuses these with the field named; the identity check must only not crash on them."""
    assert identity.gcs_references(spec) == []
