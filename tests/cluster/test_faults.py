"""Faults: the operator SIGKILLed mid-burst, the API server and etcd restarted, RayJobs deleted or
edited behind the operator's back, KubeRay's CRDs missing. Every loop is bounded.

Jobs here are `suspend: true` (KubeRay marks their RayJobs Suspended, no pods) to keep them light.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from operator_process import REPO, kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)

from tputorch import status as statuses

GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"
RAY = ("ray.io", "v1", "rayjobs")
CLUSTER_SH = REPO / "hack" / "cluster.sh"


def body(name: str, suspend: bool = True) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                 "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                 "worker": {"cpu": "4", "memory": "16Gi"}, "suspend": suspend},
    }


def create_jobs(kube, ns: str, names: list[str], threads: int = 4) -> None:
    def one(name):
        for attempt in range(30):  # bounded: the API server may be restarting
            try:
                kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body(name))
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                if exc.status < 500 and exc.status != 429:
                    raise
            except Exception:  # connection refused while the API server restarts
                pass
            time.sleep(1)
        raise AssertionError(f"could not create {name}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


def rayjobs(kube, ns) -> list[dict]:
    return kube.custom.list_namespaced_custom_object(*RAY[:2], ns, RAY[2])["items"]


def jobs(kube, ns) -> list[dict]:
    return kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]


def consistency_problems(kube, ns: str, expected: set[str]) -> list[str]:
    """Empty when: one RayJob per TPUTorchJob (same name, owned by it), no stray RayJob, and each
    TPUTorchJob's phase is the one its RayJob's status gives (and KubeRay has reported one)."""
    problems = []
    by_name = {j["metadata"]["name"]: j for j in jobs(kube, ns)}
    if set(by_name) != expected:
        problems.append(f"TPUTorchJobs: missing {sorted(expected - set(by_name))[:5]}")
    children: dict[str, list[dict]] = {}
    for r in rayjobs(kube, ns):
        owners = [o for o in r["metadata"].get("ownerReferences") or [] if o.get("kind") == "TPUTorchJob"]
        if len(owners) != 1:
            problems.append(f"RayJob {r['metadata']['name']} has owners {owners}")
            continue
        children.setdefault(owners[0]["name"], []).append(r)
    for name, job in by_name.items():
        mine = [r for r in children.get(name, []) if r["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]]
        if len(mine) != 1:
            problems.append(f"{name}: {len(mine)} RayJobs")
            continue
        rj = mine[0].get("status") or {}
        if not rj.get("jobDeploymentStatus"):
            problems.append(f"{name}: KubeRay has not reported yet")
            continue
        want = statuses.rayjob_phase(rj.get("jobDeploymentStatus", ""), rj.get("jobStatus", ""))
        got = (job.get("status") or {}).get("phase")
        if got != want:
            problems.append(f"{name}: phase {got}, RayJob says {want} ({rj.get('jobDeploymentStatus')})")
    stray = set(children) - set(by_name)
    if stray:
        problems.append(f"RayJobs without a TPUTorchJob: {sorted(stray)[:5]}")
    return problems


def wait_consistent(kube, ns, expected, timeout):
    end = time.monotonic() + timeout
    while True:
        try:
            problems = consistency_problems(kube, ns, expected)
        except Exception as exc:  # API server still coming back
            problems = [repr(exc)]
        if not problems:
            return
        if time.monotonic() > end:
            pytest.fail(f"not consistent after {timeout}s: {len(problems)} problems, e.g. {problems[:8]}")
        time.sleep(1)


# --- SIGKILL during a burst ---------------------------------------------------------------


def test_sigkill_during_a_burst_leaves_one_rayjob_per_job(kube, namespace, operator):
    n, kills = 300, 3
    seed = int(os.environ.get("TPUTORCH_FAULT_SEED", time.time()))
    rng = random.Random(seed)
    names = [f"burst-{i:04d}" for i in range(n)]
    creator = threading.Thread(target=create_jobs, args=(kube, namespace, names), daemon=True)
    creator.start()
    for k in range(kills):
        # A random point in the burst (or in the catch-up after it): kill -9, restart at once.
        time.sleep(rng.uniform(0.3, 2.5))
        operator.kill()
        operator.start()
    creator.join(180)
    assert not creator.is_alive(), "the burst did not finish"
    wait_consistent(kube, namespace, set(names), 420)  # KubeRay sets the pace (see the failover test)
    print(f"seed={seed}")


# --- API server and etcd restart -----------------------------------------------------------


def _cluster_dir() -> Path:
    return Path(os.environ.get("TPUTORCH_CLUSTER_DIR", REPO / ".cluster"))


def _require_local_cluster(kube) -> None:
    if Path(kube.kubeconfig).resolve() != (_cluster_dir() / "kubeconfig").resolve():
        pytest.skip("restarts/changes components of the local cluster from hack/cluster.sh only")


def _kill_component(name: str) -> None:
    pidfile = _cluster_dir() / "pids" / f"{name}.pid"
    if not pidfile.exists():
        pytest.skip(f"no pid file for {name}: not the local cluster from hack/cluster.sh")
    pid = int(pidfile.read_text().strip())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(40):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.25)


def test_operator_reconnects_after_apiserver_and_etcd_restart(kube, namespace, operator):
    _require_local_cluster(kube)
    before = [f"before-{i}" for i in range(10)]
    create_jobs(kube, namespace, before)
    wait_consistent(kube, namespace, set(before), 90)

    _kill_component("kube-apiserver")  # returns once the process is gone: every watch is broken
    _kill_component("etcd")
    _cluster_up()

    after = [f"after-{i}" for i in range(10)]
    create_jobs(kube, namespace, after)
    # A status change on an old job too: resume it and see the change reach its RayJob.
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "before-0", {"spec": {"suspend": False}})
    wait_consistent(kube, namespace, set(before) | set(after), 180)
    kube.wait(lambda: kube.custom.get_namespaced_custom_object(*RAY[:2], namespace, RAY[2], "before-0")["spec"]["suspend"] is False,
              60, "before-0 resumed on its RayJob")
    assert operator.proc.poll() is None, "the operator must survive the outage by itself"


# --- RayJob deleted or edited behind the operator's back -----------------------------------


def _rayjob(kube, ns, name):
    return kube.custom.get_namespaced_custom_object(*RAY[:2], ns, RAY[2], name)


def test_deleted_rayjob_of_an_unfinished_job_is_recreated(kube, namespace, operator):
    create_jobs(kube, namespace, ["alive"])
    first = kube.wait(lambda: _rayjob(kube, namespace, "alive"), 60, "RayJob")
    kube.custom.delete_namespaced_custom_object(*RAY[:2], namespace, RAY[2], "alive")
    second = kube.wait(lambda: (lambda r: r if r["metadata"]["uid"] != first["metadata"]["uid"] else None)(
        _rayjob(kube, namespace, "alive")), 60, "a new RayJob")
    assert second["metadata"]["ownerReferences"][0]["name"] == "alive"
    wait_consistent(kube, namespace, {"alive"}, 60)


def test_deleted_rayjob_of_a_finished_job_is_left_alone(kube, namespace, operator, dashboard):
    kubectl(kube.kubeconfig, "apply", "-n", namespace, "-f", "-", input=json.dumps(body("done", suspend=False)))
    kube.wait(lambda: (kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "done").get("status") or {})
              .get("phase") == "Running", 180, "Running")
    dashboard.set_job_status(namespace, "done", "SUCCEEDED")
    kube.wait(lambda: (kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "done").get("status") or {})
              .get("phase") == "Succeeded", 180, "Succeeded")
    kube.custom.delete_namespaced_custom_object(*RAY[:2], namespace, RAY[2], "done")
    kube.wait(lambda: not rayjobs(kube, namespace), 60, "RayJob gone")
    # Not recreated, neither by the running operator nor by a restarted one (resume handler).
    operator.kill()
    operator.start()
    kube.wait(lambda: 'tputorch_reconciles_total{kind="TPUTorchJob",result="finished"}' in operator.metrics(), 60,
              "the restarted operator reconciled the finished job")
    assert not rayjobs(kube, namespace), "a finished job's RayJob must not be recreated (it would train again)"
    st = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "done")["status"]
    assert st["phase"] == "Succeeded"


def test_edited_rayjob_suspend_is_put_back(kube, namespace, operator):
    """Policy (docs/concepts/reconcile-and-ownership.md): the TPUTorchJob owns spec.suspend of its RayJob. The operator
    reconciles on every change of the RayJob too, so an edit made on the RayJob is put back at once,
    and also by a restarted operator."""
    create_jobs(kube, namespace, ["edited"])
    kube.wait(lambda: _rayjob(kube, namespace, "edited"), 60, "RayJob")
    kube.custom.patch_namespaced_custom_object(*RAY[:2], namespace, RAY[2], "edited", {"spec": {"suspend": False}})
    kube.wait(lambda: _rayjob(kube, namespace, "edited")["spec"].get("suspend", False) is True, 60, "suspend put back")
    # An edit made while the operator is down is put back when it starts again.
    operator.kill()
    kube.custom.patch_namespaced_custom_object(*RAY[:2], namespace, RAY[2], "edited", {"spec": {"suspend": False}})
    assert _rayjob(kube, namespace, "edited")["spec"].get("suspend", False) is False
    operator.start()
    kube.wait(lambda: _rayjob(kube, namespace, "edited")["spec"].get("suspend", False) is True, 60, "suspend put back after restart")


# --- KubeRay's CRDs missing ----------------------------------------------------------------


def _kuberay_crd_dir() -> str:
    bin_dir = subprocess.run([str(REPO / "hack" / "build.sh"), "dir"], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    version_file = Path(bin_dir) / "kuberay-operator.version"
    version = version_file.read_text().strip() if version_file.exists() else "v1.6.0"
    out = subprocess.run(["go", "mod", "download", "-json", f"github.com/ray-project/kuberay/ray-operator@{version}"],
                         check=True, capture_output=True, text=True, cwd="/tmp", timeout=120).stdout
    return str(Path(json.loads(out)["Dir"]) / "config" / "crd" / "bases")


def _cluster_up() -> None:
    for attempt in range(3):  # `up` can lose a race with the API server updating a fresh CRD: retry
        if subprocess.run([str(CLUSTER_SH), "up"], stdout=subprocess.DEVNULL, timeout=300).returncode == 0:
            return
        time.sleep(2)
    raise AssertionError("hack/cluster.sh up failed 3 times: the cluster may be incomplete (run it by hand)")


def _restart_kuberay() -> None:
    _kill_component("kuberay-operator")
    _cluster_up()


def _condition(st: dict, ctype: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def _drop_rayjob_finalizers(kube) -> None:
    """Deleting a CRD waits for all of its objects. RayJobs that earlier tests left behind carry
    KubeRay's finalizer, which KubeRay may never remove (a namespace can even finish deleting
    around such objects when their CRD went away meanwhile): drop it, as an admin removing KubeRay
    would, recreating a vanished namespace for the moment it takes."""
    from kubernetes import client

    for rj in kube.custom.list_cluster_custom_object(*RAY[:2], RAY[2])["items"]:
        meta = rj["metadata"]
        if not meta.get("finalizers"):
            continue
        ns = meta["namespace"]
        recreated = False
        try:
            kube.core.read_namespace(ns)
        except ApiException as err:
            if err.status != 404:
                raise
            kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            recreated = True
        try:
            kube.custom.patch_namespaced_custom_object(*RAY[:2], ns, RAY[2], meta["name"], {"metadata": {"finalizers": None}})
        except ApiException as err:
            if err.status != 404:
                raise
        if recreated:
            kube.core.delete_namespace(ns)


def test_kuberay_crds_missing_then_installed(kube, namespace, operator):
    _require_local_cluster(kube)
    crd_dir = _kuberay_crd_dir()  # resolve before deleting anything
    try:
        _drop_rayjob_finalizers(kube)
        kubectl(kube.kubeconfig, "delete", "crd", "rayjobs.ray.io", "--wait=true", "--timeout=120s")
        def says_not_installed(name):
            st = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
            c = _condition(st, "RayJobCreated")
            return st if (c.get("status"), c.get("reason")) == ("False", "KubeRayNotInstalled") else None

        for name in ("no-kuberay-1", "no-kuberay-2"):  # one after the other: the first blocks nothing
            create_jobs(kube, namespace, [name])
            st = kube.wait(lambda: says_not_installed(name), 60, f"{name}: RayJobCreated=False KubeRayNotInstalled")
            assert st["phase"] == "Pending"
            # events are posted after the status patch
            kube.wait(lambda: ("Warning", "KubeRayNotInstalled") in {
                (e.type, e.reason) for e in kube.core.list_namespaced_event(
                    namespace, field_selector=f"involvedObject.name={name}").items}, 30, f"{name}: KubeRayNotInstalled event")
        assert operator.proc.poll() is None
    finally:
        # `hack/cluster.sh up` reinstalls KubeRay's CRDs from the Go module cache exactly as it did at
        # first (it sees rayjobs.ray.io missing) and restarts the KubeRay operator we stopped, so that
        # its informers start over: the cluster is left as it was, even if the test failed.
        _restart_kuberay()
        kubectl(kube.kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd/rayjobs.ray.io")
        assert os.path.isdir(crd_dir)
    # The RayJob kind served again: both jobs get their RayJob and KubeRay's status.
    wait_consistent(kube, namespace, {"no-kuberay-1", "no-kuberay-2"}, 120)
    for name in ("no-kuberay-1", "no-kuberay-2"):
        st = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)["status"]
        assert _condition(st, "RayJobCreated")["status"] == "True"
