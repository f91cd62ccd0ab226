"""docs/tasks/kueue.md's two teams on real Kueue v0.19.1 and the real KubeRay operator: the doc's own
commands (taken from the docs: doccmds.tested_by) make the namespaces, the two ClusterQueues in a
cohort, their LocalQueues and the priority policy; then team A borrows team B's idle slice, team
B's job takes it back, and a priority class team A's namespace may not use is refused.

What is checked is what Kueue and the API server report (ClusterQueue usage, Workload conditions, a
refused apply), besides the operator's status. Shares the Kueue test_kueue.py starts (its `kueue`
fixture: `hack/cluster.sh up` with KUEUE=1 on a cluster already running it changes nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from namespaces import delete_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)
from test_kueue import KUEUE, apply, condition, job_body, kueue, status, workload_of  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import doccmds  # noqa: E402

REPO = doccmds.ROOT
TEAMS = ("team-a", "team-b")
POLICY = "tputorch-priority-classes"


def namespace_gone(kube, name: str) -> bool:
    from kubernetes.client.rest import ApiException
    try:
        kube.core.read_namespace(name)
    except ApiException as err:
        return err.status == 404
    return False


def remove_teams(kube) -> None:
    """What the doc's commands made (an interrupted run's too): nothing of it may outlive the module,
    least of all the policy, which would refuse the priority classes of every later test."""
    kubectl(kube.kubeconfig, "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", POLICY,
            "--ignore-not-found", check=False)
    for ns in TEAMS:
        delete_namespace(kube, ns)
    kubectl(kube.kubeconfig, "delete", "clusterqueue", *TEAMS, "--ignore-not-found", check=False)
    for ns in TEAMS:  # `kubectl create namespace` needs the old one wholly gone
        kube.wait(lambda: namespace_gone(kube, ns), 120, f"namespace {ns} deleted")


@pytest.fixture(scope="module")
def teams(kueue, kube_env, tputorch_crd, tmp_path_factory):  # noqa: F811
    """The doc's commands, as a reader runs them; an operator watching both team namespaces."""
    kube = kueue
    remove_teams(kube)
    cmds = doccmds.tested_by("tests/cluster/test_kueue_teams.py")
    assert len(cmds) >= 5, [c.where for c in cmds]
    try:
        for c in cmds:
            out = subprocess.run(["bash", "-c", c.text], cwd=REPO, capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)})
            assert out.returncode == 0, f"{c.where}: {c.text}\n{out.stderr}"
        op = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("teams") / "operator.log", list(TEAMS),
                             dashboard_url=kube_env["dashboard_url"]).start()
        try:
            yield kube
        finally:
            op.stop()
            assert "Traceback" not in op.log(), op.log()[-5000:]
    finally:
        remove_teams(kube)


def tpu_usage(kube, cluster_queue: str) -> dict:
    """google.com/tpu of the ClusterQueue's v6e-4x4 flavor as Kueue reports it: total and borrowed chips."""
    cq = kube.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", cluster_queue)
    for flavor in (cq.get("status") or {}).get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            if flavor["name"] == "v6e-4x4" and res["name"] == "google.com/tpu":
                return {"total": str(res.get("total", "0")), "borrowed": str(res.get("borrowed", "0"))}
    return {"total": "0", "borrowed": "0"}


def admitted_by(kube, ns: str, name: str) -> str | None:
    st = status(kube, ns, name)
    return st.get("clusterQueue") if condition(st, "Admitted").get("status") == "True" else None


def test_team_a_borrows_team_b_reclaims_and_a_priority_class_outside_the_namespace_is_refused(teams):
    kube = teams
    a, b = TEAMS
    # team A: two v6e 4x4 jobs on a quota of one slice; the second runs on team B's idle slice
    for name in ("a1", "a2"):
        apply(kube, a, job_body(name))
    kube.wait(lambda: all(admitted_by(kube, a, n) == "team-a" for n in ("a1", "a2")), 120,
              "both of team A's jobs admitted by ClusterQueue team-a")
    # Kueue writes a ClusterQueue's usage in its own later status update, after the Workloads' Admitted
    kube.wait(lambda: tpu_usage(kube, "team-a") == {"total": "32", "borrowed": "16"}, 60,
              "team-a's usage: two slices, one borrowed from team-b")

    # team B's own job takes its slice back: Kueue preempts the job of A's that borrowed it
    apply(kube, b, job_body("b1"))
    kube.wait(lambda: admitted_by(kube, b, "b1") == "team-b", 120, "team B's job admitted by ClusterQueue team-b")
    preempted = kube.wait(lambda: [n for n in ("a1", "a2") if admitted_by(kube, a, n) is None], 60,
                          "one of team A's jobs preempted")
    assert len(preempted) == 1
    workload = workload_of(kube, a, preempted[0])
    reasons = {c["type"]: c.get("reason") for c in workload["status"]["conditions"]}
    assert reasons.get("Preempted") == "InCohortReclamation", workload["status"]["conditions"]
    st = kube.wait(lambda: (lambda s: s if s.get("phase") in ("Preempted", "Queued") else None)(
        status(kube, a, preempted[0])), 60, f"{preempted[0]} Preempted or Queued again")
    assert "preempted" in st["message"], st["message"]
    kube.wait(lambda: tpu_usage(kube, "team-a") == {"total": "16", "borrowed": "0"}, 60,
              "team A back within its own quota")

    # the policy: team A may use tpu-low only, team B tpu-high too
    refused = kubectl(kube.kubeconfig, "apply", "-n", a, "-f", "-", input=yaml.safe_dump(job_body("a-high", "tpu-high")),
                      check=False)
    assert refused.returncode != 0
    assert "priority class tpu-high is not one namespace team-a may use: it may use tpu-low" in refused.stderr, refused.stderr
    assert POLICY in refused.stderr
    # the same label on a RayJob made directly, past the operator
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "direct", "labels": {"kueue.x-k8s.io/priority-class": "tpu-high"}},
              "spec": {"entrypoint": "python x.py"}}
    refused = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-n", a, "-f", "-", input=yaml.safe_dump(rayjob),
                      check=False)
    assert refused.returncode != 0 and "tpu-high is not one namespace team-a may use" in refused.stderr, refused.stderr
    allowed = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-n", b, "-f", "-",
                      input=yaml.safe_dump(job_body("b-high", "tpu-high")), check=False)
    assert allowed.returncode == 0, allowed.stderr
