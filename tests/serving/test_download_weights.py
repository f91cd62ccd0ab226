"""examples/serve/download-weights.yaml, the one-off Job that fills a bucket with a model's weights,
run as its container would run: its own command and environment, against the fake Hub serving the
tiny model under the example's repo id, with the bucket's mount path on a local directory. The
first run fetches every byte of the repo once; a second run (a Job retry, or the Job run again)
fetches none; the files land where qwen3-moe-v6e-4x4-bucket.yaml reads them, on the volume that
service mounts, and load as a model from that path with the Hub out of reach. What is not run here:
GKE's Cloud Storage FUSE driver under the mount (its writes, and Workload Identity's token)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "operator"))

import fakehub  # noqa: E402
import tinymodel  # noqa: E402
from tputorch.api import spec  # noqa: E402
from tputorch.render.volumes import GCS_FUSE_DRIVER, fuse_owner_options  # noqa: E402

JOB = yaml.safe_load((ROOT / "examples" / "serve" / "download-weights.yaml").read_text())
SERVICE = yaml.safe_load((ROOT / "examples" / "serve" / "qwen3-moe-v6e-4x4-bucket.yaml").read_text())
POD = JOB["spec"]["template"]
CONTAINER = POD["spec"]["containers"][0]
HF = shutil.which("hf", path=str(Path(sys.executable).parent)) or shutil.which("hf")


def job_volume(name: str) -> tuple[dict, str]:
    """The Job's pod volume and where its container mounts it."""
    volume = next(v for v in POD["spec"]["volumes"] if v["name"] == name)
    mount = next(m for m in CONTAINER["volumeMounts"] if m["name"] == name)
    return volume, mount["mountPath"]


BUCKET_VOLUME, BUCKET_PATH = job_volume("models")
REPO_ID = CONTAINER["command"][CONTAINER["command"].index("download") + 1]
LOCAL_DIR = CONTAINER["command"][CONTAINER["command"].index("--local-dir") + 1]


def local(path: str, mounts: dict[str, Path]) -> str:
    """A container path with each mounted volume's path replaced by its local directory."""
    for mount_path, directory in mounts.items():
        if path == mount_path or path.startswith(mount_path + "/"):
            return str(directory) + path[len(mount_path):]
    return path


def run_job(hub: fakehub.FakeHub, mounts: dict[str, Path]) -> subprocess.CompletedProcess:
    """The Job's container command with its env (the token Secret's value made up), paths remapped."""
    env = fakehub.client_env(hub.url, "/nonexistent")
    for e in CONTAINER["env"]:
        env[e["name"]] = local(e["value"], mounts) if "value" in e else "hf_made_up_token"
    argv = [HF if CONTAINER["command"][0] == "hf" else CONTAINER["command"][0]]
    argv += [local(a, mounts) for a in CONTAINER["command"][1:]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tinymodel.make(tmp_path_factory.mktemp("tiny"))


def test_the_job_and_the_service_name_the_same_bucket_path():
    parsed = spec.parse_any(SERVICE)
    weights = next(v for v in parsed.volumes if v.source == "gcs" and parsed.model_source.startswith(v.mount_path + "/"))
    assert BUCKET_VOLUME["csi"]["driver"] == GCS_FUSE_DRIVER
    assert weights.bucket == BUCKET_VOLUME["csi"]["volumeAttributes"]["bucketName"]
    # the same object names: the service's path under its mount is the Job's under the Job's
    assert parsed.model_source[len(weights.mount_path):] == LOCAL_DIR[len(BUCKET_PATH):]
    assert weights.read_only and weights.file_cache is not None
    # the Job writes as the Ray image's user, with the owner options the operator gives its own pods
    options = BUCKET_VOLUME["csi"]["volumeAttributes"]["mountOptions"].split(",")
    wanted = fuse_owner_options(POD["spec"]["securityContext"], ())
    assert wanted and set(wanted) <= set(options), (wanted, options)
    assert POD["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"


@pytest.mark.skipif(HF is None, reason="huggingface_hub's hf command is not installed (pyproject's serve extra)")
def test_the_job_fills_the_bucket_once_and_a_rerun_fetches_nothing(model, tmp_path):
    bucket, scratch = tmp_path / "bucket", tmp_path / "scratch"
    bucket.mkdir()
    mounts = {BUCKET_PATH: bucket, job_volume("scratch")[1]: scratch}
    with fakehub.FakeHub({REPO_ID: model}) as hub:
        first = run_job(hub, mounts)
        assert first.returncode == 0, first.stderr[-3000:]
        sizes = hub.file_sizes(REPO_ID)
        assert any(k.endswith(".safetensors") for k in sizes)
        assert hub.full_bytes() == sizes, "every file of the repo, each byte sent once"
        assert hub.range_bytes() == {}
        target = Path(local(LOCAL_DIR, mounts))
        for name, size in sizes.items():
            assert (target / name.removeprefix(REPO_ID + "/")).stat().st_size == size
        sent = hub.bytes_sent()
        second = run_job(hub, mounts)
        assert second.returncode == 0, second.stderr[-3000:]
        assert hub.bytes_sent() == sent, "the rerun fetched file content again"
    # the Job's huggingface_hub cache stayed on its scratch volume: nothing but the repo's files and
    # hf's own download metadata (.cache/huggingface under the local dir) is in the bucket
    in_bucket = {p.relative_to(target).parts[0] for p in target.rglob("*") if p.is_file()}
    assert in_bucket <= {n.removeprefix(REPO_ID + "/").split("/")[0] for n in sizes} | {".cache"}
    assert not any(bucket.glob("*/*/hub")) and not (bucket / "huggingface").exists()

    # what the engine reads from that path (Ray Serve LLM's AutoConfig, vLLM's tokenizer), offline
    code = ("import json, sys; from transformers import AutoConfig, AutoTokenizer\n"
            "c = AutoConfig.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "print(json.dumps({'arch': c.architectures, 'ids': t('hello')['input_ids']}))")
    env = {**fakehub.client_env("http://127.0.0.1:9", tmp_path / "empty-home"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(target)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["arch"] == json.loads((model / "config.json").read_text())["architectures"] and loaded["ids"]
    assert not os.path.exists(tmp_path / "empty-home" / "hub")
