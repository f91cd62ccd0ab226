"""The docs' commands against the local cluster: every `kubectl`, `helm install|upgrade` and
`tputorch submit|serve|get|describe|wait|delete` of README.md and docs/*.md, in the order a reader
runs them, one script per document (tests/doccmds.py says which commands and how they change).

The reader's world, as far as it exists here: each document runs in a fresh namespace, the
context's, as if a new reader had only that page; one operator watches them all, and every Ray
job succeeds a moment after it starts (the stand-in dashboard is told so as soon as its RayJob
appears: no Ray runs in KWOK's pods). Namespaces a document creates are deleted afterwards. Then
the generated metrics table (docs/reference/metrics.md) is compared with what that operator serves, and every
example manifest, and the RayJob or RayService it renders to, is admitted by the API server
(server-side dry run with the CRDs and KubeRay's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import doccmds  # noqa: E402

ROOT = doccmds.ROOT
COMMANDS = doccmds.all_commands()
sys.path.insert(0, str(ROOT / "operator"))
from tputorch import render  # noqa: E402
from tputorch.api import spec  # noqa: E402


def shim_path(tmp: Path) -> str:
    """`tputorch` (and `kubectl-tputorch`) of this checkout, as `pip install .` makes them, and the
    helm the chart tests use."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("tputorch", "kubectl-tputorch"):
        (bin_dir / name).write_text(f'#!/bin/sh\nPYTHONPATH={ROOT / "operator"} exec {sys.executable} -m tputorch "$@"\n')
        (bin_dir / name).chmod(0o755)
    helm = doccmds.find_helm()
    assert helm, "no helm binary (hack/build.sh helm)"
    doccmds.helm_shim(bin_dir, helm)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def context_in(kube, namespace: str, path: Path) -> Path:
    """A copy of the cluster's kubeconfig whose context's namespace is the given one, as a reader's
    `kubectl config set-context --current --namespace` would make it."""
    cfg = yaml.safe_load(Path(kube.kubeconfig).read_text())
    for ctx in cfg["contexts"]:
        if ctx["name"] == cfg["current-context"]:
            ctx["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(cfg))
    return path


class JobsSucceed:
    """Tells the stand-in dashboard that every RayJob of the namespaces succeeds, as soon as it
    appears (the dashboard applies it to the job KubeRay then submits)."""

    def __init__(self, kube, dashboard, namespaces):
        self.kube, self.dashboard, self.namespaces = kube, dashboard, namespaces
        self.seen: set = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop.wait(0.5):
            for ns in self.namespaces:
                try:
                    items = self.kube.custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayjobs")["items"]
                except Exception:  # noqa: BLE001 (a hiccup of the API server: looked at again in 0.5 s)
                    continue
                for rj in items:
                    if rj["metadata"]["uid"] not in self.seen:
                        self.dashboard.set_job_status(ns, rj["metadata"]["name"], "SUCCEEDED")
                        self.seen.add(rj["metadata"]["uid"])

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def metrics_in_the_docs() -> set:
    """The metric names in the first column of the metrics reference's table (hack/gen_reference.py
    writes it from controller/metrics.py; this checks that it finds every metric served)."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    table = text[text.index("| metric | type | labels | description |"):].split("\n\n", 1)[0]
    return {m for row in table.splitlines()[2:] for m in re.findall(r"`(tputorch_[a-z_]+)", row.split("|")[1])}


def test_the_docs_commands_run_on_the_local_cluster(kube, tputorch_crd, dashboard, tmp_path):  # noqa: F811
    cmds = [c for c in COMMANDS if c.marker is None]
    docs = sorted({c.doc for c in cmds if c.kind == "cluster"})
    assert "README.md" in docs and "docs/getting-started.md" in docs
    spaces = {doc: make_namespace(kube, f"docs-{re.sub(r'[^a-z0-9]+', '-', doc.lower())[:30]}-{uuid.uuid4().hex[:5]}")
              for doc in docs}
    # `kubectl create namespace X` runs for real: X must not exist yet (an interrupted run's)
    by_kubectl = sorted({ns for c in cmds if not c.run.startswith("helm") for ns in c.namespaces})
    for ns in by_kubectl:
        delete_namespace(kube, ns)
    # `helm install --create-namespace` becomes a dry run, which needs the namespace
    by_helm = sorted({ns for c in cmds if c.run.startswith("helm") for ns in c.namespaces} - set(by_kubectl))
    made = [ns for ns in by_helm if kubectl(kube.kubeconfig, "create", "namespace", ns, check=False).returncode == 0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUTORCH_", "HTTP_PROXY", "http_proxy", "PYTHONPATH"))}
    env.update(PATH=shim_path(tmp_path), HELM_CACHE_HOME=str(tmp_path / "helm"), HELM_CONFIG_HOME=str(tmp_path / "helm"),
               HELM_DATA_HOME=str(tmp_path / "helm"))
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", list(spaces.values())).start()
    try:
        with JobsSucceed(kube, dashboard, list(spaces.values())):
            for doc, ns in spaces.items():
                script = doccmds.script([c for c in cmds if c.doc == doc], {"shell", "cluster"})
                out = subprocess.run(["bash", "-c", script], cwd=ROOT, input="hf_not_a_real_token\n" * 20,
                                     env={**env, "KUBECONFIG": str(context_in(kube, ns, tmp_path / f"{ns}.kubeconfig"))},
                                     capture_output=True, text=True, timeout=600)
                assert out.returncode == 0, (f"a command of {doc} failed (the last +++ line):\n{out.stderr[-4000:]}\n"
                                             f"stdout:\n{out.stdout[-2000:]}\noperator:\n{op.log()[-2000:]}")
        # prometheus_client names a counter's family without the _total its samples carry
        served = {name + ("_total" if kind == "counter" and not name.endswith("_total") else "")
                  for name, kind in re.findall(r"^# TYPE (tputorch_\w+) (\w+)", op.metrics(), re.M)}
    finally:
        op.stop()
        for ns in [*spaces.values(), *by_kubectl, *made]:
            delete_namespace(kube, ns, wait=False)
        for ns in spaces.values():  # their pods hold the fake slices the next tests need
            delete_namespace(kube, ns)
    assert "Traceback" not in op.log(), op.log()[-5000:]
    assert served == metrics_in_the_docs(), \
        f"docs/reference/metrics.md and the served metrics differ: {sorted(served ^ metrics_in_the_docs())}"


EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))


def test_every_example_and_its_child_is_admitted(kube, tputorch_crd, tmp_path):  # noqa: F811
    """Server-side dry run of each example and of the RayJob/RayService it renders to, in one call:
    the CRDs' schema and CEL rules, and KubeRay's CRD schema for the child (kubectl's strict field
    validation: a field KubeRay does not know is an error). examples/kueue's own kinds only where the
    cluster serves Kueue's API (KUEUE=1); its TPUTorchJob always."""
    namespace = make_namespace(kube, f"docs-examples-{uuid.uuid4().hex[:5]}")
    docs = []
    for path in EXAMPLES:
        for d in yaml.safe_load_all(path.read_text()):
            if not d:
                continue
            docs.append(d)
            if d.get("kind") in ("TPUTorchJob", "TPUTorchService"):
                docs.append(render.render_any(spec.parse_any(d)))
    assert {d["kind"] for d in docs} >= {"TPUTorchJob", "TPUTorchService", "RayJob", "RayService"}
    # Kueue's kinds (examples/kueue) are served only when the session runs Kueue (KUEUE=1)
    served = set(kubectl(kube.kubeconfig, "api-versions").stdout.split())
    left = [d for d in docs if d["apiVersion"] not in served]
    assert {d["apiVersion"].split("/")[0] for d in left} <= {"kueue.x-k8s.io"}, left
    docs = [d for d in docs if d["apiVersion"] in served]
    for d in docs:
        if d["kind"] not in ("ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass"):
            d["metadata"]["namespace"] = namespace
    try:
        out = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
                      input=yaml.safe_dump_all(docs), check=False)
    finally:
        delete_namespace(kube, namespace, wait=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(server dry run)") == len(docs), out.stdout


def test_the_service_crd_is_installable_and_its_serve_rule_still_holds(kube, tputorch_crd, tmp_path):  # noqa: F811
    """The CRD went onto the API server (the fixture applied it: its serve rule once broke that), and
    the rule still refuses maxOngoingRequests below targetOngoingRequests."""
    namespace = make_namespace(kube, f"docs-serve-rule-{uuid.uuid4().hex[:5]}")
    svc = yaml.safe_load((ROOT / "examples" / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    svc["metadata"]["namespace"] = namespace
    try:
        ok = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(svc), check=False)
        svc["spec"]["serve"] = {"targetOngoingRequests": 64, "maxOngoingRequests": 8}
        bad = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(svc), check=False)
    finally:
        delete_namespace(kube, namespace, wait=False)
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode != 0 and "maxOngoingRequests must be at least" in bad.stderr, bad.stderr
