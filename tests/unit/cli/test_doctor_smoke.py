"""`tputorch doctor --smoke`'s pure parts: the probe's objects and the verdict on its RayJob."""

import io
import os
import pathlib
import subprocess
import sys

import pytest

from tputorch import train
from tputorch.render.network import NetworkPolicyConfig
from tputorch.render.raytoken import RAY_AUTH_TOKEN_KEY
from tputorch.api import network
from tputorch.cli.doctor import smoke, storage_probe
from tputorch.cli.doctor.result import FAIL, OK, UNKNOWN


def test_the_probe_is_the_operators_rayjob_with_no_tpu_host():
    policy = NetworkPolicyConfig("strict", (network.parse_peer_text("kuberay-system"),))
    rayjob, secret, policy_obj = smoke.smoke_objects("ns", "tputorch-smoke-1", "img", "tok", policy, "ray-sa")
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert [g["replicas"] for g in cluster["workerGroupSpecs"]] == [0]
    assert cluster["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}
    assert secret["stringData"] == {RAY_AUTH_TOKEN_KEY: "tok"}
    assert rayjob["spec"]["submissionMode"] == "K8sJobMode"
    assert cluster["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "ray-sa"
    dashboard = [r for r in policy_obj["spec"]["ingress"] if {"protocol": "TCP", "port": 8265} in r.get("ports", [])]
    assert dashboard and dashboard[0]["from"] == [policy.peers[0].selector()]  # strict: the peers only
    assert smoke.smoke_objects("ns", "n", "img", "tok", None)[2] is None


def status(**st):
    return {"status": st}


def test_verdicts():
    assert smoke.verdict(status(jobDeploymentStatus="Running", jobStatus="RUNNING"), 5, 60) is None
    (ok,) = smoke.verdict(status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"), 5, 60)
    assert ok.status == OK
    (unreachable,) = smoke.verdict(status(jobDeploymentStatus="Failed", reason="JobDeploymentStatusTransitionGracePeriodExceeded",
                                          message="..."), 40, 60)
    assert unreachable.status == FAIL and "KubeRay could not reach the Ray dashboard" in unreachable.message
    assert "networkPolicy.mode=open" in unreachable.fix
    (failed,) = smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED", message="exit 1"), 40, 60)
    assert failed.status == FAIL and "exit 1" in failed.message and "could not reach" not in failed.message
    (stuck,) = smoke.verdict(status(jobDeploymentStatus="Initializing", rayClusterStatus={"state": "ready"}), 61, 60)
    assert "could not reach the Ray dashboard" in stuck.message
    (late,) = smoke.verdict(status(jobDeploymentStatus="Running", jobStatus="RUNNING"), 61, 60)
    assert late.status == FAIL and "no outcome within 60 s" in late.message


# ---------------------------------------------------------------- --storage-path

STORAGE = smoke.Storage("gs://bucket/runs", "team-a/ray-tpu")
# Ray's message for an entrypoint that exited non-zero (its JobSupervisor), which KubeRay copies to the
# RayJob's status.message: the tail of the output, the probe's line in it.
RAY_FAILED = ("Job entrypoint command failed with exit code 3, last available logs (truncated to 20,000 chars):\n"
              "tputorch doctor smoke: ok\n{line}\n")


def by_check(results):
    return {r.check: r for r in results}


def test_the_storage_probe_job_is_the_operators_with_the_storage_path_in_its_env():
    rayjob, _, _ = smoke.smoke_objects("ns", "tputorch-smoke-1", "img", "tok", None, "ray-sa", "gs://bucket/runs")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": train.ENV_STORAGE_PATH, "value": "gs://bucket/runs"} in head["env"]
    assert rayjob["spec"]["entrypoint"] == smoke.python_command(smoke.RAY_PROBE, smoke.storage_statement())
    assert storage_probe.ENV_STORAGE_PATH == train.ENV_STORAGE_PATH
    assert smoke.smoke_objects("ns", "n", "img", "tok", None)[0]["spec"]["entrypoint"] == smoke.PROBE_ENTRYPOINT


def submitted(entrypoint: str, tmp_path) -> tuple[list[str], str]:
    """(the arguments `ray job submit` got, what else ran) when `entrypoint` goes through KubeRay
    1.6's K8sJobMode submitter line (GetK8sJobCommand in ray-operator/controllers/ray/common/job.go:
    the entrypoint spliced unquoted, the line run by `bash -c`), with `ray` and `python` recording
    shell functions in place of the commands."""
    args, ran = tmp_path / "args", tmp_path / "ran"
    stubs = (f'ray() {{ if [ "$2" = status ]; then return 1; fi; '
             f'if [ "$2" = submit ]; then printf "%s\\0" "$@" > {args}; fi; }}; '
             f'python() {{ echo "python $*" >> {ran}; }}; ')
    line = (f"if ! ray job status --address http://h:8265 id >/dev/null 2>&1 ; then ray job submit --address "
            f"http://h:8265 --no-wait --submission-id id -- {entrypoint} ; fi ; ray job logs --address http://h:8265 "
            "--follow id")
    subprocess.run(["bash", "-c", stubs + line], check=True, timeout=30)
    argv = args.read_bytes().decode().split("\0")[:-1]
    return argv[argv.index("--") + 1:], ran.read_text() if ran.exists() else ""


def test_the_whole_probe_reaches_ray_job_submit_as_one_command(tmp_path):
    """The storage probe runs in the Ray job, as the Ray probe does: once it was chained with `&&`,
    which KubeRay's submitter shell split, so it ran in the submitter pod and the job succeeded
    without it (seen on the real Ray head, tests/cluster/test_real_ray.py)."""
    for storage_path in (None, "gs://bucket/runs"):
        entrypoint = smoke.smoke_objects("ns", "n", "img", "tok", None, None, storage_path)[0]["spec"]["entrypoint"]
        argv, ran = submitted(entrypoint, tmp_path)
        assert ran == "", f"ran in the submitter pod: {ran}"
        assert argv[:2] == ["python", "-c"] and len(argv) == 3, argv
        assert argv[2].startswith(smoke.RAY_PROBE)
        assert (smoke.storage_statement() in argv[2]) == bool(storage_path)
    chained = smoke.PROBE_ENTRYPOINT + " && " + smoke.python_command(smoke.storage_statement())
    argv, ran = submitted(chained, tmp_path)
    assert ran.startswith("python -c import base64") and smoke.storage_statement() not in " ".join(argv)


@pytest.mark.parametrize("uri,problem", [
    ("gs://bucket/runs", None),
    ("file:///tmp/ckpt", None),
    ("/mnt/ckpt", "must be a URI such as gs://bucket/runs (a path on a volume is not probed"),
    ("gs://bucket/a b", "must be"),  # the job spec's own rule (no whitespace)
    ("", "must not be empty"),
])
def test_storage_path_problems_name_the_flag_and_the_value(uri, problem):
    got = smoke.storage_path_problem(uri)
    if problem is None:
        assert got is None
    else:
        assert got.startswith(f"--storage-path {uri!r}: ") and problem in got, got


def test_storage_verdicts():
    done = smoke.verdict(status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"), 5, 60, STORAGE)
    assert [(r.check, r.status) for r in done] == [("smoke", OK), ("smoke-storage", OK)]
    assert "gs://bucket/runs as ServiceAccount team-a/ray-tpu" in done[1].message

    line = ("tputorch-doctor-storage: could not write gs://bucket/runs/.tputorch-doctor-probe-1: OSError: "
            "google::cloud::Status(PERMISSION_DENIED: Permanent error, with a last message of caller does not have "
            "storage.objects.create access)")
    got = by_check(smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED",
                                        message=RAY_FAILED.format(line=line)), 40, 60, STORAGE))
    assert got["smoke"].status == OK  # the Ray job ran and KubeRay read its end: only the storage failed
    fail = got["smoke-storage"]
    assert fail.status == FAIL
    assert fail.message.startswith("smoke: could not write gs://bucket/runs/.tputorch-doctor-probe-1 as ServiceAccount "
                                   "team-a/ray-tpu: OSError: google::cloud::Status(PERMISSION_DENIED")
    assert "roles/storage.objectUser" in fail.fix and fail.doc == smoke.DOC_STORAGE

    remove = line.replace("could not write", "could not remove")
    got = by_check(smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED",
                                        message=RAY_FAILED.format(line=remove)), 40, 60, STORAGE))
    assert "objectCreator cannot delete" in got["smoke-storage"].fix and "delete the probe object" in got["smoke-storage"].fix

    # a failure before the storage probe: the smoke's own ✗, the storage not reached (?)
    got = by_check(smoke.verdict(status(jobDeploymentStatus="Failed", reason="JobDeploymentStatusTransitionGracePeriodExceeded",
                                        message="..."), 40, 60, STORAGE))
    assert "could not reach the Ray dashboard" in got["smoke"].message and got["smoke-storage"].status == UNKNOWN
    # a storage error text mentioning a refused connection is still the storage's, not the dashboard's
    refused = line.replace("PERMISSION_DENIED", "UNAVAILABLE: connection refused")
    got = by_check(smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED",
                                        message=RAY_FAILED.format(line=refused)), 40, 60, STORAGE))
    assert got["smoke"].status == OK and got["smoke-storage"].status == FAIL


class FakeFs:
    """A pyarrow-like filesystem that refuses one operation."""

    def __init__(self, refuse: str = "", corrupt: bool = False):
        self.refuse, self.corrupt, self.files, self.dirs = refuse, corrupt, {}, set()

    def _check(self, op):
        if op == self.refuse:
            raise PermissionError(f"{op} refused")

    def create_dir(self, path, recursive=True):
        self._check("create_dir")
        self.dirs.add(path)

    def open_output_stream(self, path):
        self._check("write")
        fs = self

        class Out(io.BytesIO):
            def close(self):
                fs.files[path] = self.getvalue()
                super().close()
        return Out()

    def open_input_stream(self, path):
        self._check("read")
        return io.BytesIO(b"other" if self.corrupt else self.files[path])

    def delete_file(self, path):
        self._check("delete")
        del self.files[path]


@pytest.mark.parametrize("refuse,step", [("create_dir", "create the directory"), ("write", "write"),
                                         ("read", "read back"), ("delete", "remove")])
def test_the_probe_names_the_step_that_failed(refuse, step):
    fs = FakeFs(refuse)
    got = storage_probe.probe("gs://b/runs/", "p", resolve=lambda uri: (fs, "b/runs/"))
    target = "gs://b/runs/" if step == "create the directory" else "gs://b/runs/p"
    assert got == (step, target, f"PermissionError: {refuse} refused")


def test_the_probe_leaves_no_object_and_checks_what_it_reads():
    fs = FakeFs()
    assert storage_probe.probe("gs://b/runs", "p", resolve=lambda uri: (fs, "b/runs")) is None
    assert fs.files == {} and fs.dirs == {"b/runs"}
    got = storage_probe.probe("gs://b/runs", "p", resolve=lambda uri: (FakeFs(corrupt=True), "b/runs"))
    assert got[0] == "read back" and "read 5 bytes" in got[2]


def run_entrypoint(storage_path: str) -> subprocess.CompletedProcess:
    """The storage part of the probe's entrypoint as the Ray job's shell runs it, here."""
    command = smoke.python_command(smoke.storage_statement())
    env = {**os.environ, storage_probe.ENV_STORAGE_PATH: storage_path,
           "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120)


def test_the_entrypoint_writes_reads_and_removes_through_pyarrow_on_a_local_path(tmp_path):
    """Through the real filesystem layer (Ray Train's, or pyarrow's), a file:// path: the same code
    as on gs://, whose own transport is not tested here."""
    done = run_entrypoint(f"file://{tmp_path}/ckpt")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"tputorch-doctor-storage: ok file://{tmp_path}/ckpt" in done.stdout
    assert (tmp_path / "ckpt").is_dir() and list((tmp_path / "ckpt").iterdir()) == []  # the object is removed

    (tmp_path / "file").write_text("not a directory")
    refused = run_entrypoint(f"file://{tmp_path}/file/ckpt")
    assert refused.returncode == storage_probe.FAILED_EXIT, refused.stdout + refused.stderr
    (got,) = smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED",
                                  message=RAY_FAILED.format(line=refused.stdout.strip())), 40, 60,
                           smoke.Storage(f"file://{tmp_path}/file/ckpt", "ns/default"))[1:]
    assert got.status == FAIL
    assert got.message.startswith(f"smoke: could not create the directory file://{tmp_path}/file/ckpt as "
                                  "ServiceAccount ns/default: "), got.message
