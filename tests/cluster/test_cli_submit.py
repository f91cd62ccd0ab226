"""The user commands against the local cluster: `tputorch submit` (plain, JSON and through a
pseudo-terminal), get/describe/logs/wait/delete, and the chart's user roles.

The CLI runs as users run it: a subprocess with a kubeconfig (`python -m tputorch`, the worktree's
source), against the real API server, the operator and KubeRay. The stand-in Ray dashboard decides
the Ray job's outcome. The driver log is the submitter pod's log, read through the API server from
KWOK's fake kubelet: each test gives that pod a log through a KWOK `Logs` object (see `driver_log`),
until the local cluster's submitter runner writes it from the Ray job itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pexpect
import pyte
import pytest
import yaml

from operator_process import kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"
IMAGE = "example.com/ray-torch-tpu:2.60.0"
UNSCHEDULABLE_TEXT = "didn't match Pod's node affinity/selector"


def cli_env(kube, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUTORCH_", "HTTP_PROXY", "http_proxy"))}
    return {**env, "KUBECONFIG": kube.kubeconfig, "PYTHONPATH": str(REPO / "operator"), **extra}


def tputorch(kube, *args, timeout=60, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tputorch", *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(kube, **env))


def as_in_a_terminal() -> None:
    """A shell that runs the tests in the background (`make test &`, a CI runner) ignores SIGINT,
    and an ignored signal stays ignored across exec: give the CLI the default disposition it has
    when a person runs it, so that Ctrl-C reaches it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen(kube, *args, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tputorch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(kube, **env),
                            preexec_fn=as_in_a_terminal)


def get_job(kube, ns, name) -> dict | None:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                      field_selector=f"metadata.name={name}")["items"]
    return items[0] if items else None


def status_is(kube, ns, name, phase, hosts_ready=None):
    def check():
        st = (get_job(kube, ns, name) or {}).get("status") or {}
        return st if st.get("phase") == phase and (hosts_ready is None or st.get("hostsReady") == hosts_ready) else None
    return check


def submitter_pod(kube, ns, name) -> str | None:
    """The running pod of KubeRay's submitter Job (the Job has the RayJob's name)."""
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items
    running = [p for p in pods if p.status.phase == "Running"]
    return running[0].metadata.name if running else None


@pytest.fixture
def driver_log(kube, namespace, tmp_path):
    """The submitter pods' log as KWOK serves it: a KWOK ClusterLogs for this namespace's
    `ray-job-submitter` containers, reading one CRI-format file. Returns a function that appends
    lines to it (a followed log shows them as they come)."""
    path = tmp_path / "driver.log"
    path.write_text("")
    name = f"driver-{namespace}"[:63]
    kube.custom.create_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "clusterlogs", {
        "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": name},
        "spec": {"selector": {"matchNamespaces": [namespace]},
                 "logs": [{"containers": ["ray-job-submitter"], "logsFile": str(path), "follow": True}]}})

    def write(lines):
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        with path.open("a") as f:
            f.write("".join(f"{now} stdout F {line}\n" for line in lines))

    yield write
    kube.custom.delete_cluster_custom_object("kwok.x-k8s.io", "v1alpha1", "clusterlogs", name)


def play_ray_job(kube, dashboard, driver_log, ns, name, lines, status="SUCCEEDED", message="", hosts="4/4"):
    """In the background, what a Ray job would do: once the slice is up and the submitter pod runs,
    print its lines on the driver log, then end with `status`. Returns the thread (see join)."""
    errors = []

    def act():
        try:
            kube.wait(status_is(kube, ns, name, "Running", hosts), 120, f"{name} Running {hosts}")
            kube.wait(lambda: submitter_pod(kube, ns, name), 60, f"submitter pod of {name}")
            driver_log(lines)
            time.sleep(3)  # the CLI shows the log while the job still runs
            dashboard.set_job_status(ns, name, status, message=message)
        except BaseException as exc:  # noqa: BLE001 (re-raised by join)
            errors.append(exc)

    t = threading.Thread(target=act, daemon=True)
    t.start()
    t.errors = errors
    return t


def join(t):
    t.join(180)
    if t.errors:
        raise t.errors[0]


# ---------------------------------------------------------------- submit


def test_submit_reaches_succeeded_with_the_driver_log_and_exits_0(kube, namespace, operator, dashboard, driver_log):
    name = "cli-ok"
    lines = ["Job submission server address: http://cli-ok-head-svc:8265",
             "(TorchTrainer) 16 workers on TPU-V6E 4x4", "epoch 1: loss 0.412", f"Job '{name}-abcde' succeeded"]
    actor = play_ray_job(kube, dashboard, driver_log, namespace, name, lines)
    out = tputorch(kube, "submit", "--tpu", "v6e-4x4", "--image", IMAGE, "--name", name, "-n", namespace,
                   "--", "python", "train.py", "--epochs", "1", timeout=240)
    join(actor)
    assert out.returncode == 0, out.stderr + out.stdout
    text = out.stdout
    assert f"tputorchjob.tputorch.io/{name} created in namespace {namespace}" in text
    assert re.search(rf"\] {name}: Running  4/4 TPU hosts", text), text
    for line in lines:
        assert line in text.splitlines(), f"driver log line {line!r} missing:\n{text}"
    assert text.rstrip().endswith(f"TPUTorchJob {namespace}/{name} Succeeded")
    # the lines come in the order a person reads them: status, then log, then the end
    assert text.index("Running  4/4 TPU hosts") < text.index(lines[0]) < text.index("Succeeded\n")
    assert get_job(kube, namespace, name)["status"]["phase"] == "Succeeded"


def test_failing_job_exits_1_with_kuberays_reason_as_json(kube, namespace, operator, dashboard, driver_log):
    name = "cli-fail"
    actor = play_ray_job(kube, dashboard, driver_log, namespace, name, ["Traceback (most recent call last):",
                                                                       "ValueError: loss is nan"],
                         status="FAILED", message="ValueError: loss is nan")
    out = tputorch(kube, "submit", "--tpu", "v6e-4x4", "--image", IMAGE, "--name", name, "-n", namespace,
                   "-o", "json", "--", "python", "train.py", timeout=240)
    join(actor)
    assert out.returncode == 1, out.stderr + out.stdout
    events = [json.loads(line) for line in out.stdout.splitlines()]  # every line is one JSON object
    kinds = [e["event"] for e in events]
    assert kinds[0] == "created" and kinds[-1] == "finished" and "status" in kinds
    assert [e["line"] for e in events if e["event"] == "log"] == ["Traceback (most recent call last):",
                                                                   "ValueError: loss is nan"]
    assert any(e["event"] == "status" and e["phase"] == "Running" and e["readyHosts"] == 4 for e in events)
    end = events[-1]
    assert (end["exitCode"], end["phase"], end["reason"]) == (1, "Failed", "AppFailed")
    assert "loss is nan" in end["message"] and "AppFailed" in end["summary"]


def test_invalid_job_exits_2_and_creates_nothing(kube, namespace, operator):
    out = tputorch(kube, "submit", "--tpu", "v6e-3x3", "--image", IMAGE, "--name", "cli-bad", "-n", namespace,
                   "--env", "TPU_VISIBLE_CHIPS=0", "--", "python", "train.py")
    assert out.returncode == 2
    assert "spec.tpu.topology: '3x3'" in out.stderr and "spec.env[0].name: 'TPU_VISIBLE_CHIPS'" in out.stderr
    assert out.stdout == ""
    assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"] == []
    # a name the API server already has is refused the same way, and the first job is untouched
    first = tputorch(kube, "submit", "--tpu", "v6e-2x2", "--image", IMAGE, "--name", "taken", "-n", namespace,
                     "--detach", "--", "python", "a.py")
    assert first.returncode == 0, first.stderr
    again = tputorch(kube, "submit", "--tpu", "v6e-2x2", "--image", IMAGE, "--name", "taken", "-n", namespace,
                     "--detach", "--", "python", "b.py")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert get_job(kube, namespace, "taken")["spec"]["entrypoint"] == "python a.py"


def test_unschedulable_slice_shows_the_schedulers_message_and_sigint_leaves_the_job(kube, namespace, operator):
    # v6e 4x8 is 8 hosts; the local cluster has no such node pool, so the TPU pods cannot schedule.
    name = "cli-nofit"
    proc = popen(kube, "submit", "--tpu", "v6e-4x8", "--image", IMAGE, "--name", name, "-n", namespace,
                 "--", "python", "train.py")
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "waiting: no node pool " in line and UNSCHEDULABLE_TEXT in line:
            break
    assert any("Pending  0/8 TPU hosts  waiting: no node pool has the node labels this slice needs: "
               "cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice, cloud.google.com/gke-tpu-topology=4x8, "
               "node.kubernetes.io/instance-type=ct6e-standard-4t;" in s
               and "Unschedulable" in s for s in seen), "".join(seen)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "keeps running" in err and f"tputorch delete {name} -n {namespace}" in err
    assert get_job(kube, namespace, name)["status"]["phase"] == "Pending"  # still there, still waiting


# ---------------------------------------------------------------- what a person sees on a terminal


class Terminal:
    """The CLI on a pseudo-terminal (pexpect), drawn by a terminal emulator (pyte): `screen()` is
    what a person sees at that moment, colours and cursor moves applied."""

    def __init__(self, kube, *args, columns=120, rows=40):
        env = cli_env(kube, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
        self.child = pexpect.spawn(sys.executable, ["-m", "tputorch", *args], env=env, encoding="utf-8",
                                   preexec_fn=as_in_a_terminal,
                                   dimensions=(rows, columns))
        self.vt = pyte.Screen(columns, rows)
        self.stream = pyte.Stream(self.vt)
        self.eof = False

    def screen(self) -> str:
        return "\n".join(line.rstrip() for line in self.vt.display).strip("\n")

    def _read(self, wait: float) -> None:
        try:
            self.stream.feed(self.child.read_nonblocking(65536, timeout=wait))
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            self.eof = True

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        """Read until the screen shows `pattern` (a regex); returns the screen."""
        end = time.monotonic() + timeout
        while not re.search(pattern, self.screen()):
            if self.eof or time.monotonic() > end:
                pytest.fail(f"the screen never showed {pattern!r}; it shows:\n{self.screen()}")
            self._read(0.5)
        return self.screen()

    def finish(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while not self.eof and time.monotonic() < end:
            self._read(0.5)
        self.child.close()
        return self.child.exitstatus


def test_live_progress_on_a_terminal(kube, namespace, operator, dashboard, driver_log):
    name = "cli-tty"
    actor = play_ray_job(kube, dashboard, driver_log, namespace, name, ["step 10: loss 0.25", "training done"])
    term = Terminal(kube, "submit", "--tpu", "v6e-4x4", "--image", IMAGE, "--name", name, "-n", namespace,
                    "--", "python", "train.py")
    running = term.wait_for(r"Running +TPUTorchJob")
    assert f"✓ TPUTorchJob {namespace}/{name} created" in running
    # the panel while the Ray job runs: phase, the full hosts bar, the Ray job's status
    running = term.wait_for(r"(?m)^TPU hosts ━{30} 4/4\nRay job +RUNNING$")
    assert re.search(r"(?m)^. Running +TPUTorchJob", running), running
    assert term.finish() == 0, term.screen()
    join(actor)
    # the end: the driver log above, the last panel, and the outcome as the last line
    lines = term.screen().splitlines()
    assert lines[0] == f"✓ TPUTorchJob {namespace}/{name} created"
    assert lines[1:3] == ["step 10: loss 0.25", "training done"], lines
    assert re.match(rf"^ ?Succeeded +TPUTorchJob {namespace}/{name} +\d+:\d\d$", lines[3]), lines
    assert lines[4:] == ["TPU hosts " + "━" * 30 + " 4/4", "Ray job   SUCCEEDED", f"✓ TPUTorchJob {namespace}/{name} Succeeded"]


def test_ctrl_c_on_a_terminal_exits_130_and_says_how_to_follow(kube, namespace, operator):
    name = "cli-tty-nofit"
    term = Terminal(kube, "submit", "--tpu", "v6e-4x8", "--image", IMAGE, "--name", name, "-n", namespace,
                    "--", "python", "train.py", columns=250)
    waiting = term.wait_for(r"Waiting +no node pool [\s\S]*Unschedulable")
    assert re.search(r"Pending +TPUTorchJob", waiting) and re.search(r"^TPU hosts ━+ 0/8$", waiting, re.M), waiting
    unwrapped = re.sub(r"\s*\n\s*", " ", waiting)  # the message wraps in the table's second column
    assert re.search(r"Waiting +no node pool has the node labels this slice needs: .*gke-tpu-topology=4x8, node.kubernetes.io/instance-type=ct6e-standard-4t;", unwrapped), waiting
    assert re.search(rf"pod {name}-\S+: Unschedulable: .*nodes are available: .*{re.escape(UNSCHEDULABLE_TEXT)}",
                     unwrapped), waiting
    term.child.sendintr()  # Ctrl-C from the terminal: SIGINT to the foreground process
    assert term.finish() == 130, term.screen()
    assert f"keeps running. Follow it: tputorch logs -f {name} -n {namespace}" in term.screen().replace("\n", "")
    assert get_job(kube, namespace, name)["status"]["phase"] == "Pending"


# ---------------------------------------------------------------- get / describe / logs / wait / delete


def test_get_describe_logs_wait_delete(kube, namespace, operator, dashboard, driver_log):
    name = "cli-manage"
    created = tputorch(kube, "submit", "--tpu", "v6e-4x4", "--image", IMAGE, "--name", name, "-n", namespace,
                       "--detach", "--", "python", "train.py")
    assert created.returncode == 0, created.stderr
    assert f"tputorch logs -f {name} -n {namespace}" in created.stderr
    waited = tputorch(kube, "wait", name, "-n", namespace, "--for", "condition=SliceReady", "--timeout", "2m", timeout=150)
    assert waited.returncode == 0, waited.stderr
    kube.wait(lambda: submitter_pod(kube, namespace, name), 60, "submitter pod")
    driver_log(["hello from the driver"])

    got = tputorch(kube, "get", "-n", namespace)
    assert got.returncode == 0, got.stderr
    header, row = got.stdout.splitlines()
    assert header.split()[:6] == ["NAME", "KIND", "ACCELERATOR", "TOPOLOGY", "PHASE", "HOSTS"]
    assert row.split()[:6] == [name, "ttj", "v6e", "4x4", "Running", "4/4"]
    as_json = json.loads(tputorch(kube, "get", name, "-n", namespace, "-o", "json").stdout)
    assert [o["metadata"]["name"] for o in as_json["items"]] == [name]

    described = tputorch(kube, "describe", name, "-n", namespace)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert "Phase:       Running" in text and re.search(r"SliceReady\s+True\s+AllHostsReady", text), text
    tpu_nodes = re.findall(rf"{name}-\S+\s+worker\s+(gke-tpu-v6e-4x4-\S+)\s+Running", text)
    assert len(set(tpu_nodes)) == 4, text  # each TPU host on its own node of the slice's pool
    assert re.search(r"\s+head\s+gke-cpu-pool-\d", text) and re.search(r"\s+submitter\s+gke-", text)
    # one event per transition: AllHostsReady, or Running when both came in one status write
    assert re.search(r"Normal\s+(AllHostsReady|Running)", text), text

    logs = tputorch(kube, "logs", name, "-n", namespace)
    assert (logs.returncode, logs.stdout) == (0, "hello from the driver\n"), logs.stderr

    wrong = tputorch(kube, "wait", name, "-n", namespace, "--for", "phase=Succeeded", "--timeout", "3s")
    assert wrong.returncode == 1 and "timed out after 3s" in wrong.stderr
    dashboard.set_job_status(namespace, name, "SUCCEEDED")
    done = tputorch(kube, "wait", name, "-n", namespace, "--for", "phase=Succeeded", "--timeout", "2m", timeout=150)
    assert done.returncode == 0 and f"{name} phase Succeeded" in done.stdout, done.stderr
    never = tputorch(kube, "wait", name, "-n", namespace, "--for", "phase=Running", "--timeout", "1m")
    assert never.returncode == 1 and "Succeeded" in never.stderr  # ended: it cannot become Running any more

    deleted = tputorch(kube, "delete", name, "-n", namespace)
    assert deleted.returncode == 0 and deleted.stdout.strip() == f"tputorchjob.tputorch.io/{name} deleted"
    kube.wait(lambda: get_job(kube, namespace, name) is None, 30, "job gone")
    missing = tputorch(kube, "describe", name, "-n", namespace)
    assert missing.returncode == 1 and "no TPUTorchJob or TPUTorchService" in missing.stderr


def test_namespace_and_context_come_from_the_kubeconfig(kube, namespace, operator, tmp_path):
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    ctx = admin["contexts"][0]
    admin["contexts"].append({"name": "team", "context": {**ctx["context"], "namespace": namespace}})
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump(admin))
    out = tputorch(kube, "submit", "--tpu", "v6e-2x2", "--image", IMAGE, "--name", "cli-ctx", "--context", "team",
                   "--detach", "--", "python", "t.py", KUBECONFIG=str(cfg))
    assert out.returncode == 0, out.stderr
    assert get_job(kube, namespace, "cli-ctx") is not None
    listed = tputorch(kube, "get", "--context", "team", KUBECONFIG=str(cfg))
    assert listed.stdout.splitlines()[1].split()[0] == "cli-ctx"
    bad = tputorch(kube, "get", "--context", "nope", KUBECONFIG=str(cfg))
    assert bad.returncode == 1 and "'nope'" in bad.stderr and "team" in bad.stderr


# ---------------------------------------------------------------- the chart's user roles


def test_chart_user_roles_let_editors_submit_and_viewers_read(kube, namespace, tputorch_crd):
    from kubernetes import client

    from test_chart_install import HELM, helm

    if HELM is None:
        pytest.fail("no helm binary (hack/build.sh helm)")
    release = f"roles-{uuid.uuid4().hex[:5]}"
    helm(kube.kubeconfig, "install", release, str(REPO / "charts" / "tputorch-operator"), "--namespace", namespace)
    alice, bob = f"alice-{namespace}", f"bob-{namespace}"
    authz = client.AuthorizationV1Api(kube.api_client)
    try:
        for user, role in ((alice, "edit"), (bob, "view")):
            kubectl(kube.kubeconfig, "create", "rolebinding", f"{role}-{user}", "-n", namespace,
                    f"--clusterrole={role}", f"--user={user}")

        def can_i(user, verb, resource) -> bool:  # as an admin asks: kubectl auth can-i --as
            out = kubectl(kube.kubeconfig, "auth", "can-i", verb, resource, f"--as={user}", "-n", namespace, check=False)
            return out.stdout.strip() == "yes"

        def can(user, verb, resource, group="tputorch.io", subresource="", ns=namespace) -> bool:
            # A SubjectAccessReview needs no discovery, so it also answers for TPUTorchServices,
            # whose CRD this cluster may not have (kubectl auth can-i cannot name it then).
            review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
                user=user, resource_attributes=client.V1ResourceAttributes(
                    namespace=ns, verb=verb, group=group, resource=resource, subresource=subresource)))
            return authz.create_subject_access_review(review).status.allowed

        # aggregation is done by the controller manager: wait until it has merged the rules
        kube.wait(lambda: can_i(alice, "create", "tputorchjobs.tputorch.io") and can_i(bob, "list", "tputorchjobs.tputorch.io"),
                  60, "aggregated roles")
        assert not can_i(bob, "create", "tputorchjobs.tputorch.io") and can_i(alice, "get", "pods/log")
        for kind in ("tputorchjobs", "tputorchservices"):
            for verb in ("create", "delete", "patch", "get", "list", "watch"):
                assert can(alice, verb, kind), f"edit: {verb} {kind}"
            for verb in ("get", "list", "watch"):
                assert can(bob, verb, kind), f"view: {verb} {kind}"
            for verb in ("create", "delete", "patch"):
                assert not can(bob, verb, kind), f"view must not {verb} {kind}"
            assert not can(alice, "patch", kind, subresource="status"), "only the operator writes status"
        assert can(alice, "get", "pods", group="", subresource="log")
        # bound in this namespace only
        assert not can(alice, "create", "tputorchjobs", ns="default")
    finally:
        helm(kube.kubeconfig, "uninstall", release, "--namespace", namespace, check=False)
