"""Rendered RayJobs: golden files for the shapes users run, and rules checked on every slice.

Regenerate goldens after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""

import os
import pathlib

import pytest
import yaml

from tputorch import render, spec, topology

from .jobs import body

GOLDEN = pathlib.Path(__file__).parent / "golden"

CASES = {
    "v6e-1x1": {"tpu": {"topology": "1x1"}},
    "v6e-2x2": {"tpu": {"topology": "2x2"}},
    "v6e-2x4": {"tpu": {"topology": "2x4"}},
    "v6e-4x4": {"tpu": {"topology": "4x4"}},
    "v6e-16x16": {"tpu": {"topology": "16x16"}},
    "v5e-2x4-two-hosts": {"tpu": {"accelerator": "v5e", "topology": "2x4", "chipsPerHost": 4}},
    "v5p-2x2x2": {"tpu": {"accelerator": "v5p", "topology": "2x2x2"}},
    "v4-2x2x1": {"tpu": {"accelerator": "v4", "topology": "2x2x1"}},
    "tpu7x-2x2x2": {"tpu": {"accelerator": "tpu7x", "topology": "2x2x2"}},
    "v6e-4x4-everything": {
        "tpu": {"topology": "4x4", "chipsPerWorker": 4, "spot": True},
        "rayVersion": "2.60.0",
        "runtimeEnv": {"pip": ["datasets==3.0.0"], "working_dir": "gs://bucket/code.zip", "env_vars": {"HF_HOME": "/tmp/hf"}},
        "env": [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "head": {"cpu": "4", "memory": "16Gi", "nodeSelector": {"pool": "cpu"}},
        "worker": {"cpu": "100", "memory": "400Gi"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "serviceAccountName": "trainer",
        "nodeSelector": {"team": "research"},
        "queueName": "tpu-queue",
        "activeDeadlineSeconds": 86400,
        "backoffLimit": 2,
        "ttlSecondsAfterFinished": 600,
        "suspend": True,
    },
}


def rendered(overrides, name="demo"):
    return render.rayjob(spec.parse(body(name=name, **overrides)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = render.to_yaml(rendered(CASES[case], name=case))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()


def worker_group(rayjob):
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def container(pod_template):
    (c,) = pod_template["spec"]["containers"]
    return c


def env_of(c):
    return {e["name"]: e.get("value") for e in c["env"]}


ALL = [(s.generation.name, s.topology, s.chips_per_host) for s in topology.all_slices()]


@pytest.mark.parametrize("acc,topo,cph", ALL, ids=[f"{a}-{t}-{c}" for a, t, c in ALL])
def test_every_slice_passes_the_gke_webhook_rule(acc, topo, cph):
    job = rendered({"tpu": {"accelerator": acc, "topology": topo, "chipsPerHost": cph}})
    group = worker_group(job)
    tpu_per_pod = int(container(group["template"])["resources"]["limits"]["google.com/tpu"])
    chips = 1
    for d in topo.split("x"):
        chips *= int(d)
    # The GKE Ray TPU webhook denies a RayCluster unless numOfHosts == max(chips / tpu per pod, 1).
    assert group["numOfHosts"] == max(chips // tpu_per_pod, 1)
    assert group["numOfHosts"] * tpu_per_pod == chips
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    res = container(group["template"])["resources"]
    assert res["requests"] == res["limits"]
    selector = group["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-accelerator"] == topology.GENERATIONS[acc].gke_accelerator
    assert selector["cloud.google.com/gke-tpu-topology"] == topo
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in group["template"]["spec"]["tolerations"]
    env = env_of(container(group["template"]))
    assert int(env["TPUTORCH_NUM_WORKERS"]) == chips
    assert env["TPUTORCH_ACCELERATOR_TYPE"].startswith("TPU-V")
    # Never switch chip isolation off, never the lowercase accelerator type that matches no node.
    assert "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS" not in env
    assert env["TPUTORCH_ACCELERATOR_TYPE"] == env["TPUTORCH_ACCELERATOR_TYPE"].upper()


def test_head_is_cpu_only_and_kept_off_tpu_nodes():
    job = rendered({})
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert "google.com/tpu" not in container(head)["resources"]["limits"]
    terms = head["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "cloud.google.com/gke-tpu-accelerator", "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    assert "tolerations" not in head["spec"]  # does not tolerate the TPU taint


def test_labels_tie_pods_to_the_job_and_leave_kuberays_name_alone():
    job = rendered({}, name="my-job")
    for template in (job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"], worker_group(job)["template"]):
        labels = template["metadata"]["labels"]
        assert labels["tputorch.io/job"] == "my-job"
        assert labels["app.kubernetes.io/managed-by"] == "tputorch-operator"
        assert "app.kubernetes.io/name" not in labels
    assert job["metadata"]["labels"]["tputorch.io/job"] == "my-job"


def test_spot_reservation_and_queue_become_labels_and_selectors():
    spot = rendered({"tpu": {"spot": True}})
    assert worker_group(spot)["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    reserved = rendered({"tpu": {"reservation": "my-res"}, "queueName": "q"})
    assert worker_group(reserved)["template"]["spec"]["nodeSelector"]["cloud.google.com/reservation-name"] == "my-res"
    assert reserved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"


def test_user_env_follows_the_slice_env_in_every_container():
    job = rendered({"env": [{"name": "A", "value": "1"}]})
    for template in (job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"], worker_group(job)["template"]):
        names = [e["name"] for e in container(template)["env"]]
        assert names[-1] == "A" and all(n.startswith("TPUTORCH_") for n in names[:-1])


def test_runtime_env_is_yaml_and_strings_are_quoted_safely():
    job = rendered({"runtimeEnv": {"pip": ["a"], "env_vars": {"X": "yes"}}, "entrypoint": 'python t.py --msg "a: b" # not a comment'})
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"]) == {"pip": ["a"], "env_vars": {"X": "yes"}}
    assert job["spec"]["entrypoint"] == 'python t.py --msg "a: b" # not a comment'


def test_rendering_is_deterministic():
    assert render.to_yaml(rendered(CASES["v6e-4x4-everything"])) == render.to_yaml(rendered(CASES["v6e-4x4-everything"]))
