"""`tputorch doctor --smoke`: one CPU-only Ray job, made the way the operator makes a TPUTorchJob's
RayJob (its render, Ray token auth with the token in an owned Secret, the operator's NetworkPolicy
mode, KubeRay's submitter Job), which KubeRay must see succeed through the Ray dashboard. No TPU:
the slice's worker group asks for no host. Everything it made is deleted at the end, also when
interrupted (Ctrl-C, SIGTERM).

With `--storage-path URI` the job is also given that storage path (spec.checkpoint.storagePath, as a
training job is) and its entrypoint runs storage_probe.py after the Ray probe: an object written,
read back and removed through Ray Train's filesystem layer with the Ray pods' ServiceAccount.

`smoke_objects` and `verdict` are pure; `run` is the I/O.
"""

from __future__ import annotations

import base64
import re
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client.rest import ApiException

from ...api import crd, spec
from ...api.common import DEFAULTS
from ... import render
from ...render.names import JOB_LABEL
from ...render.network import NetworkPolicyConfig, network_policy
from ...render.raytoken import (
    RAY_AUTH_TOKEN_KEY, new_ray_token_secret_name, ray_token_secret_name, with_ray_token_secret,
)
from .result import DOC_NETWORK, DOCS, FAIL, OK, UNKNOWN, Result
from . import storage_probe

RAY_PROBE = "import ray; ray.init(); print('tputorch doctor smoke: ok')"
DEFAULT_IMAGE = f"rayproject/ray:{DEFAULTS['rayVersion']}"  # Ray's own CPU image, of the Ray the operator writes
DOC_SMOKE = DOCS + "troubleshooting.md#troubleshooting"
DOC_STORAGE = DOCS + "tasks/bucket-access.md#a-bucket-and-workload-identity-for-the-ray-pods"
# KubeRay's words when it cannot read the job from the dashboard (1.6's grace period for a job
# whose status it cannot get), and the transport errors of its dashboard client.
UNREACHABLE_MARKS = ("JobDeploymentStatusTransitionGracePeriodExceeded", "dial tcp", "connection refused",
                     "i/o timeout", "context deadline exceeded", "no route to host", "DashboardUnreachable")


@dataclass(frozen=True)
class Storage:
    """What --storage-path probes, and as whom (for the messages)."""
    uri: str
    service_account: str  # namespace/name of the Ray pods' ServiceAccount


def python_command(*statements: str) -> str:
    """One `python -c "..."` command running `statements` in turn: the probe's whole entrypoint is
    one command, because KubeRay splices the entrypoint unquoted into its submitter's `bash -c`
    line (`if ! ray job status ...; then ray job submit ... -- ENTRYPOINT ; fi ; ray job logs
    --follow ...`, ray-operator/controllers/ray/common/job.go): a shell operator in it (`a && b`)
    ends `ray job submit`'s arguments there, so `b` would run in the submitter pod, not in the Ray
    job, and its failure would not fail the job. No statement may hold a double quote, `$`, a
    backtick or a backslash (they would be the submitter's shell's)."""
    return 'python -c "' + "; ".join(statements) + '"'


def storage_statement() -> str:
    """storage_probe.py's source as one Python statement: base64, so that no quoting of KubeRay's
    `bash -c` line or the job's shell can change a character of it."""
    source = base64.b64encode(Path(storage_probe.__file__).read_bytes()).decode("ascii")
    return f"import base64; exec(base64.b64decode('{source}'))"


PROBE_ENTRYPOINT = python_command(RAY_PROBE)


def probe_entrypoint(storage_path: str | None) -> str:
    """The probe job's entrypoint: the Ray probe, then (with a storage path) the storage probe, in
    one Python process, whose exit status is the job's."""
    return python_command(RAY_PROBE, storage_statement()) if storage_path else PROBE_ENTRYPOINT


def storage_path_problem(uri: str) -> str | None:
    """Why --storage-path is refused (None: it is not). The job spec's own rule for
    spec.checkpoint.storagePath decides, and a bare path is refused: the probe's pods mount no
    volume, so it would only reach the head's own disk."""
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": "probe"},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "i", "entrypoint": "e",
                     "checkpoint": {"storagePath": uri}}}
    try:
        spec.parse_any(body)
    except spec.InvalidSpec as err:
        return f"--storage-path {uri!r}: " + "; ".join(e.message for e in err.errors)
    if not re.match(r"^[a-z][a-z0-9+.-]*://", uri):
        return (f"--storage-path {uri!r}: must be a URI such as gs://bucket/runs (a path on a volume is not probed: "
                "the probe's pods mount no volume)")
    return None


def smoke_objects(namespace: str, name: str, image: str, token: str, policy: NetworkPolicyConfig | None,
                  service_account: str | None = None, storage_path: str | None = None) -> tuple[dict, dict, dict | None]:
    """(RayJob, its token Secret, its NetworkPolicy or None): a v6e 2x2 job's, with the TPU group
    at zero hosts, so only the CPU head runs the probe; with `storage_path`, the job's checkpoint
    storage, probed after the Ray probe."""
    entrypoint = probe_entrypoint(storage_path)
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": image, "entrypoint": entrypoint,
                     **({"serviceAccountName": service_account} if service_account else {}),
                     **({"checkpoint": {"storagePath": storage_path}} if storage_path else {})}}
    job = spec.parse_any(body)
    rayjob = render.rayjob(job)
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        group["replicas"] = group["minReplicas"] = group["maxReplicas"] = 0
    with_ray_token_secret(rayjob, new_ray_token_secret_name(name, secrets.token_hex(3)))
    secret_meta = {"name": ray_token_secret_name(rayjob), "namespace": namespace,
                   "labels": {JOB_LABEL: name}}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": secret_meta,
              "stringData": {RAY_AUTH_TOKEN_KEY: token}}
    policy_obj = network_policy(job, policy) if policy is not None else None
    return rayjob, secret, policy_obj


def verdict(rayjob: dict | None, elapsed: float, timeout: float, storage: Storage | None = None) -> list[Result] | None:
    """The probe's outcome from the RayJob's status (with `storage`, the storage probe's too), or
    None while it is still on its way."""
    st = (rayjob or {}).get("status") or {}
    deployment, job_status = st.get("jobDeploymentStatus"), st.get("jobStatus")
    said = " ".join(str(st.get(k) or "") for k in ("reason", "message"))
    ran = Result("smoke", OK, "smoke: a CPU-only Ray job, made as the operator makes one, ran and KubeRay read its end "
                 "through the Ray dashboard")
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return [Result("smoke", OK, "smoke: a CPU-only Ray job, made as the operator makes one, succeeded as KubeRay "
                       "saw it through the Ray dashboard")] + ([storage_ok(storage)] if storage else [])
    if deployment == "Failed" or job_status in ("FAILED", "STOPPED"):
        failed_step = storage_failure(str(st.get("message") or "")) if storage else None
        if failed_step:
            return [ran, storage_failed(storage, *failed_step)]
        if any(mark in said for mark in UNREACHABLE_MARKS):
            outcome = unreachable(said)
        else:
            outcome = Result("smoke", FAIL, f"smoke: the Ray job failed (jobDeploymentStatus {deployment}, jobStatus "
                             f"{job_status}): {said.strip() or 'no reason given'}",
                             "read the RayJob's events (`kubectl describe rayjob`) and its submitter's log", DOC_SMOKE)
        return [outcome] + ([storage_not_reached(storage)] if storage else [])
    if elapsed > timeout:
        if deployment in (None, "", "Initializing") and st.get("rayClusterStatus", {}).get("state") == "ready":
            outcome = unreachable(f"the Ray cluster is ready but the job never started within {timeout:g} s")
        else:
            outcome = Result("smoke", FAIL, f"smoke: no outcome within {timeout:g} s (jobDeploymentStatus "
                             f"{deployment or '-'}, jobStatus {job_status or '-'}{': ' + said.strip() if said.strip() else ''})",
                             "look at the probe's pods (`kubectl get pods -l tputorch.io/job=...`): a head that cannot "
                             "be scheduled or pulled, or KubeRay not running", DOC_SMOKE)
        return [outcome] + ([storage_not_reached(storage)] if storage else [])
    return None


_STORAGE_LINE = re.compile(re.escape(storage_probe.MARK) + r" could not (.+?) (\S+): (.*)")
# What each failed step needs, on GKE (Workload Identity's principal for the pods' ServiceAccount).
STORAGE_FIXES = {
    "open": "the storage path's scheme needs its filesystem in the job's image (gs:// needs pyarrow's GCS support, "
            "as Ray's images have)",
    "create the directory": "grant the pods' ServiceAccount (its Workload Identity principal) roles/storage.objectUser "
                            "and roles/storage.legacyBucketReader on the bucket (pyarrow reads the bucket's metadata); "
                            "check that the bucket exists",
    "write": "grant the pods' ServiceAccount (its Workload Identity principal) roles/storage.objectUser on the bucket",
    "read back": "grant roles/storage.objectUser (roles/storage.objectCreator cannot read: a run could not resume from "
                 "its checkpoint)",
    "remove": "grant roles/storage.objectUser (roles/storage.objectCreator cannot delete: Ray Train removes old "
              "checkpoints); then delete the probe object",
}


def storage_failure(message: str) -> tuple[str, str, str] | None:
    """(step, target, reason) from the storage probe's line in the job's message (Ray puts the tail
    of a failed entrypoint's output there), or None when it has none."""
    for line in message.splitlines():
        m = _STORAGE_LINE.search(line)
        if m and m.group(1) in STORAGE_FIXES:
            return m.group(1), m.group(2), m.group(3).strip()
    return None


def storage_ok(storage: Storage) -> Result:
    return Result("smoke-storage", OK, f"smoke: wrote, read back and removed a probe object under {storage.uri} as "
                  f"ServiceAccount {storage.service_account}, through Ray Train's filesystem layer on the Ray head")


def storage_failed(storage: Storage, step: str, target: str, reason: str) -> Result:
    return Result("smoke-storage", FAIL, f"smoke: could not {step} {target} as ServiceAccount {storage.service_account}: "
                  f"{reason}", STORAGE_FIXES[step], DOC_STORAGE)


def storage_not_reached(storage: Storage) -> Result:
    return Result("smoke-storage", UNKNOWN, f"smoke: {storage.uri} not probed: the Ray job did not get that far")


def unreachable(said: str) -> Result:
    return Result("smoke", FAIL, f"smoke: KubeRay could not reach the Ray dashboard ({said.strip()})",
                  "admit KubeRay to the dashboard port (8265): the chart's networkPolicy.mode=open, or list KubeRay "
                  "in networkPolicy.kuberay (namespace and podLabels, or cidrs)", DOC_NETWORK)


class _Interrupted(BaseException):
    pass


def _raise_interrupted(signum, frame):
    raise _Interrupted()


def run(api_client, namespace: str, image: str, policy: NetworkPolicyConfig | None, timeout: float,
        service_account: str | None = None, say=print, storage_path: str | None = None) -> list[Result]:
    """Create the probe, wait for KubeRay's verdict, delete what was made (also on Ctrl-C / SIGTERM)."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    net = client.NetworkingV1Api(api_client)
    name = f"tputorch-smoke-{secrets.token_hex(3)}"
    rayjob, secret, policy_obj = smoke_objects(namespace, name, image, secrets.token_urlsafe(32), policy, service_account,
                                               storage_path)
    storage = Storage(storage_path, f"{namespace}/{service_account or 'default'}") if storage_path else None
    made: list[tuple[str, str]] = []
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    results: list[Result] = []
    try:
        created = custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", rayjob)
        made.append(("rayjob", name))
        owner = [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name, "uid": created["metadata"]["uid"]}]
        secret["metadata"]["ownerReferences"] = owner
        core.create_namespaced_secret(namespace, secret)
        made.append(("secret", secret["metadata"]["name"]))
        if policy_obj is not None:
            policy_obj["metadata"]["ownerReferences"] = owner
            net.create_namespaced_network_policy(namespace, policy_obj)
            made.append(("networkpolicy", policy_obj["metadata"]["name"]))
        say(f"smoke: RayJob {namespace}/{name} created; waiting for KubeRay (at most {timeout:g} s)")
        start = time.monotonic()
        while True:
            current = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name)
            outcome = verdict(current, time.monotonic() - start, timeout, storage)
            if outcome is not None:
                results += outcome
                break
            time.sleep(1.0)
    except (KeyboardInterrupt, _Interrupted):
        results.append(Result("smoke", FAIL, "smoke: interrupted; what it made is deleted"))
        raise KeyboardInterrupt from None
    except ApiException as err:
        from ..client import api_error_message
        results.append(Result("smoke", FAIL, f"smoke: the API server refused the probe: {api_error_message(err)}",
                              "run it as someone who may create RayJobs, Secrets and NetworkPolicies in the namespace",
                              DOC_SMOKE))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
        try:
            _delete(custom, core, net, namespace, made)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)
    return results


def _delete(custom, core, net, namespace: str, made: list[tuple[str, str]], wait: float = 60.0) -> None:
    """Delete what the probe made, the RayJob last-but-waited-for (KubeRay's finalizer removes its
    RayCluster and submitter Job first)."""
    calls = {
        "networkpolicy": lambda n: net.delete_namespaced_network_policy(n, namespace),
        "secret": lambda n: core.delete_namespaced_secret(n, namespace),
        "rayjob": lambda n: custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", n,
                                                                     propagation_policy="Foreground"),
    }
    for kind, name in reversed(made):
        try:
            calls[kind](name)
        except ApiException as err:
            if err.status != 404:
                raise
    if any(kind == "rayjob" for kind, _ in made):
        end = time.monotonic() + wait
        name = next(n for k, n in made if k == "rayjob")
        while time.monotonic() < end:
            try:
                custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name)
            except ApiException as err:
                if err.status == 404:
                    return
                raise
            time.sleep(0.5)
