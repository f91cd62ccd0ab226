"""A RayJob deleted and created again under the same name (the everyday rerun) with the real KubeRay:
the new run gets a new RayCluster and with it a dashboard of its own, so the old run's stop (sent by
KubeRay's finalizer when the old RayJob is deleted) never lands on the new run's Ray job."""

from __future__ import annotations

from test_local_cluster import V6E, rayjob, status


def running(kube, ns, name):
    s = status(kube, ns, name)
    return s if s.get("jobDeploymentStatus") == "Running" and s.get("jobStatus") == "RUNNING" else None


def test_a_rerun_under_the_same_name_is_not_stopped_by_the_old_runs_stop(kube, namespace, dashboard):
    name = "rerun"
    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs",
                                                rayjob(name, namespace, V6E, "2x2", hosts=1))
    old = kube.wait(lambda: running(kube, namespace, name), 120, "first run RUNNING")

    kube.custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name)
    kube.wait(lambda: not kube.custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs")["items"],
              120, "first RayJob gone")
    # KubeRay's finalizer stopped the old run's job, on the old RayCluster's dashboard.
    stops = [r for r in dashboard.requests(namespace=namespace) if r["path"] == f"/api/jobs/{old['jobId']}/stop"]
    assert [r["cluster"] for r in stops] == [old["rayClusterName"]], stops

    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs",
                                                rayjob(name, namespace, V6E, "2x2", hosts=1))
    new = kube.wait(lambda: running(kube, namespace, name), 120, "second run RUNNING")
    assert new["rayClusterName"] != old["rayClusterName"] and new["jobId"] != old["jobId"]
    by_cluster = {c["name"]: c for c in dashboard.clusters() if c["namespace"] == namespace}
    assert by_cluster[old["rayClusterName"]]["jobs"][old["jobId"]]["status"] == "STOPPED"
    assert by_cluster[new["rayClusterName"]]["jobs"][new["jobId"]]["status"] == "RUNNING"

    dashboard.set_job_status(namespace, name, "SUCCEEDED")  # the RayJob's newest job: the rerun
    s = kube.wait(lambda: (lambda s: s if s.get("jobDeploymentStatus") == "Complete" else None)(
        status(kube, namespace, name)), 120, "second run Complete")
    assert s["jobStatus"] == "SUCCEEDED"
