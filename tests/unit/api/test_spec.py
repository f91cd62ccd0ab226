"""Every validation rule, its field path and its message; defaults; all errors at once."""

import pytest

from tputorch.api import spec

from ..jobs import body


def errors_of(obj):
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse(obj)
    return err.value.errors


def only_error(obj):
    errors = errors_of(obj)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def test_minimal_job_gets_the_documented_defaults():
    job = spec.parse(body())
    assert job.slice.topology == "4x4" and job.slice.hosts == 4
    assert job.chips_per_worker == 1 and job.workers == 16
    assert job.ray_version == "2.60.0"
    assert job.shutdown_after_job_finishes is True and job.suspend is False
    assert job.backoff_limit == 0
    assert (job.head.cpu, job.head.memory, job.worker.cpu, job.worker.memory) == ("2", "8Gi", "8", "32Gi")


def test_gke_label_form_of_the_accelerator_is_normalised():
    job = spec.parse(body(tpu={"accelerator": "tpu-v6e-slice"}))
    assert job.slice.generation.name == "v6e"


@pytest.mark.parametrize(
    "overrides,path,fragment",
    [
        ({"tpu": {"topology": "4x5"}}, "spec.tpu.topology", "allowed: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
        ({"tpu": {"accelerator": "v9"}}, "spec.tpu.accelerator", "must be one of"),
        ({"tpu": {"slices": 2}}, "spec.tpu.slices", "must be 1: a TPUTorchJob runs on one slice"),
        ({"tpu": {"chipsPerWorker": 3}}, "spec.tpu.chipsPerWorker", "must be one of 1, 2, 4, 8"),
        ({"tpu": {"chipsPerWorker": 8}}, "spec.tpu.chipsPerWorker", "must divide the 4 chips of each host"),
        ({"tpu": {"chipsPerHost": 8}}, "spec.tpu.chipsPerHost", "must be 4 for a v6e 4x4 slice"),
        ({"tpu": {"spot": True, "reservation": "r1"}}, "spec.tpu.reservation", "must not be set together with spec.tpu.spot"),
        ({"tpu": {"spot": "yes"}}, "spec.tpu.spot", "must be a boolean"),
        ({"tpu": {"topologgy": "4x4"}}, "spec.tpu.topologgy", "is not a known field"),
        ({"image": ""}, "spec.image", "must not be empty"),
        ({"image": 7}, "spec.image", "must be a string"),
        ({"entrypoint": "   "}, "spec.entrypoint", "must not be empty"),
        ({"rayVersion": "2.40.0"}, "spec.rayVersion", "must be 2.59.0 or newer"),
        ({"rayVersion": "latest"}, "spec.rayVersion", "must be a Ray release such as 2.60.0"),
        ({"env": [{"name": "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "value": "1"}]}, "spec.env[0].name", "switches Ray's per-worker chip isolation off"),
        ({"env": [{"name": "TPU_VISIBLE_CHIPS", "value": "0"}]}, "spec.env[0].name", "Ray sets it per worker"),
        ({"env": [{"name": "RAY_TPU_RESOURCE_PER_CHIP", "value": "2"}]}, "spec.env[0].name", "two workers share one chip"),
        ({"runtimeEnv": {"env_vars": {"RAY_TPU_RESOURCE_PER_CHIP": "2"}}}, "spec.runtimeEnv.env_vars.RAY_TPU_RESOURCE_PER_CHIP", "counts its Ray Train workers in chips"),
        ({"env": [{"name": "TPUTORCH_NUM_WORKERS", "value": "3"}]}, "spec.env[0].name", "must not start with TPUTORCH_"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env[1].name", "must be unique"),
        ({"env": [{"name": "1BAD", "value": "1"}]}, "spec.env[0].name", "C-style identifier"),
        ({"env": "A=1"}, "spec.env", "must be a list"),
        ({"runtimeEnv": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS": "1"}}}, "spec.runtimeEnv.env_vars.RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "chip isolation off"),
        ({"env": [{"name": "RAY_AUTH_MODE", "value": "disabled"}]}, "spec.env[0].name", "Ray token authentication"),
        ({"env": [{"name": "RAY_AUTH_TOKEN", "value": "known"}]}, "spec.env[0].name", "Ray token authentication"),
        ({"runtimeEnv": {"env_vars": {"RAY_AUTH_TOKEN_PATH": "/x"}}}, "spec.runtimeEnv.env_vars.RAY_AUTH_TOKEN_PATH", "Ray token authentication"),
        ({"runtimeEnv": {"env_vars": {"A": 1}}}, "spec.runtimeEnv.env_vars.A", "must map strings to strings"),
        ({"runtimeEnv": ["pip"]}, "spec.runtimeEnv", "must be an object"),
        ({"head": {"cpu": "lots"}}, "spec.head.cpu", "must be a Kubernetes quantity"),
        ({"worker": {"memory": "-1Gi"}}, "spec.worker.memory", "must be a Kubernetes quantity"),
        ({"worker": {"gpu": 1}}, "spec.worker.gpu", "is not a known field"),
        ({"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2"}}, "spec.nodeSelector.cloud.google.com/gke-tpu-topology", "derives it from spec.tpu"),
        ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "spec.tolerations[0].operator", "must be Exists or Equal"),
        ({"tolerations": ["a"]}, "spec.tolerations[0]", "must be an object"),
        ({"serviceAccountName": "Not_Valid"}, "spec.serviceAccountName", "DNS subdomain"),
        ({"queueName": "bad queue"}, "spec.queueName", "label value"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "must be at least 1"),
        ({"backoffLimit": -1}, "spec.backoffLimit", "must be between 0 and 100"),
        ({"backoffLimit": True}, "spec.backoffLimit", "must be an integer"),
        ({"ttlSecondsAfterFinished": 60, "shutdownAfterJobFinishes": False}, "spec.ttlSecondsAfterFinished", "unless spec.shutdownAfterJobFinishes is true"),
        ({"suspend": True, "shutdownAfterJobFinishes": False}, "spec.suspend", "unless spec.shutdownAfterJobFinishes is true"),
        ({"colour": "blue"}, "spec.colour", "is not a known field"),
    ],
)
def test_each_rule_names_field_value_and_what_is_allowed(overrides, path, fragment):
    err = only_error(body(**overrides))
    assert err.path == path
    assert fragment in err.message
    assert str(err).startswith(f"{path}: ")


@pytest.mark.parametrize(
    "name,ok",
    [("a" * 47, True), ("a" * 48, False), ("Upper", False), ("1abc", False), ("a-b-c", True), ("ends-", False)],
)
def test_name_is_a_dns1035_label_of_at_most_47(name, ok):
    if ok:
        assert spec.parse(body(name=name)).name == name
    else:
        err = only_error(body(name=name))
        assert err.path == "metadata.name" and "at most 47" in err.message


def test_all_errors_are_reported_at_once():
    bad = body(tpu={"topology": "3x3", "slices": 4}, image="", backoffLimit=-2, env=[{"name": "TPU_VISIBLE_CHIPS"}])
    paths = {e.path for e in errors_of(bad)}
    assert paths == {"spec.tpu.topology", "spec.tpu.slices", "spec.image", "spec.backoffLimit", "spec.env[0].name"}


def test_missing_required_fields():
    paths = {e.path for e in errors_of({"kind": "TPUTorchJob", "metadata": {"name": "x"}, "spec": {}})}
    assert paths == {"spec.tpu", "spec.image", "spec.entrypoint"}
    assert {e.path for e in errors_of({"metadata": {"name": "x"}})} == {"spec", "spec.tpu", "spec.image", "spec.entrypoint"}


@pytest.mark.parametrize("junk", [None, 3, "text", [], {"spec": "x"}, {"metadata": [], "spec": {"tpu": []}}])
def test_garbage_is_an_invalid_spec_not_a_crash(junk):
    with pytest.raises(spec.InvalidSpec):
        spec.parse(junk)


def test_ambiguous_2x4_chooses_single_host_unless_told():
    assert spec.parse(body(tpu={"topology": "2x4"})).slice.hosts == 1
    two = spec.parse(body(tpu={"topology": "2x4", "chipsPerHost": 4}))
    assert (two.slice.hosts, two.slice.chips_per_host) == (2, 4)


def test_chips_per_worker_sets_the_worker_count():
    job = spec.parse(body(tpu={"chipsPerWorker": 4}))
    assert job.workers == 4


def test_quantities_accept_integers_and_strings():
    job = spec.parse(body(worker={"cpu": 16, "memory": "64Gi"}))
    assert (job.worker.cpu, job.worker.memory) == ("16", "64Gi")
