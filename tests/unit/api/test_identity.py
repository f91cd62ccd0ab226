"""api/identity.py: every field that reaches Cloud Storage with the pods' identity is found, and every
example that reaches a bucket names the ServiceAccount the runbook binds (issue 55)."""

from pathlib import Path

import pytest
import yaml

from tputorch.api import identity

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


EXAMPLES = example_objects()


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


@pytest.mark.parametrize("name,doc", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_an_example_that_reaches_a_bucket_names_the_bound_account(name, doc):
    if identity.gcs_references(doc["spec"]):
        assert doc["spec"].get("serviceAccountName") == RUNBOOK_ACCOUNT, (
            f"{name}: reaches {identity.gcs_references(doc['spec'])[0]} as the namespace's default account")
        assert identity.missing_identity(doc["spec"]) is None


@pytest.mark.parametrize("spec", [
    {"env": "x", "checkpoint": [], "runtimeEnv": "gs://b/x", "model": "gs://b/m", "lora": 3, "volumes": {"gcs": 1}},
    {"env": [None, 3, {"value": 4}], "runtimeEnv": {"py_modules": "gs://b/m"}, "volumes": [None, {"gcs": "b"}]},
    {"entrypoint": 5, "serviceAccountName": ["x"]},
])
def test_a_spec_of_the_wrong_shape_is_read_without_a_crash(spec):
    """The parser refuses these with the field named; the identity check must only not crash on them."""
    assert identity.gcs_references(spec) == []
