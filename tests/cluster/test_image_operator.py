"""The operator from the built image (`make image`) reconciling on the local cluster.

The archive is unpacked and the operator runs in a chroot as the image's user (65532) on a
read-only root, with the cluster's kubeconfig mounted, in two ways:
  default  the image's own command (entrypoint + CMD, as the runtime config says), plus flags that
           keep it to this test's namespace and put its endpoints on free loopback ports;
  chart    the args and env of the chart's Deployment (`helm template` with the built image's
           name): leader election through a Lease; credentials as a pod has them (a token and
           the CA where the service account volume puts them, KUBERNETES_SERVICE_HOST/PORT):
           the code path the chart runs on GKE.
Either turns examples/v6e-4x4.yaml into a RayJob and reports the job Running.
"""

from __future__ import annotations

import base64
import tempfile
import os
import secrets
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "image"))
from imagetools import (OCI_ARCHIVE, Bundle, image_bundle, image_info, popen_in_image,  # noqa: E402,F401 (fixtures)
                        read_oci_archive, stop)
from namespaces import make_bucket_account  # noqa: E402
from operator_process import free_port, kubectl, tputorch_crd  # noqa: E402,F401 (fixture)
from doccmds import helm_args  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "v6e-4x4.yaml"
CHART = REPO / "charts" / "tputorch-operator"
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


def helm_binary() -> str:
    bin_dir = subprocess.run([str(REPO / "hack" / "build.sh"), "dir"], capture_output=True, text=True).stdout.strip()
    return os.environ.get("HELM") or os.path.join(bin_dir, "helm")


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


def chart_container(namespace: str, info: dict) -> dict:
    """The operator container of the chart's Deployment, watching namespace, with the built image and
    its metrics on (they are off by default: no port unless enabled)."""
    out = subprocess.run([helm_binary(), *helm_args(["template", "img", str(CHART), "--namespace", namespace,
                          "--set", f"watchNamespaces={{{namespace}}}", "--set", f"image.repository={info['repository']}",
                          "--set", f"image.tag={info['tag']}", "--set", "metrics.enabled=true"])], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HELM_CACHE_HOME": f"{tempfile.gettempdir()}/tputorch-helm/cache",
                              "HELM_CONFIG_HOME": f"{tempfile.gettempdir()}/tputorch-helm/config", "HELM_DATA_HOME": f"{tempfile.gettempdir()}/tputorch-helm/data"})
    assert out.returncode == 0, out.stderr
    (dep,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def operator_command(mode: str, bundle: Bundle, info: dict, namespace: str, health: int, metrics: int):
    """(args, env) for the operator: the image's command, or the chart's args on the image's entrypoint."""
    if mode == "default":
        args = [*bundle.process["args"], "--namespace", namespace]
        assert args[:2] == ["tputorch", "run"]
        args += ["--liveness", f"http://127.0.0.1:{health}/healthz", "--metrics-port", str(metrics)]
        return args + ["--metrics-host", "127.0.0.1"], {}
    container = chart_container(namespace, info)
    assert container["image"] == info["name"]
    # Kubernetes: args replace the image's CMD, the ENTRYPOINT stays.
    entrypoint = read_oci_archive(OCI_ARCHIVE).config["config"]["Entrypoint"]
    args = replace_flag(container["args"], "--liveness", f"http://127.0.0.1:{health}/healthz")
    args = replace_flag(args, "--metrics-port", str(metrics)) + ["--metrics-host", "127.0.0.1"]
    assert "--leader-elect" in args, args
    fields = {"metadata.name": "image-test-pod", "metadata.namespace": namespace}
    env = {e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
           for e in container["env"]}
    return [*entrypoint, *args], env


def credentials(mode: str, kube, namespace: str, tmp_path: Path, user: dict) -> tuple[dict, dict]:
    """(files to mount, env): the kubeconfig (default), or what a pod's service account volume holds
    (chart; the kubernetes client's in-cluster config reads them). Readable by the image's user only."""
    flat = kubectl(kube.kubeconfig, "config", "view", "--raw", "--flatten", "--minify").stdout
    if mode == "default":
        contents = {KUBECONFIG_INSIDE: flat}
        env = {"KUBECONFIG": KUBECONFIG_INSIDE}
    else:
        cfg = yaml.safe_load(flat)
        server = urllib.parse.urlsplit(cfg["clusters"][0]["cluster"]["server"])
        ca = base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        # /var/run/secrets/... in a pod; /var/run is a symlink to /run in the image
        sa = "/run/secrets/kubernetes.io/serviceaccount"
        contents = {f"{sa}/token": cfg["users"][0]["user"]["token"], f"{sa}/ca.crt": ca, f"{sa}/namespace": namespace,
                    # the chart's ray-token-key Secret, as its volume holds it
                    "/etc/tputorch/ray-token-key/key": secrets.token_hex(32)}
        env = {"KUBERNETES_SERVICE_HOST": server.hostname, "KUBERNETES_SERVICE_PORT": str(server.port)}
    files = {}
    for i, (inside, text) in enumerate(contents.items()):
        host = tmp_path / f"cred-{i}"
        host.write_text(text)
        os.chown(host, user["uid"], user["gid"])
        host.chmod(0o600)
        files[inside] = host
    return files, env


@pytest.mark.parametrize("mode", ["default", "chart"])
def test_operator_from_the_image_runs_a_job(kube, namespace, tputorch_crd, image_info, image_bundle, dashboard,
                                            tmp_path, mode):
    # dashboard: the fake Ray dashboard reports the RayJob's Ray job RUNNING (its default)
    health, metrics = free_port(), free_port()
    args, env = operator_command(mode, image_bundle, image_info, namespace, health, metrics)
    files, env_creds = credentials(mode, kube, namespace, tmp_path, image_bundle.process["user"])
    log = tmp_path / "operator.log"
    proc = popen_in_image(image_bundle, args, log, files=files, env={**env, **env_creds})
    try:
        wait_healthy(proc, f"http://127.0.0.1:{health}/healthz", log)
        name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
        make_bucket_account(kube, namespace)  # the example runs as it (namespaces.BUCKET_ACCOUNT)
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
        if mode == "chart":
            from kubernetes import client
            lease_name = args[args.index("--lease-name") + 1]
            lease = client.CoordinationV1Api(kube.api_client).read_namespaced_lease(lease_name, namespace)
            assert lease.spec.holder_identity.startswith(env["POD_NAME"] + "_"), lease.spec.holder_identity
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text, text[-5000:]
