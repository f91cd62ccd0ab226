"""The operator under RBAC cut down in one of its namespaces: it runs as its own ServiceAccount
with the chart's namespaced Roles, one of them reduced.

- Pods listed but not watched (issue 20): the job there says why its hosts cannot be seen
  (SliceReady=Unknown, PodsForbidden, and a Warning event), the operator says Forbidden once in its
  log and keeps running, and the job in the other namespace runs as usual.
- Secrets not creatable (issue 21): the job's RayJob is made but not its Ray token Secret; KubeRay's
  pods wait for it (CreateContainerConfigError, the stand-in's kubelet) and the job says both. The
  operator is stopped, the grant given, a new process started: it makes the Secret of the RayJob it
  finds (level-based), the pods start and the job runs to its end."""

from __future__ import annotations

import uuid

import pytest
import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)
from test_chart_install import CHART, HELM, helm, sa_kubeconfig
from test_operator_e2e import apply, condition, get_rayjob, job_body, job_status, pods_of, wait_events, wait_phase

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(HELM is None, reason="no helm binary (hack/build.sh helm, or set $HELM)")]


def chart_rbac(kube, release: str, sa_ns: str, watched: list[str]) -> list[dict]:
    """The chart's ServiceAccount and RBAC for namespaced mode over ``watched``."""
    docs = yaml.safe_load_all(helm(kube.kubeconfig, "template", release, str(CHART), "--namespace", sa_ns,
                                   "--set", f"watchNamespaces={{{','.join(watched)}}}").stdout)
    return [d for d in docs if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                   "RoleBinding")]


def without_pod_watch(role: dict) -> dict:
    """The Role with every grant on pods kept except watch."""
    rules = []
    for rule in role["rules"]:
        if "" in rule.get("apiGroups", []) and "pods" in rule.get("resources", []):
            others = [r for r in rule["resources"] if r != "pods"]
            if others:
                rules.append({**rule, "resources": others})
            rules.append({**rule, "resources": ["pods"], "verbs": [v for v in rule["verbs"] if v != "watch"]})
        else:
            rules.append(rule)
    assert rules != role["rules"], "the chart's Role grants no watch on pods any more: update this test"
    return {**role, "rules": rules}


@pytest.fixture
def three_namespaces(kube):
    names = [make_namespace(kube, f"rbac-{role}-{uuid.uuid4().hex[:5]}") for role in ("op", "nowatch", "ok")]
    yield names
    for name in names:
        delete_namespace(kube, name, wait=False)


def test_pods_listed_but_not_watched_in_one_namespace(kube, tputorch_crd, three_namespaces, tmp_path):
    op_ns, no_watch, ok = three_namespaces
    release = f"rbac-{uuid.uuid4().hex[:5]}"
    docs = chart_rbac(kube, release, op_ns, [no_watch, ok])
    docs = [without_pod_watch(d) if d["kind"] == "Role" and d["metadata"]["namespace"] == no_watch else d for d in docs]
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    op = OperatorProcess(sa_kubeconfig(kube, op_ns, sa, tmp_path / "sa.kubeconfig"), tmp_path / "operator.log",
                         [no_watch, ok]).start()
    try:
        apply(kube, no_watch, job_body("blind", topo="2x2"))
        apply(kube, ok, job_body("seen", topo="2x2"))
        st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "PodsForbidden" else None)(
            job_status(kube, no_watch, "blind")), 120, "SliceReady=PodsForbidden")
        c = condition(st, "SliceReady")
        assert c["status"] == "Unknown"
        assert c["message"].startswith(f"the operator may not watch pods in namespace {no_watch} ("), c["message"]
        assert "grant its ServiceAccount get, list and watch on pods there" in c["message"]
        wait_events(kube, no_watch, "blind", ("Warning", "PodsForbidden"))
        # The other namespace is reconciled from its pods as usual.
        wait_phase(kube, ok, "seen", "Running", 180)
        seen = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "AllHostsReady" else None)(
            job_status(kube, ok, "seen")), 120, "the other namespace's slice ready")
        assert seen["hostsReady"] == "1/1"
        assert op.proc.poll() is None, "the operator exited"
        log = op.log()
        refused = [line for line in log.splitlines() if f"may not watch pods in {no_watch}" in line]
        assert len(refused) == 1, log  # once per streak, however often it re-lists meanwhile
        assert "Traceback" not in log, log
        assert condition(job_status(kube, no_watch, "blind"), "SliceReady")["reason"] == "PodsForbidden"
    finally:
        op.stop()
        for d in docs:  # the namespaced ones go with their namespaces
            if d["kind"].startswith("Cluster"):
                kubectl(kube.kubeconfig, "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found", check=False)


def without_secret_create(role: dict) -> dict:
    rules = [r for r in role["rules"] if not ("" in r.get("apiGroups", []) and "secrets" in r.get("resources", []))]
    assert rules != role["rules"], "the chart's Role grants no create on secrets any more: update this test"
    return {**role, "rules": rules}


@pytest.fixture
def two_namespaces(kube):
    names = [make_namespace(kube, f"rbac-{role}-{uuid.uuid4().hex[:5]}") for role in ("op", "nosecret")]
    yield names
    for name in names:
        delete_namespace(kube, name, wait=False)


def waiting_messages(kube, ns: str, job: str) -> dict[str, str]:
    """pod/container -> the message of a container waiting with CreateContainerConfigError."""
    out = {}
    for p in pods_of(kube, ns, job):
        for cs in (p.status.init_container_statuses or []) + (p.status.container_statuses or []):
            if cs.state and cs.state.waiting and cs.state.waiting.reason == "CreateContainerConfigError":
                out[f"{p.metadata.name}/{cs.name}"] = cs.state.waiting.message
    return out


def test_a_secret_never_made_is_made_by_the_next_operator_process(kube, tputorch_crd, two_namespaces, dashboard, tmp_path):
    op_ns, ns = two_namespaces
    release = f"rbac-{uuid.uuid4().hex[:5]}"
    granted = chart_rbac(kube, release, op_ns, [ns])
    docs = [without_secret_create(d) if d["kind"] == "Role" and d["metadata"]["namespace"] == ns else d for d in granted]
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    config = sa_kubeconfig(kube, op_ns, sa, tmp_path / "sa.kubeconfig")
    op = OperatorProcess(config, tmp_path / "operator.log", [ns]).start()
    try:
        apply(kube, ns, job_body("locked", topo="2x2"))
        secret = kube.wait(
            lambda: (get_rayjob(kube, ns, "locked")["spec"]["rayClusterSpec"].get("authOptions") or {}).get("secretName"),
            60, "the RayJob naming its token Secret")
        # KubeRay's pods wait for the Secret, as a kubelet keeps them (head and TPU host)
        waiting = kube.wait(lambda: (lambda w: w if len(w) >= 2 else None)(waiting_messages(kube, ns, "locked")),
                            120, "pods in CreateContainerConfigError")
        assert set(waiting.values()) == {f'secret "{secret}" not found'}, waiting
        assert {p.status.phase for p in pods_of(kube, ns, "locked")} == {"Pending"}, "no container of theirs started"
        # the job says both: the Secret the operator may not create, and what its pods wait for
        st = kube.wait(lambda: (lambda s: s if condition(s, "SliceReady").get("reason") == "CreateContainerConfigError"
                                and condition(s, "RayJobCreated").get("reason") == "RayTokenSecretNotCreated" else None)(
            job_status(kube, ns, "locked")), 120, "the job naming the missing Secret")
        assert st["phase"] == "Pending"
        assert f"the Secret {secret} with the Ray cluster's auth token could not be created" in condition(st, "RayJobCreated")["message"]
        assert f'secret "{secret}" not found' in condition(st, "SliceReady")["message"]
        wait_events(kube, ns, "locked", ("Warning", "RayTokenSecretNotCreated"))
    finally:
        op.stop()
    assert "Traceback" not in op.log(), op.log()[-5000:]

    kubectl(kube.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(granted))  # the grant, given back
    again = OperatorProcess(config, tmp_path / "operator2.log", [ns]).start()  # empty memory
    try:
        st = wait_phase(kube, ns, "locked", "Running", 180)
        assert condition(st, "RayJobCreated")["status"] == "True" and condition(st, "SliceReady")["status"] == "True"
        assert waiting_messages(kube, ns, "locked") == {}
        made = kube.core.read_namespaced_secret(secret, ns)
        (owner,) = made.metadata.owner_references
        assert (owner.kind, owner.uid) == ("RayJob", get_rayjob(kube, ns, "locked")["metadata"]["uid"])
        assert f"Secret {ns}/{secret}" in again.log()
        dashboard.set_job_status(ns, "locked", "SUCCEEDED")
        wait_phase(kube, ns, "locked", "Succeeded", 120)
        assert "Traceback" not in again.log(), again.log()[-5000:]
    finally:
        again.stop()
        for d in granted:
            if d["kind"].startswith("Cluster"):
                kubectl(kube.kubeconfig, "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found", check=False)
