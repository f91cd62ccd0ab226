"""The tputorch operator as a real subprocess (`python -m tputorch run`), plus fixtures for it.

Test modules import the fixtures they use: `from operator_process import tputorch_crd, operator`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from freeports import free_port  # noqa: E402,F401 (tests import it from here)

CRD_FILE = REPO / "crds" / "tputorch.io_tputorchjobs.yaml"
CRD_FILES = [CRD_FILE, REPO / "crds" / "tputorch.io_tputorchservices.yaml"]
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str) -> tuple[int, str]:
    """(HTTP status, body) of a GET on loopback, an error status included."""
    try:
        with _no_proxy.open(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def kubectl(kubeconfig: str, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], input=input, capture_output=True,
                          text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def install_crd(kubeconfig: str) -> None:
    for path in CRD_FILES:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd/tputorchjobs.tputorch.io",
            "crd/tputorchservices.tputorch.io")


def ray_token_key_file() -> Path:
    """One key for every operator this test run starts, as the chart gives every replica the same
    one: a restarted or standby operator still reads the progress of clusters made before it."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tputorch-ray-token-key-{os.getpid()}"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
        atexit.register(path.unlink, missing_ok=True)
    return path


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_the_test() -> None:
    """In the operator's process, before it runs: SIGTERM when the test process that started it
    dies, however it dies. A test run stopped by SIGTERM or SIGKILL runs no fixture teardown and no
    atexit, and its operators would otherwise run on, reconciling a cluster nobody watches. (The
    signal follows the thread that started the process: every start here outlives its operator.)"""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _PortTaken(Exception):
    """Another process bound a port picked for the operator before it did."""


class OperatorProcess:
    """One operator process; start() blocks until its liveness endpoint answers."""

    def __init__(self, kubeconfig: str, log_path: Path, namespaces: list[str] | None = None,
                 extra_env: dict | None = None, source: Path = REPO / "operator", extra_args: list[str] | None = None,
                 dashboard_url: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.source = source  # the tputorch package's parent folder (bench/ab.py runs other revisions)
        self.log_path = log_path
        self.namespaces = namespaces or []
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []
        # The Ray heads' dashboards (a running job's progress), reached as KubeRay reaches them: the
        # stand-in dashboard is the HTTP proxy for cluster addresses; loopback (the API server) is not.
        self.proxy_env = {"HTTP_PROXY": dashboard_url, "http_proxy": dashboard_url,
                          "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1"} if dashboard_url else {}
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, timeout: float = 60, attempts: int = 3) -> "OperatorProcess":
        """Start and wait for /healthz. The ports were free when picked but another process may
        take one before the operator binds it: then start again on new ports. A start that fails
        stops the process it started."""
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                self.kill()
                self._set_aside_the_attempt(attempt)
                self.health_port, self.metrics_port = free_port(), free_port()
            except BaseException:
                self.kill()
                raise
        raise AssertionError(f"operator could not bind its ports in {attempts} attempts:\n{self.log()}")

    def _start_once(self, timeout: float) -> "OperatorProcess":
        args = [sys.executable, "-m", "tputorch", "run", "--ray-token-key-file", str(ray_token_key_file()),
                "--liveness", f"http://127.0.0.1:{self.health_port}/healthz",
                "--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port), *self.extra_args]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, **self.proxy_env, **self.extra_env,
               "PYTHONPATH": str(self.source) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        log_start = self._attempt_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                     preexec_fn=_die_with_the_test)
        log.close()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "address already in use" in self.log()[log_start:].lower():
                raise _PortTaken()  # kopf retries a failed startup: the process may run on
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with _no_proxy.open(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2):
                    if self._metrics_bound():
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"operator not healthy after {timeout}s:\n{self.log()}")

    def _set_aside_the_attempt(self, attempt: int) -> None:
        """A start that lost its port to another process logged kopf's bind Traceback: that part of
        the log moves to a file of its own, so that the checks of the operator's log (no Traceback)
        read only the process that ran."""
        with open(self.log_path, "r+b") as log:
            log.seek(self._attempt_start)
            Path(f"{self.log_path}.port-taken-{attempt}").write_bytes(log.read())
            log.truncate(self._attempt_start)

    def _metrics_bound(self) -> bool:
        try:
            with _no_proxy.open(self.metrics_url, timeout=2):
                return True
        except OSError:
            return False

    def metrics(self) -> str:
        with _no_proxy.open(self.metrics_url, timeout=5) as resp:
            return resp.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crashed pod."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def tputorch_crd(kube):
    install_crd(kube.kubeconfig)
    return CRD_FILE


@pytest.fixture
def operator(kube, kube_env, tputorch_crd, namespace, tmp_path):
    """The operator watching this test's namespace, reaching the Ray dashboards through the stand-in
    dashboard as KubeRay does; its log is printed when a test fails."""
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [namespace],
                         dashboard_url=kube_env["dashboard_url"]).start()
    yield op
    op.stop()
    assert "Traceback" not in op.log(), op.log()[-5000:]
