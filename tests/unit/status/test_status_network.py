"""The status of an object's NetworkPolicy, and the network named as the cause of what KubeRay reports."""

from tputorch import status
from tputorch.api import spec
from tputorch.status.network import NetworkPolicyState

from ..jobs import body
from .test_status_service import SVC, derive_service, rayservice, slice_hosts

T0 = "2026-11-29T10:00:00Z"
STRICT = NetworkPolicyState("ml", "demo-rayjob", dashboard_open=False, peers=("tputorch-system:app=tputorch-operator",))
OPEN = NetworkPolicyState("ml", "demo-rayjob", dashboard_open=True)
# KubeRay 1.6 (checkSubmitterFinishedTimeoutAndUpdateStatusIfNeeded): the submitter ended 30 s ago and
# GetJobInfo never answered, so the job is marked failed whatever the run did.
GRACE_EXCEEDED = {
    "jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
    "reason": "JobDeploymentStatusTransitionGracePeriodExceeded",
    "message": "The RayJob submitter finished at 2026-11-29 10:05:00 but the ray job did not reach terminal state within 30s",
    "rayClusterName": "demo-x7k2p", "startTime": "2026-11-29T10:00:00Z",
}


def cond(st, ctype):
    return next((c for c in st["conditions"] if c["type"] == ctype), None)


def derive_job(network, rj_status=GRACE_EXCEEDED, retries=None):
    job = spec.parse(body(**({"retries": retries} if retries else {})))
    return status.derive(job, 1, {"metadata": {"name": "demo"}, "status": rj_status}, [], {}, T0, network=network)


def test_grace_period_exceeded_behind_a_strict_policy_names_the_policy_and_what_admits_kuberay():
    st = derive_job(STRICT, retries={"application": 3})
    assert st["phase"] == "Failed"  # not retried: another attempt behind the same policy ends the same way
    failed = cond(st, "Failed")
    assert failed["reason"] == "DashboardUnreachable"
    assert "NetworkPolicy ml/demo-rayjob" in failed["message"] and "tputorch-system:app=tputorch-operator" in failed["message"]
    assert "networkPolicy.kuberay.namespace" in failed["message"] and "networkPolicy.mode=open" in failed["message"]
    assert "did not reach terminal state within 30s" in failed["message"]  # KubeRay's own words kept
    assert st["attemptHistory"][-1]["result"] == "Final"
    (event,) = [e for e in status.events({}, st) if e.reason == "DashboardUnreachable"]
    assert event.type == "Warning" and "NetworkPolicy ml/demo-rayjob" in event.message


def test_grace_period_exceeded_with_the_dashboard_open_keeps_kuberays_reason():
    for network in (OPEN, None, NetworkPolicyState("ml", "demo-rayjob", False, (), ("NetworkPolicyNameTaken", "taken"))):
        st = derive_job(network)
        assert cond(st, "Failed")["reason"] == "JobDeploymentStatusTransitionGracePeriodExceeded", network
        assert "NetworkPolicy" not in cond(st, "Failed")["message"]


def test_other_failures_behind_a_strict_policy_are_not_blamed_on_the_network():
    failed = {**GRACE_EXCEEDED, "reason": "AppFailed", "message": "Job entrypoint command failed with exit code 1"}
    assert cond(derive_job(STRICT, failed), "Failed")["reason"] == "AppFailed"


def test_the_network_policy_condition_says_what_it_admits_or_why_it_is_missing():
    ready = cond(derive_job(STRICT, {"jobDeploymentStatus": "Running"}), "NetworkPolicyReady")
    assert (ready["status"], ready["reason"]) == ("True", "Applied")
    assert "demo-rayjob" in ready["message"] and "only from tputorch-system:app=tputorch-operator" in ready["message"]
    assert "from any source" in cond(derive_job(OPEN, {"jobDeploymentStatus": "Running"}), "NetworkPolicyReady")["message"]
    taken = NetworkPolicyState("ml", "demo-rayjob", True, (), ("NetworkPolicyNameTaken", "a NetworkPolicy named demo-rayjob ..."))
    st = derive_job(taken, {"jobDeploymentStatus": "Running"})
    assert (cond(st, "NetworkPolicyReady")["status"], cond(st, "NetworkPolicyReady")["reason"]) == ("False", "NetworkPolicyNameTaken")
    assert st["phase"] == "Running"  # the job runs on
    assert cond(derive_job(None, {"jobDeploymentStatus": "Running"}), "NetworkPolicyReady") is None  # policies off


SVC_STRICT = NetworkPolicyState("ml", "qwen-ray", dashboard_open=False, peers=())


def test_a_service_whose_slice_is_up_with_no_serve_application_behind_a_strict_policy_says_why():
    rs = rayservice("initializing")
    pods = slice_hosts(4)
    st = derive_service(SVC, 1, rs, pods, {}, T0, network=SVC_STRICT)
    assert st["phase"] == "Deploying"
    ready = cond(st, "Ready")
    assert ready["reason"] == "DashboardUnreachable" and "NetworkPolicy ml/qwen-ray" in ready["message"]
    assert "NetworkPolicy ml/qwen-ray" in st["message"]
    open_ = derive_service(SVC, 1, rs, pods, {}, T0,
                                  network=NetworkPolicyState("ml", "qwen-ray", dashboard_open=True))
    assert cond(open_, "Ready")["reason"] != "DashboardUnreachable" and "NetworkPolicy" not in open_["message"]
    # the slice not up yet: nothing to blame on the network
    waiting = derive_service(SVC, 1, rs, [], {}, T0, network=SVC_STRICT)
    assert cond(waiting, "Ready")["reason"] != "DashboardUnreachable"


def test_a_policy_in_force_is_no_event_of_its_own_and_the_creation_keeps_its_event():
    st = derive_job(STRICT, {"jobDeploymentStatus": "Initializing"})
    assert "Applied" not in [e.reason for e in status.events({}, st)]
    taken = derive_job(NetworkPolicyState("ml", "demo-rayjob", True, (), ("NetworkPolicyNameTaken", "taken")),
                       {"jobDeploymentStatus": "Initializing"})
    assert "NetworkPolicyNameTaken" in [e.reason for e in status.events(st, taken)]
