"""The whole chain for real: kubectl apply -> operator -> KubeRay -> a real Ray job on a simulated
TPU slice -> status from Ray.

The test's namespace is forwarded by the stand-in dashboard to a real Ray 2.60 head on 127.0.0.1
(`real_ray`, see ray_backend.py) with the slice's hosts attached; the submitter pod's own command
(`ray job submit ... ; ray job logs --follow`) runs on this machine against it (the dashboard's
submitter runner), and KubeRay reads the real job's status through the dashboard as it would on GKE.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ray_backend import REPORTED

from operator_process import OperatorProcess, kubectl, operator, ray_token_key_file, tputorch_crd  # noqa: F401 (fixtures)

from tputorch import render
from tputorch.render.names import JOB_LABEL
from tputorch.render.names import JOB_LABEL
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


# -- issue 23: a lost TPU host, and the next attempt resumes from the last checkpoint ---------------
# Right after the 4x4 run above: the real head keeps that slice's 4 hosts attached for it (the
# other tests here run on 2x2), one 4-host attach and one 1-host attach fewer per run.
RESUME_SCRIPT = Path(__file__).resolve().parent / "realray_jobs" / "ddp_resume.py"
# Ray Train prefixes a worker's lines with "(RayTrainWorker pid=...)" in the driver's log.
RESUMED = re.compile(r"tputorch-resume: resumed from step (\d+)")


def checkpointed_step(storage: Path, run: str) -> int | None:
    """The step of the latest checkpoint Ray Train's controller registered for `run` (what a new
    run of that name restores), from its checkpoint manager's snapshot in the storage path."""
    path = storage / run / "checkpoint_manager_snapshot.json"
    if not path.exists():
        return None
    latest = (json.loads(path.read_text()).get("latest_checkpoint_result") or {})
    return (latest.get("metrics") or {}).get("step")


def test_a_killed_host_is_retried_and_the_next_attempt_resumes_from_the_checkpoint(
        kube, kube_env, real_ray_namespace, real_ray, tputorch_crd, tmp_path):
    """v6e 4x4 (4 hosts), one Ray Train worker per host (chipsPerWorker: 4: the multi-host slice
    the issue names at a quarter of the 16 workers' cost on 2 cores). Attempt 1 pauses after its
    checkpoint of step 3; host 1's Ray node is killed and its pod deleted (a preempted TPU VM). The
    operator retries on a fresh slice (the same Ray head here, the host started again) and the
    script of attempt 2 resumes from step 3, read from its own driver log. While attempt 1 waits
    for the kill, and once the job has ended, `tputorch describe` shows the step, the loss the
    script printed and the checkpoint Ray Train persisted under the job's run: the progress the
    operator read from the real driver's log (through the stand-in, as KubeRay reaches it).

    Then a hang (issue 57, spec.hangDetection at its least, 60 s): attempt 2 checkpoints step 4,
    takes step 5 (not checkpointed: lost work) and at step 6 rank 1 never joins the collective, so
    the other ranks block inside gloo's all_reduce. Their watchdogs print where they are; the
    operator (reading progress every 2 s) ends attempt 2 as a Hang naming all_reduce, and attempt 3
    resumes from step 4 and succeeds. The job's goodput ledger then accounts for the whole
    wall-clock: its parts and `unaccounted` sum to it, the hang and the lost work are counted, and
    `unaccounted` stays under 1 %.

    Which retry resumed: the operator's. Ray Train's FailureConfig (workerRetries: 1, the default)
    could restart the worker group inside attempt 1, but in the runs here attempt 1's Ray job was
    stopped 3-5 s after the kill, before Ray Train started a second worker group (its driver log
    shows one worker-group start, and the test asserts it never resumed); a restart there could
    not be placed anyway while host 1, which a worker is pinned to, is missing. The resume shown is
    attempt 2's, a new Ray job (another submission id) that the operator started."""
    ns, name, storage = real_ray_namespace, "resumed", tmp_path / "checkpoints"
    t0, phases = time.monotonic(), {}
    REPORTED["real-Ray resume (s)"] = phases  # printed at the session's end (conftest.py)
    body = job_body(name, "4x4", f"python {RESUME_SCRIPT} --steps 7 --pause-at 3 --hang-attempt 2 --hang-at 6",
                    checkpoint={"storagePath": str(storage)},
                    hangDetection={"timeoutSeconds": 60, "firstStepTimeoutSeconds": 600})
    body["spec"]["tpu"]["chipsPerWorker"] = 4
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [ns], dashboard_url=kube_env["dashboard_url"],
                         extra_args=["--progress-interval", "2"]).start()
    try:
        killed_host_then_hang(kube, real_ray, ns, name, body, storage, t0, phases)
    finally:
        op.stop()
    assert "Traceback" not in op.log(), op.log()[-5000:]


def killed_host_then_hang(kube, real_ray, ns, name, body, storage, t0, phases) -> None:
    start(kube, real_ray, ns, body)
    first = wait_real_job(kube, real_ray, ns, name, ("RUNNING",), 600)
    log = kube.wait(lambda: (lambda text: text if "tputorch-resume: paused at step 3" in text else None)(
        real_ray.logs(first["submission_id"])), 600, "attempt 1 paused after its checkpoint of step 3")
    # The run's name and storage as the script got them from the operator (tputorch.train.run_config()).
    run, where = re.search(r"^tputorch-resume: run (\S+) in (\S+)$", log, re.M).groups()
    assert where == str(storage) and run.startswith(f"{name}-"), (run, where)
    kube.wait(lambda: checkpointed_step(storage, run) == 3, 120, "the checkpoint of step 3 registered")
    phases["attempt1_paused"] = time.monotonic() - t0
    # Paused (the test's gate): `tputorch describe` shows the step, the loss the script printed and
    # the checkpoint Ray Train persisted under the job's run, read from the real driver's log.
    paused = shown_progress(kube, ns, name, 3, log, storage / run)


    # A preempted TPU VM: its Ray node dies, and GKE deletes its pod.
    workers = [p for p in kube.core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={name}").items
               if p.metadata.labels.get("ray.io/node-type") == "worker"]
    assert len(workers) == 4, [p.metadata.name for p in workers]
    # KubeRay then deletes the other hosts of the multi-host replica too, and the operator names the
    # first lost pod by name: lose the first by name, so that the record names this one.
    lost = min(p.metadata.name for p in workers)
    real_ray.kill_host(1)
    kubectl(kube.kubeconfig, "delete", "pod", "-n", ns, lost, "--wait=false")

    st = kube.wait(lambda: (lambda s: s if s.get("attemptHistory") else None)(status(kube, ns, name)), 120,
                   "attempt 1's end recorded")
    (record,) = st["attemptHistory"]
    assert (record["attempt"], record["result"]) == (1, "Infrastructure"), record
    assert record["reason"] in ("PodDeleted", "NodeDeleted") and lost in record["message"], record
    assert st["attempts"] == 2
    phases["attempt1_ended"] = time.monotonic() - t0
    kube.wait(lambda: any(e.reason == "Retrying" for e in kube.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TPUTorchJob").items), 60,
        "the Retrying event")
    # Attempt 1's Ray job ends with its RayCluster; then the slice gets its lost host back.
    kube.wait(lambda: real_ray.job(first["submission_id"])["status"] in ("STOPPED", "FAILED"), 300,
              "attempt 1's Ray job ended")
    assert set(RESUMED.findall(real_ray.logs(first["submission_id"]))) == {"0"}, "attempt 1 never resumed"
    phases["attempt1_ray_job_ended"] = time.monotonic() - t0
    real_ray.attach(render.rayjob(spec.parse({**body, "metadata": {**body["metadata"], "namespace": ns}})))
    assert len(real_ray.current["node_ids"]) == 4
    phases["host_readded"] = time.monotonic() - t0

    # Attempt 2 resumes from step 3, checkpoints step 4, takes step 5 and hangs in step 6's collective.
    second = kube.wait(lambda: (lambda r: r if r["metadata"]["labels"].get("tputorch.io/attempt") == "2"
                                and (r.get("status") or {}).get("jobId") else None)(rayjob(kube, ns, name)),
                       300, "attempt 2's Ray job")
    sid2 = second["status"]["jobId"]
    assert sid2 != first["submission_id"]
    st = kube.wait(lambda: (lambda s: s if len(s.get("attemptHistory") or []) == 2 else None)(status(kube, ns, name)),
                   600, "attempt 2 ended as a hang")
    phases["attempt2_hang_ended"] = time.monotonic() - t0
    hung = st["attemptHistory"][1]
    assert (hung["attempt"], hung["result"]) == (2, "Hang"), hung
    assert "all_reduce" in hung["message"] and hung.get("hungSince"), hung
    log = real_ray.logs(sid2)
    assert {int(s) for s in RESUMED.findall(log)} == {3}, log[-3000:]
    assert "tputorch-resume: step 5 " in log and "tputorch-resume: step 6 " not in log, log[-3000:]
    assert "tputorch.hang " in log, log[-3000:]
    kube.wait(lambda: any(e.reason == "Hung" and e.type == "Warning" for e in kube.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TPUTorchJob").items), 60, "the Hung event")

    # Attempt 3 resumes from attempt 2's last checkpoint (step 4) and ends the run.
    st = wait_phase(kube, ns, name, "Succeeded", 900)
    phases["succeeded"] = time.monotonic() - t0
    assert st["attempts"] == 3
    assert [(a["attempt"], a["result"]) for a in st["attemptHistory"]] == [
        (1, "Infrastructure"), (2, "Hang"), (3, "Succeeded")]
    third = rayjob(kube, ns, name)
    assert third["metadata"]["labels"]["tputorch.io/attempt"] == "3"
    log = real_ray.logs(third["status"]["jobId"])
    assert {int(s) for s in RESUMED.findall(log)} == {4}, log[-3000:]
    assert "tputorch-resume: done at step 7" in log, log[-3000:]
    assert "tputorch-resume: step 5 " in log and "tputorch-resume: step 4 " not in log, log[-3000:]
    final = shown_progress(kube, ns, name, 7, log, storage / run)
    assert final[1] != paused[1], (paused, final)  # another checkpoint, of the last attempt

    # The ledger: every part from an observed moment, summing to the wall-clock to the millisecond.
    ledger = st["goodput"]
    parts, wall = ledger["seconds"], ledger["wallClockSeconds"]
    shown = json.dumps(ledger, indent=1)
    assert abs(sum(parts.values()) - wall) < 0.01 * len(parts), shown
    assert parts["hang"] > 0 and parts["lostWork"] > 0 and parts["productive"] > 0, shown
    assert parts["unaccounted"] < 0.01 * wall, shown
    phases.update({f"ledger_{part}": parts[part] for part in ("hang", "lostWork", "unaccounted")},
                  ledger_wall=wall)


def shown_progress(kube, ns: str, name: str, step: int, log: str, run: Path) -> tuple[float, str]:
    """Once status.progress reaches ``step``: `tputorch describe`'s loss (the one the script printed
    for that step, in its driver's ``log``) and checkpoint (a directory of the run's)."""
    kube.wait(lambda: (status(kube, ns, name).get("progress") or {}).get("step") == step, 120,
              f"status.progress.step {step}")
    text = describe(kube, ns, name)
    shown = re.search(rf"^Progress:\s+step {step}\b.*\bloss ([0-9.e+-]+)", text, re.M)
    printed = re.search(rf"^.*tputorch-resume: step {step} loss ([0-9.]+)", log, re.M)
    assert shown and printed, text
    assert abs(float(shown.group(1)) - float(printed.group(1))) < 1e-3, (shown.group(0), printed.group(0))
    checkpoint = re.search(r"^Checkpoint:\s+(\S+)", text, re.M).group(1)
    assert Path(checkpoint).parent == run and Path(checkpoint).is_dir(), (checkpoint, run)
    return float(shown.group(1)), checkpoint


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


def pod_ready(kube, ns: str, name: str, node_type: str) -> bool:
    (pod,) = [p for p in kube.core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={name}").items
              if p.metadata.labels.get("ray.io/node-type") == node_type and not p.metadata.deletion_timestamp]
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_deleting_a_running_job_stops_the_ray_job(kube, real_ray_namespace, operator, real_ray, dashboard, tmp_path):
    """First, while it runs, GKE's readiness (hack/fakedash/prober.py): a pod is Ready only while the
    readiness probe KubeRay wrote passes against the Ray node that stands for it. The host's Ray node
    killed: its pod turns NotReady (the head's stays Ready) and the status counts 0/1 hosts ready;
    the host started again: Ready, 1/1. (The job's driver holds on the head: the job runs on.)"""
    ns, name = real_ray_namespace, "deleted"
    # KubeRay's probe fails a pod after 10 failures 5 s apart (50 s): 1 s apart here, for make test's time.
    dashboard.set_backend(ns, real_ray.url, probe_period=1, token=real_ray.token)
    body = job_body(name, "2x2", f"python {JOB_SCRIPT} --hold-until {tmp_path / 'never'}")
    start(kube, real_ray, ns, body)
    job = wait_real_job(kube, real_ray, ns, name, ("RUNNING",))
    hosts_ready = lambda want: (lambda st: st if st.get("hostsReady") == want else None)(status(kube, ns, name))  # noqa: E731
    kube.wait(lambda: hosts_ready("1/1") and pod_ready(kube, ns, name, "head"), 120, "the host and head Ready")

    real_ray.kill_host(0)
    kube.wait(lambda: not pod_ready(kube, ns, name, "worker"), 120, "the lost host's pod NotReady")
    assert pod_ready(kube, ns, name, "head"), "the head's Ray node still answers its probe"
    st = kube.wait(lambda: hosts_ready("0/1"), 120, "the status counting 0/1 hosts ready")
    assert st["phase"] == "Running", st
    real_ray.attach(render.rayjob(spec.parse({**body, "metadata": {**body["metadata"], "namespace": ns}})))
    kube.wait(lambda: pod_ready(kube, ns, name, "worker"), 120, "the host's pod Ready again")
    kube.wait(lambda: hosts_ready("1/1"), 120, "the status counting 1/1 hosts ready again")
    assert real_ray.job(job["submission_id"])["status"] == "RUNNING"

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


def describe(kube, ns: str, name: str) -> str:
    env = {**os.environ, "KUBECONFIG": kube.kubeconfig}
    done = subprocess.run([sys.executable, "-m", "tputorch", "describe", name, "-n", ns], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"tputorch describe {ns}/{name} exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def as_pod_in_cluster(dashboard, ns: str, cluster: str, method: str, path: str, headers: dict | None = None,
                      body: dict | None = None) -> tuple[int, str]:
    """A call to the RayCluster's head service as any pod of the cluster would make it (through the
    stand-in dashboard, which answers as that cluster's head and forwards to the real one)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": dashboard.url}))
    req = urllib.request.Request(f"http://{cluster}-head-svc.{ns}.svc.cluster.local:8265{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_head_runs_with_token_auth_and_refuses_a_submit_without_the_token(kube, real_ray_namespace, operator,
                                                                            real_ray, dashboard, tmp_path):
    """Issue 21: `authOptions` on the rendered cluster, its token in the Secret the operator made
    (derived from the operator's key, which the operator can compute again but never reads back;
    owned by the RayJob, whose finalizer still calls the head);
    KubeRay started the head and the submitter with it; its own calls and the submitter's still
    work, a caller without the token is refused (by the cluster's head as recorded from Ray 2.60,
    and by the real head)."""
    from tputorch.controller.raytoken import RayTokens

    ns, name, release = real_ray_namespace, "authed", tmp_path / "release"
    start(kube, real_ray, ns, job_body(name, "2x2", f"python {JOB_SCRIPT} --hold-until {release}"))
    job = wait_real_job(kube, real_ray, ns, name, ("RUNNING",))  # submitted by the submitter, with its token
    cluster = rayjob(kube, ns, name)["status"]["rayClusterName"]
    rc = kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", cluster)
    secret_name = rc["spec"]["authOptions"]["secretName"]
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": secret_name}

    secret = kube.core.read_namespaced_secret(secret_name, ns)  # the operator's, owned by the RayJob
    rayjob_uid = rayjob(kube, ns, name)["metadata"]["uid"]
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [("RayJob", name, rayjob_uid)]
    token = base64.b64decode(secret.data["auth_token"]).decode()
    assert token == RayTokens.from_file(str(ray_token_key_file())).token(ns, secret_name)
    assert not kube.core.list_namespaced_secret(ns, label_selector=f"ray.io/cluster={cluster}").items, \
        "KubeRay made no token of its own"
    pods = kube.core.list_namespaced_pod(ns).items
    head = next(p for p in pods if (p.metadata.labels or {}).get("ray.io/node-type") == "head")
    submitter = next(p for p in pods if "batch.kubernetes.io/job-name" in (p.metadata.labels or {}))
    for pod in (head, submitter):
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["RAY_AUTH_MODE"].value == "token", pod.metadata.name
        ref = env["RAY_AUTH_TOKEN"].value_from.secret_key_ref
        assert (ref.name, ref.key) == (secret_name, "auth_token"), pod.metadata.name

    submit = {"entrypoint": "echo should-never-run", "submission_id": f"{name}-intruder"}
    assert as_pod_in_cluster(dashboard, ns, cluster, "POST", "/api/jobs/", body=submit) == \
        (401, "Unauthorized: Missing authentication token")
    assert as_pod_in_cluster(dashboard, ns, cluster, "POST", "/api/jobs/", {"Authorization": "Bearer nope"},
                             submit) == (403, "Forbidden: Invalid authentication token")
    assert as_pod_in_cluster(dashboard, ns, cluster, "GET", f"/api/jobs/{job['submission_id']}")[0] == 401
    with pytest.raises(urllib.error.HTTPError) as refused:  # the real head refuses it too
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(urllib.request.Request(
            f"{real_ray.url}/api/jobs/", data=json.dumps(submit).encode(), method="POST",
            headers={"Content-Type": "application/json"}), timeout=30)
    assert refused.value.code == 401
    assert real_ray.job(submit["submission_id"]) is None, "nothing was submitted"
    # With the cluster's token (what KubeRay's client sends, in X-Ray-Authorization) the call passes.
    code, body = as_pod_in_cluster(dashboard, ns, cluster, "GET", f"/api/jobs/{job['submission_id']}",
                                   {"X-Ray-Authorization": f"Bearer {token}"})
    assert code == 200 and json.loads(body)["status"] == "RUNNING", body

    release.touch()
    st = wait_phase(kube, ns, name, "Succeeded", 180)  # KubeRay's status calls and the operator's path
    assert st["jobStatus"] == "SUCCEEDED"


def test_doctor_smoke_runs_a_real_ray_job_that_kuberay_sees_succeed_and_probes_its_storage(kube, real_ray_namespace,
                                                                                          dashboard, tmp_path, capsys):
    """`tputorch doctor --smoke --storage-path`: its probe's submitter runs `ray job submit` against
    the real head, the job writes, reads back and removes an object under its storage path through
    Ray Train's filesystem layer (a file:// path here: the same code as gs://, whose transport and
    Workload Identity are not tested here), KubeRay reads the job's end from the head, and the
    namespace holds what it held before; the pods run as a ServiceAccount of their own (on GKE its
    Workload Identity is what writes the bucket). Then a storage path the job cannot write (under a regular
    file; as root a permission cannot be denied here): Ray's message for the failed job, copied by
    KubeRay into the RayJob, names the step, the object and the reason, and the doctor its fix."""
    from test_doctor import by_check, doctor, failed, objects

    ns = real_ray_namespace
    kubectl(kube.kubeconfig, "create", "serviceaccount", "ray-tpu", "-n", ns)  # the pods' own, as on GKE
    before = objects(kube.kubeconfig, ns)
    storage = tmp_path / "ckpt"
    code, report = doctor(capsys, kube.kubeconfig, ns, "--smoke", "--smoke-timeout", "120",
                          "--service-account", "ray-tpu", "--storage-path", f"file://{storage}")
    checks = by_check(report)
    assert checks["smoke"]["status"] == "ok", checks["smoke"]
    assert checks["smoke-storage"]["status"] == "ok", checks["smoke-storage"]
    assert f"file://{storage} as ServiceAccount {ns}/ray-tpu" in checks["smoke-storage"]["message"]
    assert not {"smoke", "smoke-storage"} & set(failed(report))  # the exit code also counts the other checks here
    assert storage.is_dir() and list(storage.iterdir()) == []  # made, as Ray Train makes it; the object removed
    logs = [dashboard.submitter_log(ns, r["pod"]) or "" for r in dashboard.submitters(ns)]
    # The Ray job's driver printed it (the submitter pod only follows the driver's log): the line
    # follows Ray's "Running entrypoint for job" in the same log.
    assert any(re.search(rf"Running entrypoint for job .*tputorch-doctor-storage: ok file://{re.escape(str(storage))}$",
                         log, re.S | re.M) for log in logs), logs
    kube.wait(lambda: objects(kube.kubeconfig, ns) == before, 30, "the namespace to hold what it held before")

    (tmp_path / "a-file").write_text("not a directory")
    code, report = doctor(capsys, kube.kubeconfig, ns, "--smoke", "--smoke-timeout", "120",
                          "--service-account", "ray-tpu", "--storage-path", f"file://{tmp_path}/a-file/ckpt")
    assert code == 1
    assert by_check(report)["smoke"]["status"] == "ok"  # the Ray job ran and KubeRay read its end
    fail = failed(report)["smoke-storage"]
    assert fail["message"].startswith(f"smoke: could not create the directory file://{tmp_path}/a-file/ckpt as "
                                      f"ServiceAccount {ns}/ray-tpu: "), fail["message"]
    assert (tmp_path / "a-file").read_text() == "not a directory"
    assert "Not a directory" in fail["message"]
    assert "roles/storage.objectUser" in fail["fix"]
    kube.wait(lambda: objects(kube.kubeconfig, ns) == before, 30, "the namespace to hold what it held before")
