"""The whole chain for real: kubectl apply -> operator -> KubeRay -> a real Ray job on a simulated
TPU slice -> status from Ray.

The test's namespace is forwarded by the stand-in dashboard to a real Ray 2.60 head on 127.0.0.1
(`real_ray`, see ray_backend.py) with the slice's hosts attached; the submitter pod's own command
(`ray job submit ... ; ray job logs --follow`) runs on this machine against it (the dashboard's
submitter runner), and KubeRay reads the real job's status through the dashboard as it would on GKE.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from operator_process import kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)

from tputorch import render
from tputorch.api import spec

pytestmark = pytest.mark.realray

JOB_SCRIPT = Path(__file__).resolve().parent / "realray_jobs" / "train_record.py"
GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"


def job_body(name: str, topology: str, entrypoint: str, **extra) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": "v6e", "topology": topology}, "image": "example.com/ray-torch-tpu:2.60.0",
                 "entrypoint": entrypoint, "head": {"cpu": "1", "memory": "2Gi"},
                 "worker": {"cpu": "4", "memory": "16Gi"}, **extra},
    }


def start(kube, real_ray, namespace: str, body: dict) -> None:
    """Attach the slice the operator will render for `body`, then apply it."""
    real_ray.attach(render.rayjob(spec.parse({**body, "metadata": {**body["metadata"], "namespace": namespace}})))
    kubectl(kube.kubeconfig, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def status(kube, ns: str, name: str) -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def wait_phase(kube, ns: str, name: str, phase: str, timeout: float = 180) -> dict:
    def reached():
        st = status(kube, ns, name)
        if st.get("phase") in ("Failed", "Succeeded") and st["phase"] != phase:
            pytest.fail(f"{name} ended {st['phase']} while waiting for {phase}: {st.get('message')}")
        return st if st.get("phase") == phase else None
    return kube.wait(reached, timeout, f"TPUTorchJob {ns}/{name} phase {phase}")


def rayjob(kube, ns: str, name: str) -> dict:
    return kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", name)


def wait_real_job(kube, real_ray, ns: str, name: str, statuses: tuple[str, ...], timeout: float = 180) -> dict:
    """The real Ray job of the RayJob's current run, once its status is one of `statuses`."""
    def reached():
        sid = (rayjob(kube, ns, name).get("status") or {}).get("jobId")
        job = real_ray.job(sid) if sid else None
        return job if job and job["status"] in statuses else None
    return kube.wait(reached, timeout, f"real Ray job of {ns}/{name} in {statuses}")


def submitter_output(dashboard, ns: str, submission_id: str) -> str:
    runs = [r for r in dashboard.submitters(ns) if r["submission_id"] == submission_id]
    assert runs, f"the runner ran no submitter pod for {submission_id}: {dashboard.submitters(ns)}"
    return "".join(dashboard.submitter_log(ns, r["pod"]) or "" for r in runs)


@pytest.mark.parametrize("topology,hosts", [("2x2", 1), ("4x4", 4)])
def test_train_v2_job_succeeds_and_each_worker_sees_its_own_chip(kube, real_ray_namespace, operator, real_ray,
                                                                 dashboard, tmp_path, topology, hosts):
    ns, name, out = real_ray_namespace, f"train-{topology}", tmp_path / "records"
    start(kube, real_ray, ns, job_body(name, topology, f"python {JOB_SCRIPT} --out {out}"))

    st = wait_phase(kube, ns, name, "Succeeded", 300)
    rj = rayjob(kube, ns, name)["status"]
    assert (rj["jobStatus"], rj["jobDeploymentStatus"]) == ("SUCCEEDED", "Complete"), rj
    assert st["jobStatus"] == "SUCCEEDED"
    # Ray's own record of the job: run by the real head, with the operator's entrypoint.
    job = real_ray.job(rj["jobId"])
    assert job["status"] == "SUCCEEDED" and job["entrypoint"].endswith(f"--out {out}"), job

    records = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["world_rank"])
    workers = hosts * 4
    assert [r["world_rank"] for r in records] == list(range(workers))
    assert {r["world_size"] for r in records} == {workers}
    assert {r["TPUTORCH_JOB_NAME"] for r in records} == {name}, "the job's env reached the workers"
    assert {r["node_id"] for r in records} == set(real_ray.current["node_ids"].values()), "every host of the slice"
    by_node: dict[str, list[str]] = {}
    for r in records:
        # One chip per worker: Ray set TPU_VISIBLE_CHIPS to exactly the chip it assigned.
        assert r["TPU_VISIBLE_CHIPS"] == ",".join(r["assigned_tpu_ids"]) and len(r["assigned_tpu_ids"]) == 1, r
        by_node.setdefault(r["node_id"], []).append(r["TPU_VISIBLE_CHIPS"])
    for chips in by_node.values():
        assert sorted(chips) == ["0", "1", "2", "3"], f"4 workers per host, each on its own chip: {by_node}"

    # The submitter pod's command really ran here and followed the driver's output.
    output = submitter_output(dashboard, ns, rj["jobId"])
    assert f"tputorch-realray: {workers} workers done" in output, output[-3000:]


def test_failing_entrypoint_fails_with_rays_message(kube, real_ray_namespace, operator, real_ray):
    ns, name = real_ray_namespace, "fails"
    start(kube, real_ray, ns, job_body(name, "2x2", f"python {JOB_SCRIPT} --fail tputorch-realray-boom"))
    st = wait_phase(kube, ns, name, "Failed", 300)
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True"
    # Ray's own message, with the driver's log tail, carried by KubeRay and the operator.
    assert "Job entrypoint command failed with exit code 1" in st["message"], st["message"]
    assert "RuntimeError: tputorch-realray-boom" in st["message"], st["message"]
    assert real_ray.job(rayjob(kube, ns, name)["status"]["jobId"])["status"] == "FAILED"


def test_deleting_a_running_job_stops_the_ray_job(kube, real_ray_namespace, operator, real_ray, tmp_path):
    ns, name = real_ray_namespace, "deleted"
    start(kube, real_ray, ns, job_body(name, "2x2", f"python {JOB_SCRIPT} --hold-until {tmp_path / 'never'}"))
    job = wait_real_job(kube, real_ray, ns, name, ("RUNNING",))
    kubectl(kube.kubeconfig, "delete", "-n", ns, "tputorchjob", name, "--wait=false")
    kube.wait(lambda: real_ray.job(job["submission_id"])["status"] == "STOPPED", 120, "the Ray job STOPPED")


def test_suspend_stops_the_ray_job_and_resume_runs_it_again(kube, real_ray_namespace, operator, real_ray, tmp_path):
    ns, name, release = real_ray_namespace, "paused", tmp_path / "release"
    body = job_body(name, "2x2", f"python {JOB_SCRIPT} --hold-until {release}")
    start(kube, real_ray, ns, body)
    first = wait_real_job(kube, real_ray, ns, name, ("RUNNING",))

    kubectl(kube.kubeconfig, "patch", "-n", ns, "tputorchjob", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_phase(kube, ns, name, "Suspended", 120)
    # KubeRay suspends by deleting the RayCluster; with it goes the Ray job.
    kube.wait(lambda: real_ray.job(first["submission_id"])["status"] == "STOPPED", 120, "the first run STOPPED")

    kubectl(kube.kubeconfig, "patch", "-n", ns, "tputorchjob", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    second = wait_real_job(kube, real_ray, ns, name, ("RUNNING",))
    assert second["submission_id"] != first["submission_id"]
    release.touch()
    wait_phase(kube, ns, name, "Succeeded", 180)
    assert real_ray.job(second["submission_id"])["status"] == "SUCCEEDED"
    assert real_ray.job(first["submission_id"])["status"] == "STOPPED"
