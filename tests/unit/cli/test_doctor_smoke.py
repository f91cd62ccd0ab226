"""`tputorch doctor --smoke`'s pure parts: the probe's objects and the verdict on its RayJob."""

from tputorch import render
from tputorch.api import network
from tputorch.cli import doctor, smoke


def test_the_probe_is_the_operators_rayjob_with_no_tpu_host():
    policy = render.NetworkPolicyConfig("strict", (network.parse_peer_text("kuberay-system"),))
    rayjob, secret, policy_obj = smoke.smoke_objects("ns", "tputorch-smoke-1", "img", "tok", policy, "ray-sa")
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert [g["replicas"] for g in cluster["workerGroupSpecs"]] == [0]
    assert cluster["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}
    assert secret["stringData"] == {render.RAY_AUTH_TOKEN_KEY: "tok"}
    assert rayjob["spec"]["submissionMode"] == "K8sJobMode"
    assert cluster["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "ray-sa"
    dashboard = [r for r in policy_obj["spec"]["ingress"] if {"protocol": "TCP", "port": 8265} in r.get("ports", [])]
    assert dashboard and dashboard[0]["from"] == [policy.peers[0].selector()]  # strict: the peers only
    assert smoke.smoke_objects("ns", "n", "img", "tok", None)[2] is None


def status(**st):
    return {"status": st}


def test_verdicts():
    assert smoke.verdict(status(jobDeploymentStatus="Running", jobStatus="RUNNING"), 5, 60) is None
    ok = smoke.verdict(status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"), 5, 60)
    assert ok.status == doctor.OK
    unreachable = smoke.verdict(status(jobDeploymentStatus="Failed", reason="JobDeploymentStatusTransitionGracePeriodExceeded",
                                       message="..."), 40, 60)
    assert unreachable.status == doctor.FAIL and "KubeRay could not reach the Ray dashboard" in unreachable.message
    assert "networkPolicy.mode=open" in unreachable.fix
    failed = smoke.verdict(status(jobDeploymentStatus="Failed", jobStatus="FAILED", message="exit 1"), 40, 60)
    assert failed.status == doctor.FAIL and "exit 1" in failed.message and "could not reach" not in failed.message
    stuck = smoke.verdict(status(jobDeploymentStatus="Initializing", rayClusterStatus={"state": "ready"}), 61, 60)
    assert "could not reach the Ray dashboard" in stuck.message
    late = smoke.verdict(status(jobDeploymentStatus="Running", jobStatus="RUNNING"), 61, 60)
    assert late.status == doctor.FAIL and "no outcome within 60 s" in late.message
