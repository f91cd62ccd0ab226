"""A running job's training progress in its status, on the local cluster with the stand-in Ray
dashboard: the operator reads the job's driver log tail from its Ray head's dashboard (reached
through the stand-in, as KubeRay reaches it) and shows what tputorch.train.report() printed there
in status.progress, status.lastCheckpoint, `kubectl get` (the Step and Loss columns) and
`tputorch describe`. The real Ray chain's version is in test_real_ray.py."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import yaml

from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixtures)

from tputorch.train import progress_line

WORKER = "(RayTrainWorker pid=4242, ip=10.0.0.7) "
GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"


def apply_job(kube, ns: str, name: str) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                     "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                     "worker": {"cpu": "4", "memory": "16Gi"}}}
    kubectl(kube.kubeconfig, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))


def job_status(kube, ns: str, name: str) -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def wait_phase(kube, ns: str, name: str, phase: str, timeout: float) -> dict:
    return kube.wait(lambda: (lambda s: s if s.get("phase") == phase else None)(job_status(kube, ns, name)),
                     timeout, f"TPUTorchJob {ns}/{name} phase {phase}")


def reported(step: int, loss: float, checkpoint: str | None = None) -> str:
    return WORKER + progress_line({"loss": loss, "epoch": 0}, step=step, checkpoint=checkpoint)


def wait_step(kube, ns: str, name: str, step: int) -> dict:
    return kube.wait(lambda: (lambda s: s if (s.get("progress") or {}).get("step") == step else None)(
        job_status(kube, ns, name)), 90, f"{ns}/{name} status.progress.step {step}")


def describe(kube, ns: str, name: str) -> str:
    env = {**os.environ, "KUBECONFIG": kube.kubeconfig}
    return subprocess.run([sys.executable, "-m", "tputorch", "describe", name, "-n", ns], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout


def test_a_running_jobs_reports_reach_its_status_get_and_describe(kube, namespace, dashboard, tputorch_crd, tmp_path):
    ns, name = namespace, "reports"
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [ns], dashboard_url=dashboard.url,
                         extra_args=["--progress-interval", "1"]).start()
    try:
        apply_job(kube, ns, name)
        wait_phase(kube, ns, name, "Running", 180)
        # KubeRay says Running when it has made the submitter, a moment before it first asks the head
        kube.wait(lambda: dashboard.get_job(ns, name), 60, "KubeRay's first call for the Ray job")
        dashboard.add_job_log(ns, name, ["Running entrypoint for job ...", reported(10, 2.5, "gs://ckpt/reports/checkpoint_000000")])
        st = wait_step(kube, ns, name, 10)
        assert st["progress"]["metrics"] == {"loss": 2.5} and st["lastCheckpoint"] == "gs://ckpt/reports/checkpoint_000000"

        # later reports, then lines the operator must not take: a forged one, a broken one
        dashboard.add_job_log(ns, name, [reported(20, 1.25), "Training iteration done", reported(30, 0.625),
                                         "tputorch.progress {\"step\": \"999\"}", "tputorch.progress {broken"])
        st = wait_step(kube, ns, name, 30)
        assert st["progress"]["metrics"]["loss"] == 0.625
        assert st["lastCheckpoint"] == "gs://ckpt/reports/checkpoint_000000", "kept: no newer checkpoint reported"
        header, row = kubectl(kube.kubeconfig, "get", "-n", ns, "tputorchjob", name, "-o", "wide").stdout.splitlines()
        column = lambda title: row[header.index(title):].split()[0]  # noqa: E731  (left-aligned columns)
        assert (column("PHASE"), column("STEP"), column("LOSS")) == ("Running", "30", "0.625"), (header, row)
        text = describe(kube, ns, name)
        assert "Progress:    step 30, epoch 0, loss 0.625" in text and "Checkpoint:  gs://ckpt/reports/checkpoint_000000" in text

        # what the operator asked: the job's info for its driver's node, then that node's log tail
        asked = [(r["path"], r["query"]) for r in dashboard.requests(namespace=ns) if r["path"].startswith("/api/v0/logs/")]
        job = dashboard.get_job(ns, name)
        assert asked and all(p == "/api/v0/logs/file" and f"submission_id={job['submission_id']}" in q and "node_id=" in q
                             for p, q in asked), asked

        dashboard.set_job_status(ns, name, "SUCCEEDED")
        st = wait_phase(kube, ns, name, "Succeeded", 180)
        assert st["progress"]["step"] == 30, "the last progress read stays when the job ends"
    finally:
        op.stop()
    assert "Traceback" not in op.log(), op.log()[-5000:]


def test_a_key_rotation_keeps_the_progress_reads_of_jobs_made_before_it(kube, namespace, dashboard, tputorch_crd, tmp_path):
    """Key A, then A kept as the previous key beside a new B, then B alone (docs/tasks/rotate-token-key.md's
    rotation): the job made under A keeps its reads while A is the previous key, the job made after
    gets a token of B, and removing A breaks nothing made under B. The stand-in dashboard checks
    every call's token as a real head (401/403)."""
    import secrets as random

    from tputorch.controller.raytoken import RayTokens

    ns = namespace
    old, new = tmp_path / "key-a", tmp_path / "key-b"
    old.write_text(random.token_hex(32))
    new.write_text(random.token_hex(32))

    def operator(key, previous=None, log="operator.log"):
        args = ["--progress-interval", "1", "--ray-token-key-file", str(key)]  # the last flag given wins
        if previous:
            args += ["--ray-token-previous-key-file", str(previous)]
        return OperatorProcess(kube.kubeconfig, tmp_path / log, [ns], dashboard_url=dashboard.url, extra_args=args).start()

    def running_with_report(name, step):
        apply_job(kube, ns, name)
        wait_phase(kube, ns, name, "Running", 180)
        kube.wait(lambda: dashboard.get_job(ns, name), 60, "KubeRay's first call for the Ray job")
        dashboard.add_job_log(ns, name, [reported(step, 1.0)])
        wait_step(kube, ns, name, step)

    def token_secret(name):
        rayjob = kube.custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayjobs",
                                                           label_selector=f"tputorch.io/job={name}")["items"][0]
        return rayjob["spec"]["rayClusterSpec"]["authOptions"]["secretName"]

    op = operator(old)
    try:
        running_with_report("before", 10)
    finally:
        op.stop()
    op = operator(new, previous=old, log="rotated.log")
    try:
        dashboard.add_job_log(ns, "before", [reported(20, 0.5)])
        wait_step(kube, ns, "before", 20)  # read with A's token after the head refused B's
        running_with_report("after", 5)
        secret = kube.core.read_namespaced_secret(token_secret("after"), ns)
        assert base64.b64decode(secret.data["auth_token"]).decode() == RayTokens(new.read_bytes().strip()).token(ns, secret.metadata.name)
    finally:
        op.stop()
    op = operator(new, log="old-key-removed.log")
    try:
        dashboard.add_job_log(ns, "after", [reported(6, 0.25)])
        wait_step(kube, ns, "after", 6)
        dashboard.add_job_log(ns, "before", [reported(30, 0.125)])
        kube.wait(lambda: "HTTP 403" in op.log(), 60, "the old job's read refused without the previous key")
        assert job_status(kube, ns, "before")["progress"]["step"] == 20
    finally:
        op.stop()
    for log in ("operator.log", "rotated.log", "old-key-removed.log"):
        assert "Traceback" not in (tmp_path / log).read_text(), log
