"""Issue 55: Workload Identity where the local chain touches Cloud Storage. Each simulated pod gets a
token for its own Kubernetes ServiceAccount from a metadata server of its own (fakegcs.py), and the
stand-in GCS enforces the bucket policy docs/tasks/bucket-access.md writes (roles/storage.objectUser
and roles/storage.legacyBucketReader on the principal of ServiceAccount ray-tpu): the namespace's
`default` account is refused with GCS's 403 and ray-tpu is served, on every path that is cheap here:

- Ray Train's checkpoints to a gs:// storage path: Ray Train's own StorageContext (what a
  TorchTrainer's controller and workers persist checkpoints with: the validation marker, folder
  markers, the files by resumable upload, a restore, an old checkpoint deleted) over pyarrow's
  GcsFileSystem (google-cloud-cpp), and `tputorch doctor --smoke --storage-path`'s probe
  (storage_probe.py, as its Ray job runs it, and the verdict the CLI makes of its line);
- google-cloud-storage, as the Run:ai streamer's Python half builds its client (its own
  files._create_client, glob and pull_files), as a writer uploads (resumable, in chunks), and as
  Ray's runtime_env fetches a gs:// runtimeEnv.working_dir on each node (its own
  download_and_unpack_package, through smart_open);
- a pod template rendered from an example: its serviceAccountName is the identity.

The pyarrow and google-cloud-storage clients run in subprocesses (they read their endpoints from the
environment); google-cloud-storage and smart_open are in the serving venv only
(hack/vllm-cpu/install.sh). Not here: the streamer's C++ reader (anonymous under an emulator
endpoint: docs/tasks/storage.md), the weights download Job (GCS FUSE: GKE's driver), and a whole
TorchTrainer run or RayJob with these identities (a Ray head per identity)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import fakegcs  # noqa: E402
from tputorch import render  # noqa: E402
from tputorch.api import identity, spec  # noqa: E402
from tputorch.cli.doctor import smoke, storage_probe  # noqa: E402

NS, BOUND = "ml", identity.RUNBOOK_ACCOUNT
RUNBOOK_POLICY = {role: [fakegcs.principal(NS, BOUND)] for role in fakegcs.RUNBOOK_WRITER_ROLES}

# Ray Train's storage layer as a TorchTrainer run uses it (Ray 2.60, Train v2), then the doctor's probe.
# What each step of a client script answered: its value, or its error (an HTTP error's status too).
STEPS = r"""
import json
out = {}
def step(name, fn):
    try:
        out[name] = fn()
    except Exception as err:
        response = getattr(err, "response", None)
        out[name] = {"error": type(err).__name__, "status": getattr(err, "code", None) or getattr(response, "status_code", None),
                     "message": " ".join((getattr(err, "message", None) or getattr(response, "text", None) or str(err)).split())[:600]}
"""

RAY_TRAIN = STEPS + r"""
import os, sys, tempfile
from pathlib import Path
from ray.train import Checkpoint
from ray.train.v2._internal.execution.storage import StorageContext, delete_fs_path

local = Path(tempfile.mkdtemp())
(local / "model.pt").write_bytes(os.urandom(300_000))  # more than one 256 KiB chunk of a resumable upload
(local / "optim").mkdir()
(local / "optim" / "state.pt").write_bytes(b"s" * 1000)

def train():
    storage = StorageContext(storage_path=os.environ["TPUTORCH_STORAGE_PATH"], experiment_dir_name="ddp")
    paths = [storage.persist_current_checkpoint(Checkpoint.from_directory(str(local)), f"checkpoint_00000{i}").path
             for i in range(2)]
    back = Path(Checkpoint(path=paths[-1], filesystem=storage.storage_filesystem).to_directory(tempfile.mkdtemp()))
    delete_fs_path(storage.storage_filesystem, paths[0])  # num_to_keep=1: the older one goes
    return {"persisted": paths, "restored": sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()),
            "same": (back / "model.pt").read_bytes() == (local / "model.pt").read_bytes()}

step("train", train)
print("RESULT " + json.dumps(out), flush=True)
sys.path.insert(0, sys.argv[1])
import storage_probe
storage_probe.main()  # prints its own line, as in the doctor's Ray job
"""

# The Run:ai streamer's Python half (its own client and calls), a resumable upload with that client,
# and a runtimeEnv.working_dir on gs:// fetched as Ray's runtime_env agent fetches it on every node.
PYTHON_CLIENTS = STEPS + r"""
import asyncio, os, tempfile
from runai_model_streamer_gcs.files import files
from ray._private.runtime_env.packaging import download_and_unpack_package
client = files._create_client()
bucket = client.bucket("models")
def upload():
    blob = bucket.blob("tiny/model.safetensors")
    with blob.open("wb", chunk_size=256 * 1024) as f:  # a resumable upload, in 256 KiB chunks
        f.write(b"w" * 700_000)
    small = bucket.blob("tiny/config.json")
    small.upload_from_string(b'{"model_type": "tiny"}')  # a multipart upload
    return sorted(b.name for b in client.list_blobs("models", prefix="tiny/"))
step("upload", upload)
step("glob", lambda: files.glob("gs://models/tiny"))
dst = tempfile.mkdtemp()
step("pull", lambda: (files.pull_files("gs://models/tiny", dst, allow_pattern=["*.json"]), sorted(os.listdir(dst)))[1])
def working_dir():
    unpacked = asyncio.run(download_and_unpack_package("gs://models/tputorch/tputorch.zip", tempfile.mkdtemp()))
    return sorted(str(p.relative_to(unpacked)) for p in __import__("pathlib").Path(unpacked).rglob("*.py"))
step("working_dir", working_dir)
print("RESULT " + json.dumps(out))
"""


def run_as(gcs: fakegcs.FakeGcs, ksa: str, python: str, code: str, *args: str, **env: str) -> tuple[dict, str]:
    """Runs `code` as a pod of ServiceAccount NS/ksa would: no key file, no gcloud config, Google's
    clients pointed at that identity's metadata server and at the stand-in storage."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GOOGLE_", "GCE_", "CLOUD_STORAGE", "STORAGE_EMULATOR", "API_ENDPOINT", "CLOUDSDK_"))}
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=180,
                         env={**base, "HOME": "/nonexistent", **gcs.pod_env(NS, ksa), **env})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode in (0, storage_probe.FAILED_EXIT) and lines, out.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), out.stdout


def denied(principal: str, permission: str, resource: str) -> str:
    return (f"{principal} does not have {permission} access to the Google Cloud Storage {resource}. "
            f"Permission '{permission}' denied on resource (or it may not exist).")


def test_ray_train_checkpoints_and_the_doctors_probe_need_the_bound_account(tmp_path):
    uri = "gs://ckpt/tputorch/checkpoints"
    creator = fakegcs.principal(NS, "creator")
    policy = {"ckpt": {"roles/storage.objectUser": [fakegcs.principal(NS, BOUND)], "roles/storage.objectCreator": [creator],
                       "roles/storage.legacyBucketReader": [fakegcs.principal(NS, BOUND), creator]}}
    probe_dir = str(Path(storage_probe.__file__).parent)
    with fakegcs.FakeGcs({"ckpt": tmp_path}, policy=policy) as gcs:
        seen = {ksa: run_as(gcs, ksa, sys.executable, RAY_TRAIN, probe_dir, TPUTORCH_STORAGE_PATH=uri)
                for ksa in (BOUND, "default", "creator")}
        stored = sorted(gcs.buckets["ckpt"])
        log = gcs.log()

    train, said = seen[BOUND]
    assert train["train"] == {"persisted": ["ckpt/tputorch/checkpoints/ddp/checkpoint_000000",
                                            "ckpt/tputorch/checkpoints/ddp/checkpoint_000001"],
                              "restored": ["model.pt", "optim/state.pt"], "same": True}, train
    assert f"{storage_probe.MARK} ok {uri}" in said
    base = "tputorch/checkpoints/ddp/"
    assert [n for n in stored if n.startswith(base)] == [
        base, base + ".validate_storage_marker", base + "checkpoint_000001/", base + "checkpoint_000001/model.pt",
        base + "checkpoint_000001/optim/", base + "checkpoint_000001/optim/state.pt"], stored
    ours = [r for r in log if r["caller"] == fakegcs.principal(NS, BOUND)]
    # The probe removed its object; objectCreator's probe (below) could not, and left it, as the doctor says.
    assert [r["status"] for r in ours if r["method"] == "DELETE" and "tputorch-doctor-probe" in r["path"]] == [204], ours
    assert len([n for n in stored if "tputorch-doctor-probe" in n]) == 1, stored
    chunked = [r for r in ours if r["method"] == "PUT" and r["status"] == 308]
    assert chunked and any("uploadType=resumable" in r["query"] for r in ours if r["method"] == "POST"), ours

    # The namespace's default account: refused at the storage path's first step, with GCS's 403.
    train, said = seen["default"]
    refusal = denied(fakegcs.principal(NS, "default"), "storage.buckets.get", "bucket")
    assert train["train"]["error"] == "PermissionError" and refusal in train["train"]["message"], train
    failure = smoke.storage_failure(said)
    assert failure and failure[:2] == ("create the directory", uri) and refusal in failure[2], said
    verdict = smoke.storage_failed(smoke.Storage(uri, f"{NS}/default"), *failure)
    assert "roles/storage.objectUser" in verdict.fix and "legacyBucketReader" in verdict.fix, verdict
    # objectCreator (with the bucket's metadata) writes, but cannot read a checkpoint back.
    failure = smoke.storage_failure(seen["creator"][1])
    assert failure and failure[0] == "read back" and denied(creator, "storage.objects.get", "object") in failure[2], seen["creator"]
    refused = {r["status"] for r in log if r["caller"] == fakegcs.principal(NS, "default")}
    assert refused == {403}, refused


def test_the_python_clients_need_the_bound_account(tmp_path):
    """google-cloud-storage as the streamer builds it (google-auth's default credentials) and as
    smart_open under Ray's working_dir download builds it (a bare Client()): both carry the pod's token."""
    sys.path.insert(0, str(HERE.parent / "cluster"))
    import serving_chain

    try:
        python = serving_chain.serving_python()
    except serving_chain.ChainError as exc:
        pytest.fail(str(exc))
    (tmp_path / "tputorch").mkdir()
    with zipfile.ZipFile(tmp_path / "tputorch" / "tputorch.zip", "w") as archive:  # as the ddp example says to make it
        archive.writestr("tputorch/examples/ddp/train_ddp.py", "print('ddp')\n")
    with fakegcs.FakeGcs({"models": tmp_path}, policy={"models": RUNBOOK_POLICY}) as gcs:
        served, _ = run_as(gcs, BOUND, python, PYTHON_CLIENTS)
        refused, _ = run_as(gcs, "default", python, PYTHON_CLIENTS)
        data = gcs.buckets["models"]["tiny/model.safetensors"].data
        log = gcs.log()
    assert served == {"upload": ["tiny/config.json", "tiny/model.safetensors"],
                      "glob": ["gs://models/tiny/config.json", "gs://models/tiny/model.safetensors"],
                      "pull": ["config.json"], "working_dir": ["examples/ddp/train_ddp.py"]}, served
    assert data == b"w" * 700_000
    session = [r for r in log if r["method"] == "PUT" and "uploadType=resumable" in r["query"]]
    assert [r["status"] for r in session] == [308, 308, 200] and [r["sent"] for r in session] == [262144, 262144, 175712], session
    default = fakegcs.principal(NS, "default")
    assert refused["upload"]["status"] == 403 and denied(default, "storage.objects.create", "object") in refused["upload"]["message"], refused
    for step in ("glob", "pull"):  # the streamer asks for the bucket first
        assert refused[step]["status"] == 403 and denied(default, "storage.buckets.get", "bucket") in refused[step]["message"], refused
    assert refused["working_dir"]["status"] == 403 and denied(default, "storage.objects.get", "object") in refused["working_dir"]["message"], refused
    assert {r["caller"] for r in log if r["path"].startswith(("/storage/", "/download/", "/upload/"))} == {
        fakegcs.principal(NS, BOUND), default}, "a call went without the pod's token"


def call(url: str, method: str = "GET", headers: dict | None = None, data: bytes | None = None) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers or {}, method=method), timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def token_of(env: dict) -> str:
    """What a Google client of a pod with this environment gets from its metadata server."""
    status, body, _ = call(f"http://{env['GCE_METADATA_HOST']}/computeMetadata/v1/instance/service-accounts/default/token",
                           headers={"Metadata-Flavor": "Google"})
    assert status == 200, body
    return json.loads(body)["access_token"]


def test_an_examples_pod_template_is_its_identity(tmp_path):
    """The ddp example rendered: its pods' serviceAccountName (ray-tpu) is served under the runbook's
    policy; the same job without it runs as the namespace's default account and is refused."""
    body = yaml.safe_load((REPO / "examples" / "ddp" / "tputorchjob.yaml").read_text())
    body["metadata"].update(namespace=NS, uid="u", generation=1)
    bucket = body["spec"]["runtimeEnv"]["working_dir"].removeprefix("gs://").split("/")[0]
    without = json.loads(json.dumps(body))
    del without["spec"]["serviceAccountName"]

    def templates(job: dict) -> list[dict]:
        cluster = render.render_any(spec.parse_any(job))["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]

    with fakegcs.FakeGcs({bucket: tmp_path}, policy={bucket: RUNBOOK_POLICY}) as gcs:
        upload = f"{gcs.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name=tputorch/checkpoints/x"
        for template in templates(body):
            assert fakegcs.pod_service_account(template) == BOUND
            auth = {"Authorization": f"Bearer {token_of(gcs.template_env(NS, template))}"}
            assert call(upload, "POST", auth, b"ok")[0] == 200
            assert call(f"{gcs.url}/storage/v1/b/{bucket}", headers=auth)[0] == 200
        for template in templates(without):
            assert fakegcs.pod_service_account(template) == "default"
            status, answer, headers = call(upload, "POST", {"Authorization": f"Bearer {token_of(gcs.template_env(NS, template))}"}, b"no")
            message = denied(fakegcs.principal(NS, "default"), "storage.objects.create", "object")
            assert (status, headers["Content-Type"], json.loads(answer)) == (403, "application/json", {"error": {
                "code": 403, "message": message, "errors": [{"message": message, "domain": "global", "reason": "forbidden"}]}})


def test_the_policy_grants_what_each_role_grants_and_nothing_else(tmp_path):
    """Each role's permissions as GCS checks them, over the JSON API directly: objectViewer reads and
    lists, objectCreator creates (not over an existing object, which needs storage.objects.delete),
    objectUser also deletes; none reads the bucket's own resource; no token is a 401, a token nobody
    issued a 401, an identity outside the policy a 403; ifGenerationMatch=0 keeps an object."""
    (tmp_path / "a").write_bytes(b"A")
    member = {ksa: fakegcs.principal(NS, ksa) for ksa in ("viewer", "creator", "user")}
    policy = {"b": {"roles/storage.objectViewer": [member["viewer"]], "roles/storage.objectCreator": [member["creator"]],
                    "roles/storage.objectUser": [member["user"]]}}
    with fakegcs.FakeGcs({"b": tmp_path}, policy=policy) as gcs:
        auth = {ksa: {"Authorization": f"Bearer {token_of(gcs.pod_env(NS, ksa))}"} for ksa in (*member, "other")}
        o = f"{gcs.url}/storage/v1/b/b/o"
        up = f"{gcs.url}/upload/storage/v1/b/b/o?uploadType=media&name="

        def status(ksa: str | None, url: str, method: str = "GET", data: bytes | None = None) -> int:
            return call(url, method, auth[ksa] if ksa else {}, data)[0]

        assert [status(k, f"{o}/a?alt=media") for k in ("viewer", "creator", "user", "other", None)] == [200, 403, 200, 403, 401]
        assert [status(k, o) for k in ("viewer", "creator", "user")] == [200, 403, 200]
        assert [status(k, f"{gcs.url}/storage/v1/b/b") for k in ("viewer", "user")] == [403, 403]
        assert [status(k, up + "n", "POST", b"1") for k in ("viewer", "creator")] == [403, 200]
        assert status("creator", up + "n", "POST", b"2") == 403  # a replacement needs storage.objects.delete
        assert status("user", up + "n", "POST", b"3") == 200 and gcs.buckets["b"]["n"].generation == 2
        assert status("user", up + "n&ifGenerationMatch=0", "POST", b"4") == 412 and gcs.buckets["b"]["n"].data == b"3"
        assert [status(k, f"{o}/n", "DELETE") for k in ("creator", "user")] == [403, 204]
        assert call(f"{o}/a", headers={"Authorization": "Bearer ya29.nobody"})[0] == 401
        # A pod's metadata server answers for its identity alone, and wants Metadata-Flavor.
        host = gcs.pod_env(NS, "viewer")["GCE_METADATA_HOST"]
        assert call(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token")[0] == 403
        status_, body, _ = call(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/?recursive=true",
                                headers={"Metadata-Flavor": "Google"})
        assert status_ == 200 and json.loads(body)["email"] == fakegcs.POOL
        assert gcs.pod_env(NS, "viewer") == gcs.pod_env(NS, "viewer") != gcs.pod_env(NS, "user")


def test_a_resumable_session_takes_chunks_and_answers_what_it_holds(tmp_path):
    """The session protocol both clients speak: the URI in Location, 308 with the Range held after
    each chunk (and for `bytes */*`), the object on the last chunk; the session URI is the grant."""
    with fakegcs.FakeGcs({"b": tmp_path}, policy={"b": RUNBOOK_POLICY}) as gcs:
        auth = {"Authorization": f"Bearer {token_of(gcs.pod_env(NS, BOUND))}", "Content-Type": "application/json"}
        status, _, headers = call(f"{gcs.url}/upload/storage/v1/b/b/o?uploadType=resumable", "POST", auth,
                                  json.dumps({"name": "r/obj", "metadata": {"k": "v"}}).encode())
        session = headers["Location"]
        assert status == 200 and session.startswith(gcs.url + "/upload/")
        put = [call(session, "PUT", {"Content-Range": "bytes 0-2/*"}, b"abc"),
               call(session, "PUT", {"Content-Range": "bytes */*"}, b""),
               call(session, "PUT", {"Content-Range": "bytes 3-4/5"}, b"de")]
        assert [(s, h.get("Range")) for s, _, h in put] == [(308, "bytes=0-2"), (308, "bytes=0-2"), (200, None)]
        resource = json.loads(put[-1][1])
        assert (resource["name"], resource["size"], resource["metadata"]) == ("r/obj", "5", {"k": "v"})
        assert gcs.buckets["b"]["r/obj"].data == b"abcde"
