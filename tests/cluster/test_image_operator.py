"""The operator from the built image (`make image`) reconciling on the local cluster.

The archive is unpacked and the image's own command (its entrypoint and default command, as the
runtime config says) runs in a chroot as uid 65532 on a read-only root, with the cluster's
kubeconfig mounted: the code path of the chart's Deployment on GKE. The extra flags keep it to
this test's namespace and put its endpoints on free loopback ports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "image"))
from imagetools import image_bundle, image_info, popen_in_image, stop  # noqa: E402,F401 (fixtures)
from operator_process import free_port, kubectl, tputorch_crd  # noqa: E402,F401 (fixture)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v6e-4x4.yaml"
KUBECONFIG_INSIDE = "/etc/tputorch/kubeconfig"
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, f"the operator exited with {proc.returncode}:\n{log.read_text()[-5000:]}"
        try:
            with _no_proxy.open(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the operator was not healthy after {timeout}s:\n{log.read_text()[-5000:]}")


def test_operator_from_the_image_runs_a_job(kube, namespace, tputorch_crd, image_bundle, dashboard, tmp_path):
    # dashboard: the fake Ray dashboard reports the RayJob's Ray job RUNNING (its default)
    # Self-contained (the CA inlined), readable by the image's user only.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubectl(kube.kubeconfig, "config", "view", "--raw", "--flatten", "--minify").stdout)
    uid, gid = image_bundle.process["user"]["uid"], image_bundle.process["user"]["gid"]
    os.chown(kubeconfig, uid, gid)
    kubeconfig.chmod(0o600)

    health, metrics = free_port(), free_port()
    args = [*image_bundle.process["args"], "--namespace", namespace,
            "--liveness", f"http://127.0.0.1:{health}/healthz", "--metrics-host", "127.0.0.1",
            "--metrics-port", str(metrics)]
    assert args[:3] == ["tputorch", "run", "--standalone"]
    log = tmp_path / "operator.log"
    proc = popen_in_image(image_bundle, args, log, files={KUBECONFIG_INSIDE: kubeconfig},
                          env={"KUBECONFIG": KUBECONFIG_INSIDE})
    try:
        wait_healthy(proc, f"http://127.0.0.1:{health}/healthz", log)
        body = yaml.safe_load(EXAMPLE.read_text())
        name = body["metadata"]["name"]
        kubectl(kube.kubeconfig, "apply", "-n", namespace, "-f", str(EXAMPLE))

        def running():
            job = kube.custom.get_namespaced_custom_object("tputorch.io", "v1alpha1", namespace, "tputorchjobs", name)
            status = job.get("status") or {}
            return status if status.get("phase") == "Running" else None

        status = kube.wait(running, 120, f"TPUTorchJob {namespace}/{name} Running (operator log: {log})")
        rayjob = kube.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", status["rayJobName"])
        assert rayjob["metadata"]["ownerReferences"][0]["name"] == name
        assert rayjob["status"]["jobDeploymentStatus"] == "Running"
        with _no_proxy.open(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as resp:
            assert b"tputorch_reconciles_total" in resp.read()
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text, text[-5000:]
