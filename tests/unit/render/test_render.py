"""Rendered RayJobs: golden files for the shapes users run, and rules checked on every slice.

Regenerate goldens after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""

import json
import os
import pathlib

import pytest
import yaml

from tputorch import render
from tputorch.api.network import Peer
from tputorch.render.cluster import AUTOSCALER_TOKEN_VOLUME
from tputorch.render.names import (
    INITIALIZING_TIMEOUT_ANNOTATION, JOB_LABEL, KUEUE_ELASTIC_JOB_ANNOTATION, MANAGED_BY_LABEL, QUEUE_LABEL, SERVICE_LABEL, SPEC_HASH_ANNOTATION,
)
from tputorch.render.network import NetworkPolicyConfig, network_policy, network_policy_name
from tputorch.render.output import spec_hash, to_yaml
from tputorch.render.raytoken import is_ray_token_secret_of, ray_token_secret, ray_token_secret_name, with_ray_token_secret
from tputorch.render.serveconfig import SERVE_KEEP_ALIVE_S, llm_deployment_name
from tputorch.render.service import admitted_timeout_patch, raycluster_bounds_patch, rayservice_hash, rayservice_patch
from tputorch.api import service, spec, topology

from ..jobs import body

GOLDEN = pathlib.Path(__file__).parent / "golden"
REPO = pathlib.Path(__file__).resolve().parents[3]

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
    # Storage (spec.volumes), one golden per kind of volume.
    "v6e-4x4-volume-gcs": {
        "volumes": [{"name": "ckpt", "mountPath": "/mnt/ckpt", "gcs": {"bucket": "my-bucket", "mountOptions": ["implicit-dirs", "only-dir=runs"]}}],
        "gcsFuseSidecar": {"cpuLimit": "0", "memoryLimit": "0", "ephemeralStorageLimit": "0", "memoryRequest": "1Gi"},
        "serviceAccountName": "trainer",
    },
    "v6e-4x4-volume-pvc": {"volumes": [{"name": "data", "mountPath": "/data", "readOnly": True, "pvc": {"claimName": "datasets"}}]},
    "v6e-4x4-volume-emptydir": {
        "volumes": [{"name": "scratch", "mountPath": "/scratch", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "100Gi"}}],
        "worker": {"ephemeralStorage": "200Gi"},
    },
    # spec.hangDetection: the watchdog's settings reach every Ray container (TPUTORCH_HANG_DETECTION).
    "v6e-2x4-hang-detection": {"tpu": {"topology": "2x4"}, "hangDetection": {"timeoutSeconds": 300}},
    # spec.groups (render/groups.py): the training slice plus rollout / reward groups.
    "groups-tpu-tpu": {
        "tpu": {"topology": "2x2"},
        "groups": [{"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "2x2"}},
                   {"name": "reward", "cpu": "2", "memory": "8Gi"}],
    },
    "groups-tpu-gpu": {
        "tpu": {"topology": "4x4"},
        "serviceAccountName": "trainer",
        "volumes": [{"name": "weights", "mountPath": "/weights", "gcs": {"bucket": "rl-weights"}}],
        "groups": [{"name": "rollout", "gpu": {"type": "nvidia-l4", "count": 1}, "replicas": 2,
                    "image": "example.com/ray-vllm-cuda:2.60.0"},
                   {"name": "reward", "cpu": "2", "memory": "8Gi"}],
    },
    "groups-tpu-cpu": {
        "tpu": {"accelerator": "v5p", "topology": "2x2x2", "spot": True},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "groups": [{"name": "verifier", "replicas": 3, "cpu": "4", "memory": "16Gi", "nodeSelector": {"pool": "sandbox"}},
                   {"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "4x4", "reservation": "rl-res"}}],
    },
}


def rendered(overrides, name="demo"):
    return render.rayjob(spec.parse(body(name=name, **overrides)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = to_yaml(rendered(CASES[case], name=case))
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


@pytest.mark.parametrize("acc,topo", [("tpu7x", "2x2x2"), ("tpu7x", "2x2x1"), ("v6e", "4x4")])
def test_a_jobs_ray_nodes_count_one_tpu_resource_per_chip(acc, topo):
    # Ray's default of 1 per chip, TPU7x included: the job's workers are counted in chips
    # (topology.ray_tpu_resource_per_chip decides it for both kinds).
    rj = rendered({"tpu": {"accelerator": acc, "topology": topo}})
    head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    for c in (container(head), container(worker_group(rj)["template"])):
        assert topology.RAY_TPU_RESOURCE_PER_CHIP not in env_of(c)


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


def test_only_allowlisted_labels_pass_and_kueues_come_from_the_spec_alone():
    b = body(queueName="team-a")
    b["metadata"]["labels"] = {
        "team": "a", "app.kubernetes.io/part-of": "llm", "app.kubernetes.io/managed-by": "me",
        "kueue.x-k8s.io/queue-name": "other-teams-queue", "kueue.x-k8s.io/priority-class": "cluster-critical",
        "tputorch.io/job": "someone-else", "example.com/anything": "x",
    }
    for child in (render.rayjob(spec.parse(b)), render.rayservice(spec.parse_service(service_body(**{"queueName": "team-a"}) | {"metadata": b["metadata"] | {"name": "demo"}}))):
        labels = child["metadata"]["labels"]
        owner = SERVICE_LABEL if child["kind"] == "RayService" else JOB_LABEL
        assert labels == {"team": "a", "app.kubernetes.io/part-of": "llm", MANAGED_BY_LABEL: "tputorch-operator",
                          owner: "demo", QUEUE_LABEL: "team-a"}
    b["spec"].pop("queueName")
    assert QUEUE_LABEL not in render.rayjob(spec.parse(b))["metadata"]["labels"]


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
    assert to_yaml(rendered(CASES["v6e-4x4-everything"])) == to_yaml(rendered(CASES["v6e-4x4-everything"]))


# --- TPUTorchService -> RayService ---------------------------------------------------------

from ..services import merge_patch as merge, service_body  # noqa: E402

SERVICE_CASES = {
    "service-v6e-4x4-qwen3-moe": {
        "model": {"name": "qwen3-30b-a3b"},
        "engine": {"tensorParallelSize": 16, "enableExpertParallel": True, "maxModelLen": 8192,
                   "args": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}},
    },
    "service-v6e-2x2-single-host": {"tpu": {"topology": "2x2"}, "model": {"source": "Qwen/Qwen3-0.6B"}},
    # scale to zero: no slice while idle, the ingress on the head
    "service-v6e-2x2-scale-to-zero": {"tpu": {"topology": "2x2"}, "model": {"source": "Qwen/Qwen3-0.6B"},
                                      "replicas": {"min": 0, "max": 2}, "serve": {"scaleToZeroDelaySeconds": 300}},
    "service-v5p-2x2x2": {"tpu": {"accelerator": "v5p", "topology": "2x2x2"}, "engine": {"pipelineParallelSize": 2}},
    # long streams over several replicas: the old cluster kept 10 min after a switch, 5 min to finish a stream
    "service-v6e-4x4-replicas-1-3": {"replicas": {"min": 1, "max": 3},
                                     "serve": {"clusterDeletionDelaySeconds": 600, "gracefulShutdownTimeoutSeconds": 300,
                                               "routing": "PrefixAware", "ingressReplicas": 2}},
    "service-v6e-4x4-internal-lb": {"exposure": {"clients": "Listed", "from": [{"cidr": "10.128.0.0/20"}], "serveService": {
        "type": "LoadBalancer", "annotations": {"networking.gke.io/load-balancer-type": "Internal"},
        "loadBalancerSourceRanges": ["10.128.0.0/20"]}}},
    "service-v6e-4x4-spot": {"tpu": {"spot": True}, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "serve", "effect": "NoSchedule"}]},
    "service-v6e-4x4-weights-gcs": {
        "volumes": [{"name": "weights", "mountPath": "/models", "readOnly": True,
                     "gcs": {"bucket": "my-models", "mountOptions": ["implicit-dirs"], "fileCache": {"capacity": "100Gi"}}},
                    {"name": "cache", "mountPath": "/cache", "gcs": {"bucket": "my-serving-cache"}}],
        "gcsFuseSidecar": {"cpuLimit": "0", "memoryLimit": "0", "ephemeralStorageLimit": "0"},
        "model": {"source": "/models/Qwen3-30B-A3B", "name": "qwen3", "cacheVolume": "cache"},
    },
    # weights streamed from a bucket (load_format runai_streamer), the compile cache on a volume
    "service-v6e-4x4-weights-stream-gcs": {
        "volumes": [{"name": "cache", "mountPath": "/cache", "gcs": {"bucket": "my-serving-cache"}}],
        "model": {"source": "gs://my-models/Qwen3-30B-A3B", "name": "qwen3", "cacheVolume": "cache"},
        "engine": {"args": {"load_format": "runai_streamer"}},
        "serviceAccountName": "serving",
    },
    # adapters on demand from a bucket, read with the pods' Workload Identity
    "service-v6e-4x4-lora": {"model": {"name": "qwen3"}, "serviceAccountName": "serving",
                             "lora": {"path": "gs://my-adapters/qwen3", "maxAdaptersPerReplica": 8, "maxRank": 64}},
    "service-v6e-4x4-hf-token": {
        "model": {"source": "meta-llama/Llama-3.1-8B-Instruct", "hfTokenSecret": {"name": "hf-token", "key": "token"}},
        "engine": {"args": {"gpu_memory_utilization": 0.9, "enable_prefix_caching": True}},
        "runtimeEnv": {"env_vars": {"HF_HUB_ENABLE_HF_TRANSFER": "1"}},
        "env": [{"name": "LOG_LEVEL", "value": "debug"}],
        "serviceAccountName": "serving",
        "queueName": "serving-queue",
    },
    # queued and autoscaled: Kueue's elastic job (its workload slices admit each added slice)
    "service-v6e-4x4-queued-replicas-1-2": {"replicas": {"min": 1, "max": 2}, "queueName": "serving-queue",
                                            "priorityClassName": "tpu-low"},
}


def rendered_service(overrides, name="svc"):
    return render.rayservice(spec.parse_service(service_body(name=name, **overrides)))


def serve_config(rayservice):
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


def llm_config(rayservice):
    (app,) = serve_config(rayservice)["applications"]
    (cfg,) = app["args"]["llm_configs"]
    return cfg


def autoscaling(rayservice):
    (app,) = serve_config(rayservice)["applications"]
    override, ingress = app["deployments"]
    assert ingress["name"] == "OpenAiIngress"
    assert override["name"] == f"LLMServer:{llm_config(rayservice)['model_loading_config']['model_id']}"
    return override["autoscaling_config"]


@pytest.mark.parametrize("case", sorted(SERVICE_CASES))
def test_service_golden(case):
    text = to_yaml(rendered_service(SERVICE_CASES[case], name=case.removeprefix("service-")[:47]))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()
    assert yaml.safe_load(text) == rendered_service(SERVICE_CASES[case], name=case.removeprefix("service-")[:47])


def test_reference_service_serve_config():
    rs = rendered_service(SERVICE_CASES["service-v6e-4x4-qwen3-moe"], name="qwen3-moe")
    (app,) = serve_config(rs)["applications"]
    assert (app["route_prefix"], app["import_path"]) == ("/", "ray.serve.llm:build_openai_app")
    cfg = llm_config(rs)
    assert cfg["model_loading_config"] == {"model_id": "qwen3-30b-a3b", "model_source": "Qwen/Qwen3-30B-A3B"}
    assert cfg["accelerator_type"] == "TPU-V6E"
    # Multi-host (issue 56): no Serve LLM topology (its slice reservation can never bring a slice);
    # the replica's own placement group, one bundle per host, which the autoscaler turns into a slice.
    assert cfg["accelerator_config"] == {"kind": "tpu"}
    assert cfg["placement_group_config"] == {"bundles": [{"TPU": 4}] * 4, "strategy": "SPREAD"}
    assert cfg["engine_kwargs"] == {"tensor_parallel_size": 16, "pipeline_parallel_size": 1, "enable_expert_parallel": True, "max_model_len": 8192,
                                    "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    # Ray Serve LLM's defaults for the two request limits are 1e9: never left to them. The replica
    # count is the app's deployments override (outside the args: an edit of it is applied in place).
    assert autoscaling(rs) == {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 32}
    assert cfg["deployment_config"] == {
        "max_ongoing_requests": 128,
        # Google's vLLM TorchTPU Ray Serve sample: minutes of weight loading and XLA compile.
        "health_check_period_s": 30, "health_check_timeout_s": 900,
        # ... and the replica (merged into bundle 0) on the slice's worker 0, the one host with
        # TPU-v6e-16-head: never a label that only a running host has (issue 56).
        "ray_actor_options": {"resources": {"TPU-v6e-16-head": 1}},
    }
    assert "runtime_env" not in cfg


ALL_SERVICE_SLICES = [s for s in topology.all_slices() if service.serving_problem(s) is None]
# vllm-torchtpu 0.29.0's Ray executor's meshes by device count when TORCH_TPU_TOPOLOGY is unset
# (platforms/tpu_platform.py, read in the wheel): what the rendered variable must agree with.
VLLM_TORCHTPU_MESHES = {
    1: {4: "2,2,1", 8: "2,4,1", 16: "4,4,1", 32: "4,8,1", 64: "8,8,1", 128: "8,16,1", 256: "16,16,1"},
    2: {8: "2,2,2,2", 16: "2,2,4,2", 32: "2,4,4,2", 64: "4,4,4,2", 128: "4,4,8,2", 256: "4,8,8,2"},
}


@pytest.mark.parametrize("s", ALL_SERVICE_SLICES, ids=lambda s: f"{s.generation.name}-{s.topology}")
def test_every_service_slice_is_one_worker_replica_that_passes_the_gke_webhook_rule(s):
    rs = rendered_service({"tpu": {"accelerator": s.generation.name, "topology": s.topology}})
    cluster = rs["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    per_pod = int(container(group["template"])["resources"]["limits"]["google.com/tpu"])
    assert group["numOfHosts"] * per_pod == s.chips and group["numOfHosts"] == max(s.chips // per_pod, 1)
    assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == s.topology
    assert llm_config(rs)["engine_kwargs"]["tensor_parallel_size"] == s.chips
    assert llm_config(rs)["accelerator_type"] == s.generation.ray_accelerator_type
    env = env_of(container(group["template"]))
    assert env.get("TPU_MULTIHOST_BACKEND") == "ray"  # one host or many: vllm-torchtpu's executor choice
    assert env.get("RAY_TPU_RESOURCE_PER_CHIP") is None
    # Issue 35: the slice's own mesh is named (vllm-torchtpu turns x into ,), so slices the
    # executor's table lacks (1x1, 2x2x1, 8x8x8...) start, and one that shares a device count with
    # another (v5p 4x4x16 and 4x8x8) does not get the other's mesh.
    mesh = env["TORCH_TPU_TOPOLOGY"].replace("x", ",")
    assert mesh == f"{s.topology.replace('x', ',')},{s.generation.cores_per_chip}"
    # Issue 56: on a multi-host slice the replica's placement group holds every host (one bundle
    # each) and the replica starts on worker 0, the only host with TPU-<pod type>-head; a single
    # host keeps Serve LLM's topology path (its reservation asks for the one host, a whole slice).
    cfg = llm_config(rs)
    if s.hosts > 1:
        assert cfg["deployment_config"]["ray_actor_options"] == {"resources": {f"TPU-{s.ray_pod_type}-head": 1}}
        assert cfg["placement_group_config"] == {"bundles": [{"TPU": s.chips_per_host}] * s.hosts, "strategy": "SPREAD"}
        assert cfg["accelerator_config"] == {"kind": "tpu"}
    else:
        assert cfg["deployment_config"]["ray_actor_options"] == {
            "resources": {f"accelerator_type:{s.generation.ray_accelerator_type}": 0.001}}
        assert cfg["accelerator_config"] == {"kind": "tpu", "topology": s.topology} and "placement_group_config" not in cfg
    assert not any(k.startswith("TPUTORCH_") for k in env)  # the training env is the job's


def test_the_rendered_mesh_is_vllm_torchtpus_own_for_the_shapes_of_its_table():
    by_shape = {(s.generation.cores_per_chip, s.topology): s for s in ALL_SERVICE_SLICES}
    for cores, table in VLLM_TORCHTPU_MESHES.items():
        for devices, mesh in table.items():
            s = by_shape[(cores, "x".join(mesh.split(",")[:-1]))]
            assert s.chips == devices
            rendered = env_of(container(rendered_service({"tpu": {"accelerator": s.generation.name, "topology": s.topology}})
                                        ["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]))
            assert rendered["TORCH_TPU_TOPOLOGY"].replace("x", ",") == mesh


def test_the_rendered_mesh_covers_slices_vllm_torchtpus_table_has_not():
    shapes = {(s.generation.name, s.topology) for s in ALL_SERVICE_SLICES}
    assert {("v6e", "1x1"), ("v5e", "1x1"), ("v4", "2x2x1"), ("v5p", "2x2x1"), ("v5p", "8x8x8"), ("v4", "8x8x8")} <= shapes
    assert {s.chips for s in ALL_SERVICE_SLICES if s.generation.cores_per_chip == 2} - set(VLLM_TORCHTPU_MESHES[2])
    assert env_of(container(rendered_service({"tpu": {"accelerator": "v6e", "topology": "1x1"}})["spec"]["rayClusterConfig"]
                            ["workerGroupSpecs"][0]["template"]))["TORCH_TPU_TOPOLOGY"] == "1x1x1"


def test_service_head_serves_port_8000_and_stays_cpu_only():
    rs = rendered_service({})
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in container(head)["ports"]}
    assert ports == {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": 8000}
    assert "google.com/tpu" not in container(head)["resources"]["limits"]
    assert "tolerations" not in head["spec"]
    # No logical CPUs on the head: Ray places no Serve replica or vLLM worker there.
    assert rs["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-cpus": "0"}
    assert rendered({})["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0"}


def test_replicas_drive_the_worker_group_serve_autoscaling_and_kuberays_autoscaler():
    fixed = rendered_service({"replicas": {"min": 2}})
    (group,) = fixed["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    scaled = rendered_service({"replicas": {"min": 1, "max": 3}, "serve": {"targetOngoingRequests": 8}})
    (group,) = scaled["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 3)
    assert autoscaling(scaled) == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8}
    # A replicas edit leaves the application's args as they were: Serve applies it without a new replica.
    assert serve_config(scaled)["applications"][0]["args"] == serve_config(
        rendered_service({"replicas": {"min": 2}}))["applications"][0]["args"]
    # The autoscaler is on either way: KubeRay's cluster hash leaves replicas/min/max out but not
    # enableInTreeAutoscaling, so an edit within autoscaled bounds ({1,2} -> {1,3}, {1,3} -> {0,3})
    # changes nothing else in the cluster.
    one = rendered_service({"replicas": {"min": 1, "max": 1}})["spec"]["rayClusterConfig"]
    two = rendered_service({"replicas": {"min": 1, "max": 2}})["spec"]["rayClusterConfig"]
    three = scaled["spec"]["rayClusterConfig"]

    def kuberay_hash_view(cluster):
        c = json.loads(json.dumps(cluster))
        for g in c["workerGroupSpecs"]:
            for k in ("replicas", "minReplicas", "maxReplicas"):
                g.pop(k)
        return c

    assert kuberay_hash_view(two) == kuberay_hash_view(three)
    assert one["enableInTreeAutoscaling"] is True
    # A fixed count lists no Ray resources for the autoscaler (the cluster it had); an autoscaled one
    # does, so {1,1} -> {1,3} is a new cluster (test_autoscaler_demand: why the autoscaler needs it).
    assert "resources" not in one["workerGroupSpecs"][0]
    assert three["workerGroupSpecs"][0]["resources"] == {"accelerator_type:TPU-V6E": "1"}
    assert kuberay_hash_view(one) != kuberay_hash_view(three)
    single_host = {"tpu": {"accelerator": "v6e", "topology": "2x2"}}
    zero = rendered_service({**single_host, "replicas": {"min": 0, "max": 2}})["spec"]["rayClusterConfig"]
    assert kuberay_hash_view(zero) == kuberay_hash_view(
        rendered_service({**single_host, "replicas": {"min": 1, "max": 2}})["spec"]["rayClusterConfig"])
    assert (zero["workerGroupSpecs"][0]["replicas"], zero["workerGroupSpecs"][0]["minReplicas"]) == (0, 0)


def test_hf_token_reaches_head_and_workers_from_the_secret():
    rs = rendered_service(SERVICE_CASES["service-v6e-4x4-hf-token"])
    cluster = rs["spec"]["rayClusterConfig"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        env = container(template)["env"]
        token = next(e for e in env if e["name"] == "HF_TOKEN")
        assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
        assert env[-1] == {"name": "LOG_LEVEL", "value": "debug"}  # the user's env comes last
    cfg = llm_config(rs)
    assert cfg["runtime_env"] == {"env_vars": {"HF_HUB_ENABLE_HF_TRANSFER": "1"}}
    assert cfg["engine_kwargs"]["gpu_memory_utilization"] == 0.9 and cfg["engine_kwargs"]["enable_prefix_caching"] is True
    assert "HF_TOKEN" not in env_of(container(rendered_service({})["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]))


def test_service_labels_and_queue():
    rs = rendered_service(SERVICE_CASES["service-v6e-4x4-hf-token"], name="my-svc")
    cluster = rs["spec"]["rayClusterConfig"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        assert template["metadata"]["labels"] == {MANAGED_BY_LABEL: "tputorch-operator", SERVICE_LABEL: "my-svc"}
    assert rs["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "tputorch-operator", "tputorch.io/service": "my-svc",
        "kueue.x-k8s.io/queue-name": "serving-queue"}
    assert SERVICE_LABEL == "tputorch.io/service" and JOB_LABEL == "tputorch.io/job"


def test_a_queued_autoscaled_service_is_kueues_elastic_job_and_a_queued_fixed_one_renders_as_before():
    """Kueue 0.19.1's RayService webhook (raycluster.ValidateCreate) refuses enableInTreeAutoscaling on a
    queued RayService unless the RayService's own metadata carries kueue.x-k8s.io/elastic-job: "true"
    (ElasticJobsViaWorkloadSlices, on by default since 0.18). A queued fixed-count service stays
    without autoscaler or annotation: its rendering (and KubeRay's cluster hash) does not change."""
    elastic = rendered_service({"queueName": "q", "replicas": {"min": 1, "max": 3}})
    assert elastic["metadata"]["annotations"][KUEUE_ELASTIC_JOB_ANNOTATION] == "true"
    assert KUEUE_ELASTIC_JOB_ANNOTATION == "kueue.x-k8s.io/elastic-job"
    cluster = elastic["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True and "autoscalerOptions" in cluster
    (group,) = cluster["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"], group["replicas"]) == (1, 3, 1)
    # queued: no initializing timeout at creation (admitted_timeout_patch's), autoscaled or not
    assert INITIALIZING_TIMEOUT_ANNOTATION not in elastic["metadata"]["annotations"]
    # the same service unqueued: the same cluster, no Kueue annotation
    unqueued = rendered_service({"replicas": {"min": 1, "max": 3}})
    assert KUEUE_ELASTIC_JOB_ANNOTATION not in unqueued["metadata"]["annotations"]
    assert unqueued["spec"]["rayClusterConfig"] == cluster
    for fixed in (rendered_service({"queueName": "q"}), rendered_service({"queueName": "q", "replicas": {"min": 2, "max": 2}})):
        assert KUEUE_ELASTIC_JOB_ANNOTATION not in fixed["metadata"]["annotations"]
        assert fixed["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is False
    # an edit's patch carries the annotation (Kueue refuses its change on update: the CRD refuses the edit first)
    svc = spec.parse_service(service_body(queueName="q", replicas={"min": 1, "max": 3}))
    patch = rayservice_patch(svc, {"metadata": {"annotations": {}}})
    assert patch["metadata"]["annotations"][KUEUE_ELASTIC_JOB_ANNOTATION] == "true"


def test_spec_hash_annotation_follows_the_spec():
    a, b = rendered_service({}), rendered_service({})
    h = a["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    assert h == b["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == rayservice_hash(a)
    assert len(h) == 16 and int(h, 16) >= 0
    hash_of = lambda body: rendered_service(body)["metadata"]["annotations"][SPEC_HASH_ANNOTATION]  # noqa: E731
    assert hash_of({"replicas": {"max": 2}}) != h
    assert hash_of({"engine": {"maxModelLen": 4096}}) != h
    # The initializing-timeout annotation is ours too: an edit of it is patched like the spec.
    assert hash_of({"serve": {"initializingTimeoutSeconds": 600}}) != h
    # Key order never matters, only content.
    assert spec_hash({"a": 1, "b": [1, 2]}) == spec_hash({"b": [1, 2], "a": 1}) != spec_hash({"a": 1, "b": [2, 1]})
    assert "annotations" not in rendered({})["metadata"]  # RayJobs only ever get suspend patched


def test_rayservice_patch_only_when_the_hash_differs():
    svc = spec.parse_service(service_body(engine={"maxModelLen": 8192}))
    current = render.rayservice(svc)
    # What KubeRay keeps (status, defaults it adds) never causes a patch while the hash matches.
    observed = {**current, "status": {"serviceStatus": "Running"}}
    observed["spec"] = {**current["spec"], "serveService": {"metadata": {"name": "x"}}}
    assert rayservice_patch(svc, observed) is None

    edited = spec.parse_service(service_body(engine={"maxModelLen": 4096}, replicas={"min": 1, "max": 2}))
    patch = rayservice_patch(edited, observed)
    desired = render.rayservice(edited)
    assert patch["metadata"] == {"annotations": desired["metadata"]["annotations"]}
    assert patch["spec"]["serveService"] is None  # a key we do not render is removed
    assert merge(observed["spec"], patch["spec"]) == desired["spec"]
    assert "max_model_len: 4096" in patch["spec"]["serveConfigV2"]


def test_rayservice_patch_removes_what_the_new_spec_no_longer_has():
    before = render.rayservice(spec.parse_service(service_body(serviceAccountName="serving")))
    after = spec.parse_service(service_body())
    patch = rayservice_patch(after, before)
    head = patch["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] is None
    # Applied as a JSON merge patch (RFC 7386) to the old spec it gives exactly the new one.
    assert merge(before["spec"], patch["spec"]) == render.rayservice(after)["spec"]
    # Also when the caller has only the observed annotations (a store that keeps no spec).
    slim = rayservice_patch(after, {"metadata": before["metadata"]})
    assert merge(before["spec"], slim["spec"]) == render.rayservice(after)["spec"]
    for optional in ({"tolerations": [{"key": "a", "operator": "Exists"}]}, {"head": {"nodeSelector": {"pool": "cpu"}}}):
        old = render.rayservice(spec.parse_service(service_body(**optional)))
        assert merge(old["spec"], rayservice_patch(after, {"metadata": old["metadata"]})["spec"]) == render.rayservice(after)["spec"]


def test_rayservice_patch_keeps_the_autoscalers_slice_count_within_the_new_bounds():
    autoscaled = render.rayservice(spec.parse_service(service_body(replicas={"min": 1, "max": 4})))
    autoscaled["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = 3  # scaled up meanwhile
    for bounds, kept in (({"min": 1, "max": 4}, 3), ({"min": 1, "max": 2}, 2), ({"min": 4, "max": 6}, 4)):
        edited = spec.parse_service(service_body(replicas=bounds, engine={"maxModelLen": 2048}))
        group = rayservice_patch(edited, autoscaled)["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        assert group["replicas"] == kept, bounds
    fixed = spec.parse_service(service_body(replicas={"min": 2, "max": 2}))
    assert rayservice_patch(fixed, autoscaled)["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] == 2


def test_an_edit_of_the_rayservice_behind_our_back_is_put_back_and_defaults_are_not():
    import copy
    svc = spec.parse_service(service_body(replicas={"min": 1, "max": 3}))
    current = render.rayservice(svc)

    def observed_with(change):
        obj = copy.deepcopy(current)
        change(obj["spec"])
        return obj

    def workers(s):
        return s["rayClusterConfig"]["workerGroupSpecs"][0]

    def container(s):
        return workers(s)["template"]["spec"]["containers"][0]

    # What the API server and KubeRay add, and the autoscaler's count within the bounds: left alone.
    for unchanged in (lambda s: container(s).update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/x"),
                      lambda s: [p.setdefault("protocol", "TCP") for p in container(s).get("ports") or []],
                      lambda s: s.update(serviceUnhealthySecondThreshold=900),
                      lambda s: workers(s).update(replicas=3),
                      lambda s: s["rayClusterConfig"].update(suspend=True)):  # Kueue's
        assert rayservice_patch(svc, observed_with(unchanged)) is None
    # A value we render, changed or removed by hand, with our hash still on the object: put back.
    for drift in (lambda s: s.update(serveConfigV2=s["serveConfigV2"] + "# edited by hand\n"),
                  lambda s: container(s)["resources"]["limits"].update({"google.com/tpu": "8"}),
                  lambda s: container(s).pop("env"),
                  lambda s: container(s)["env"].append({"name": "EXTRA", "value": "1"}),
                  lambda s: workers(s).update(replicas=7)):  # outside the bounds
        drifted = observed_with(drift)
        patch = rayservice_patch(svc, drifted)
        assert patch is not None
        assert rayservice_patch(svc, {**drifted, "spec": merge(drifted["spec"], patch["spec"])}) is None


def test_rayservice_carries_the_initializing_timeout_and_the_upgrade_strategy():
    rs = rendered_service({})
    assert rs["metadata"]["annotations"][INITIALIZING_TIMEOUT_ANNOTATION] == "3600s"  # KubeRay: Go duration
    assert rs["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    never = rendered_service({"serve": {"initializingTimeoutSeconds": 0}, "upgradeStrategy": "None"})
    assert INITIALIZING_TIMEOUT_ANNOTATION not in never["metadata"]["annotations"]
    assert never["spec"]["upgradeStrategy"] == {"type": "None"}
    # Dropping the timeout removes KubeRay's annotation from the live object.
    patch = rayservice_patch(spec.parse_service(service_body(serve={"initializingTimeoutSeconds": 0})), rs)
    assert patch["metadata"]["annotations"][INITIALIZING_TIMEOUT_ANNOTATION] is None


def _llm_deployment_config(rs):
    return yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]["llm_configs"][0]["deployment_config"]


def test_stream_knobs_render_only_when_set():
    """Issue 37: the cluster deletion delay becomes the RayService's rayClusterDeletionDelaySeconds
    and the graceful shutdown Serve's graceful_shutdown_timeout_s; unset, neither key is written
    (KubeRay's 60 s and Serve's 20 s apply, and the RayService is what it was before the fields)."""
    rs = rendered_service({})
    assert "rayClusterDeletionDelaySeconds" not in rs["spec"]
    assert "graceful_shutdown_timeout_s" not in _llm_deployment_config(rs)
    rs = rendered_service({"serve": {"clusterDeletionDelaySeconds": 3600, "gracefulShutdownTimeoutSeconds": 900}})
    assert rs["spec"]["rayClusterDeletionDelaySeconds"] == 3600
    assert _llm_deployment_config(rs)["graceful_shutdown_timeout_s"] == 900
    assert rendered_service({"serve": {"clusterDeletionDelaySeconds": 0}})["spec"]["rayClusterDeletionDelaySeconds"] == 0


def test_prefix_aware_routing_is_ray_serve_llms_router_and_powers_of_two_writes_nothing():
    assert "request_router_config" not in _llm_deployment_config(rendered_service({}))
    assert "request_router_config" not in _llm_deployment_config(rendered_service({"serve": {"routing": "PowerOfTwo"}}))
    # Issue 56: a finite imbalance (a replica a whole target behind another: power of two choices
    # instead) and eviction on; Ray's defaults (inf, no eviction) ignore load and grow the tree.
    routed = rendered_service({"serve": {"routing": "PrefixAware", "targetOngoingRequests": 8}})
    assert _llm_deployment_config(routed)["request_router_config"] == {
        "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
        "request_router_kwargs": {"imbalanced_threshold": 8, "do_eviction": True}}


def test_prefix_aware_routing_gives_the_head_one_cpu_for_the_prefix_tree_actor():
    # Issue 56: the router's detached LlmPrefixTreeActor needs 1 CPU to be scheduled; at the head's
    # num-cpus 0 only a TPU host had one (its slice never idled, its loss hung routed requests).
    head = lambda svc: svc["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"]  # noqa: E731
    assert head(rendered_service({"serve": {"routing": "PrefixAware"}})) == "1"
    assert head(rendered_service({"serve": {"routing": "PrefixAware"}, "replicas": {"min": 0, "max": 1}})) == "1"
    assert head(rendered_service({"serve": {"routing": "PowerOfTwo"}})) == "0"
    assert head(rendered_service({})) == "0"


def test_prefix_aware_routing_leaves_no_cpu_for_the_prefix_tree_actor_but_the_heads():
    # Issue 56: Ray schedules the detached actor on any node with a free CPU (not its caller's): the
    # TPU hosts advertise none and the LLM replica, the only Serve actor there, asks none.
    for shape in ({}, {"tpu": {"topology": "2x2"}}, {"replicas": {"min": 0, "max": 1}}):
        routed = rendered_service({**shape, "serve": {"routing": "PrefixAware"}})
        (group,) = routed["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        # In the group's resources, which KubeRay passes to ray start as --num-cpus 0 (and refuses
        # beside rayStartParams' num-cpus when the group has resources: autoscaled ones do).
        assert group["resources"]["CPU"] == "0" and group["rayStartParams"] == {}, group
        assert _llm_deployment_config(routed)["ray_actor_options"]["num_cpus"] == 0
        plain = rendered_service({**shape, "serve": {"routing": "PowerOfTwo"}})
        (group,) = plain["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        assert "CPU" not in (group.get("resources") or {})  # KubeRay's default: the container's CPUs
        assert "num_cpus" not in _llm_deployment_config(plain)["ray_actor_options"]


def test_a_single_host_prefix_aware_replicas_slice_names_no_cpu():
    # Issue 56: on one host Ray Serve LLM reserves the slice itself (accelerator_config.topology), and
    # Ray 2.60's slice placement group gives a bundle 1 CPU unless it names CPU: the hosts have none
    # (tests/raysim/test_serve_config.py runs Ray's own code on it).
    def llm_config(routing):
        rs = rendered_service({"tpu": {"topology": "2x2"}, "serve": {"routing": routing}})
        return yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]["llm_configs"][0]
    routed = llm_config("PrefixAware")
    assert routed["accelerator_config"]["topology"] == "2x2"
    assert routed["placement_group_config"] == {"bundles": [{"TPU": 4, "CPU": 0}]}
    assert "placement_group_config" not in llm_config("PowerOfTwo")  # the hosts keep their CPUs


# KubeRay 1.6.2's validateRayGroupResources: a group with `resources` must not set these in rayStartParams.
KUBERAY_START_PARAM_RESOURCES = ("num-cpus", "num-gpus", "memory", "resources")


@pytest.mark.parametrize("case", sorted(SERVICE_CASES))
def test_no_group_sets_ray_resources_in_both_places_kuberay_refuses(case):
    rs = rendered_service(SERVICE_CASES[case])
    cluster = rs["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        both = [k for k in KUBERAY_START_PARAM_RESOURCES if group.get("rayStartParams", {}).get(k)]
        assert not (both and group.get("resources")), (case, group.get("groupName", "head"), both, group["resources"])


def test_ingress_replicas_are_a_deployments_override_of_ray_serve_llms_ingress():
    on_head = {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}
    # Issue 56: on the head in every mode (on a TPU host, the head having no CPU, it held a slice).
    (app,) = serve_config(rendered_service({}))["applications"]
    assert app["deployments"][1] == {"name": "OpenAiIngress", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                                     "ray_actor_options": on_head}
    (app,) = serve_config(rendered_service({"serve": {"ingressReplicas": 3}, "replicas": {"min": 1, "max": 3}}))["applications"]
    llm, ingress = app["deployments"]
    assert ingress == {"name": "OpenAiIngress", "autoscaling_config": {"min_replicas": 3, "max_replicas": 3},
                       "ray_actor_options": on_head}
    # The names are those Ray 2.60 Serve LLM gave the deployments on the real chain (recorded there).
    recorded = json.loads((REPO / "hack" / "fakedash" / "recorded" / "serve-deploy.json").read_text())
    assert {"OpenAiIngress", llm_deployment_name("tiny")} <= set(
        recorded[-1]["details"]["applications"]["llm"]["deployments"])


def test_scale_to_zero_puts_the_ingress_on_the_head_and_lets_a_request_wait_for_a_slice():
    (app,) = serve_config(rendered_service(SERVICE_CASES["service-v6e-2x2-scale-to-zero"]))["applications"]
    llm, ingress = app["deployments"]
    assert llm["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 2, "target_ongoing_requests": 32,
                                         "downscale_to_zero_delay_s": 300}
    assert "downscale_to_zero_delay_s" not in autoscaling(rendered_service({"replicas": {"min": 1, "max": 2}}))
    # serve.downscaleDelaySeconds: Serve's own delay before it stops a replica above the minimum.
    assert "downscale_delay_s" not in autoscaling(rendered_service({"replicas": {"min": 1, "max": 2}}))
    assert autoscaling(rendered_service({"replicas": {"min": 1, "max": 2}, "serve": {"downscaleDelaySeconds": 30}}))[
        "downscale_delay_s"] == 30
    # Ray Serve LLM would take its ingress to 0 too only when the args' own min is 0 (they carry none)
    assert ingress["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 1}
    options = ingress["ray_actor_options"]
    assert (options["num_cpus"], options["resources"]) == (0, {"node:__internal_head__": 0.001})
    assert options["runtime_env"]["env_vars"] == {"RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT": "1800"}
    # ingressReplicas still sets the count; above zero the ingress is on the head too, with Ray's router timeout
    (app,) = serve_config(rendered_service({**SERVICE_CASES["service-v6e-2x2-scale-to-zero"],
                                            "serve": {"ingressReplicas": 2}}))["applications"]
    assert app["deployments"][1]["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 2}
    (app,) = serve_config(rendered_service({"replicas": {"min": 1, "max": 2}, "serve": {"ingressReplicas": 2}}))["applications"]
    assert app["deployments"][1]["ray_actor_options"] == {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}


def test_dropping_the_cluster_deletion_delay_removes_it_from_the_rayservice():
    set_ = rendered_service({"serve": {"clusterDeletionDelaySeconds": 3600}})
    unset = spec.parse_service(service_body())
    for observed in (set_, {"metadata": set_["metadata"]}):  # with and without the observed spec
        patch = rayservice_patch(unset, observed)
        assert patch["spec"]["rayClusterDeletionDelaySeconds"] is None
    edited = spec.parse_service(service_body(serve={"clusterDeletionDelaySeconds": 120}))
    assert rayservice_patch(edited, set_)["spec"]["rayClusterDeletionDelaySeconds"] == 120


def test_a_queued_service_gets_its_initializing_timeout_on_admission_plus_the_time_it_waited():
    """Issue 35: KubeRay 1.6.1+ counts the timeout from its Ready condition's lastTransitionTime
    with reason Initializing (set in its first reconcile, at creation) and checks it every reconcile,
    suspended or not (markFailedOnInitializingTimeout): a queue wait longer than the timeout would
    fail the service in the queue. So none while queued, and on admission the wait plus the timeout."""
    from tputorch.api.phases import QUEUED
    from tputorch.status import kueue
    svc = spec.parse_service(service_body(queueName="tpu", serve={"initializingTimeoutSeconds": 30}))
    created = render.rayservice(svc)
    assert INITIALIZING_TIMEOUT_ANNOTATION not in created["metadata"]["annotations"]
    created["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "Initializing",
                                         "lastTransitionTime": "2026-12-01T10:00:00Z"}]}
    queued = kueue.Admission(False, "Pending", "waiting", QUEUED)
    assert admitted_timeout_patch(svc, created, queued) is None
    admitted = kueue.Admission(True, "Admitted", "admitted", None, "tpu", "w", "2026-12-01T10:02:00.4Z")
    patch = admitted_timeout_patch(svc, created, admitted)
    assert patch == {"metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: "151s"}}}  # 120.4 s waited + 30
    # Applied: nothing more; and a spec patch of the service leaves it alone.
    created["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    assert admitted_timeout_patch(svc, created, admitted) is None
    edited = spec.parse_service(service_body(queueName="tpu", serve={"initializingTimeoutSeconds": 30}, engine={"maxModelLen": 4096}))
    assert INITIALIZING_TIMEOUT_ANNOTATION not in rayservice_patch(edited, created)["metadata"]["annotations"]
    # Preempted back into the queue before it was ever ready: no timeout while it waits again.
    assert admitted_timeout_patch(svc, created, queued) == {
        "metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: None}}}
    # Ready once (KubeRay times out only an initializing service): left as it is.
    created["status"]["conditions"][0].update(reason="ZeroServeEndpoints", lastTransitionTime="2026-12-01T11:00:00Z")
    later = kueue.Admission(True, "Admitted", "admitted", None, "tpu", "w", "2026-12-01T12:00:00Z")
    assert admitted_timeout_patch(svc, created, later) is None
    # Kueue not managing it (not installed): nothing holds it back, the timeout counts from creation.
    assert admitted_timeout_patch(svc, render.rayservice(svc), None) == {
        "metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: "30s"}}}
    # Not queued, or no timeout: none of this.
    assert admitted_timeout_patch(spec.parse_service(service_body()), created, admitted) is None
    never = spec.parse_service(service_body(queueName="tpu", serve={"initializingTimeoutSeconds": 0}))
    assert admitted_timeout_patch(never, created, admitted) is None


def test_the_rayservice_store_keeps_the_initializing_timeout_it_compares():
    from tputorch.controller import stores
    rs = render.rayservice(spec.parse_service(service_body()))
    rs["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{...}"
    kept = stores.slim_rayservice(rs)["metadata"]["annotations"]
    assert sorted(kept) == [INITIALIZING_TIMEOUT_ANNOTATION, SPEC_HASH_ANNOTATION]


def test_serve_options_reach_the_llm_deployment():
    cfg = llm_config(rendered_service({"serve": {"maxOngoingRequests": 300, "healthCheckTimeoutSeconds": 1800,
                                                 "healthCheckPeriodSeconds": 10}}))
    d = cfg["deployment_config"]
    assert (d["max_ongoing_requests"], d["health_check_timeout_s"], d["health_check_period_s"]) == (300, 1800, 10)


def _pods(child):
    cluster = child["spec"].get("rayClusterSpec") or child["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    yield "worker", cluster["workerGroupSpecs"][0]["template"]["spec"]
    if "submitterPodTemplate" in child["spec"]:
        yield "submitter", child["spec"]["submitterPodTemplate"]["spec"]


RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
              "seccompProfile": {"type": "RuntimeDefault"}}


def test_every_ray_container_meets_restricted_and_no_pod_mounts_a_token_unless_asked():
    for child in (rendered({}), rendered_service({}), rendered_service({"replicas": {"min": 1, "max": 3}})):
        autoscaling = child["kind"] == "RayService" and child["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]
        for role, pod in _pods(child):
            (c,) = pod["containers"]
            assert RESTRICTED.items() <= c["securityContext"].items(), (role, c["securityContext"])
            # no pod-wide token: KubeRay's autoscaler gets its own (below), the Ray containers none
            assert pod["automountServiceAccountToken"] is False, role
            assert not [m for m in c.get("volumeMounts", []) if m["name"] == AUTOSCALER_TOKEN_VOLUME], role
            token_volumes = [v for v in pod.get("volumes", []) if v["name"] == AUTOSCALER_TOKEN_VOLUME]
            assert len(token_volumes) == (role == "head" and autoscaling), role
        if autoscaling:
            options = child["spec"]["rayClusterConfig"]["autoscalerOptions"]
            assert RESTRICTED.items() <= options["securityContext"].items()
            # the autoscaler alone mounts the API token, where in-cluster clients look for it
            assert options["volumeMounts"] == [{"name": AUTOSCALER_TOKEN_VOLUME, "readOnly": True,
                                                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            (head,) = [pod for role, pod in _pods(child) if role == "head"]
            (volume,) = [v for v in head["volumes"] if v["name"] == AUTOSCALER_TOKEN_VOLUME]
            sources = volume["projected"]["sources"]
            assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
            assert [i["path"] for i in sources[1]["configMap"]["items"] + sources[2]["downwardAPI"]["items"]] == ["ca.crt", "namespace"]
    queued = rendered_service({"queueName": "q"})  # no autoscaler under Kueue: no token at all
    assert "autoscalerOptions" not in queued["spec"]["rayClusterConfig"]
    assert not any(v["name"] == AUTOSCALER_TOKEN_VOLUME for _, pod in _pods(queued) for v in pod.get("volumes", []))
    asked = rendered_service({"automountServiceAccountToken": True})  # the pod-wide token, asked for: no second one
    assert "volumeMounts" not in asked["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert all(pod["automountServiceAccountToken"] for _, pod in _pods(asked))
    job = rendered({"securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": True}, "automountServiceAccountToken": True})
    for role, pod in _pods(job):
        sc = pod["containers"][0]["securityContext"]
        assert (sc["runAsUser"], sc["readOnlyRootFilesystem"], "runAsNonRoot" in sc) == (0, True, False)
        assert pod["automountServiceAccountToken"] is (role != "submitter")


def test_a_named_service_account_gets_its_token_mounted_for_workload_identity_unless_refused():
    """Workload Identity: the pods of a job or service that names a ServiceAccount get its token (the
    admission plugin's projected, expiring volume); the namespace's default account none; an explicit
    false keeps it out."""
    for make in (rendered, rendered_service):
        named = make({"serviceAccountName": "ray-tpu"})
        for role, pod in _pods(named):
            assert pod["automountServiceAccountToken"] is (role != "submitter"), role  # the submitter: KubeRay's own
            if role != "submitter":
                assert pod["serviceAccountName"] == "ray-tpu", role
        if named["kind"] == "RayService":  # the pod-wide token: the autoscaler needs no second one
            assert "volumeMounts" not in named["spec"]["rayClusterConfig"]["autoscalerOptions"]
        refused = make({"serviceAccountName": "ray-tpu", "automountServiceAccountToken": False})
        assert not any(pod["automountServiceAccountToken"] for _, pod in _pods(refused))
        assert not any(pod["automountServiceAccountToken"] for _, pod in _pods(make({})))
    assert spec.parse(body(serviceAccountName="ray-tpu")).automount_service_account_token is True
    assert spec.parse(body()).automount_service_account_token is False


def test_the_submitter_pod_is_kuberays_default_with_our_security_and_no_ray_node_label():
    job = rendered({})
    template = job["spec"]["submitterPodTemplate"]
    assert template["metadata"]["labels"] == {JOB_LABEL: "demo"}  # not managed-by: no Ray node
    (c,) = template["spec"]["containers"]
    assert (c["name"], c["image"], template["spec"]["restartPolicy"]) == ("ray-job-submitter", "example.com/ray-torch-tpu:2.60.0", "Never")
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


KUBERAY = Peer("ray-system", (("app.kubernetes.io/name", "kuberay-operator"),))
OPERATOR = Peer("tputorch-system")
TCP = lambda *ports: [{"protocol": "TCP", "port": n} for n in ports]  # noqa: E731


def test_the_default_network_policy_admits_own_pods_everywhere_and_the_dashboard_from_any_source():
    job = network_policy(spec.parse(body(name="demo")), NetworkPolicyConfig(peers=(KUBERAY, OPERATOR)))
    assert (job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == ("NetworkPolicy", "demo-rayjob", "ml")
    assert job["spec"]["podSelector"] == {"matchLabels": {JOB_LABEL: "demo"}}
    assert job["spec"]["policyTypes"] == ["Ingress"]
    own, dashboard = job["spec"]["ingress"]  # the peers add nothing to a job in open mode
    assert own == {"from": [{"podSelector": {"matchLabels": {JOB_LABEL: "demo"}}}]}  # same namespace, every port
    assert dashboard == {"ports": TCP(8265)}  # no "from": any source (Ray token auth guards it)
    svc = network_policy(spec.parse_service(service_body(name="chat")), NetworkPolicyConfig(peers=(KUBERAY,)))
    assert svc["metadata"]["name"] == "chat-ray"
    assert svc["spec"]["podSelector"] == {"matchLabels": {SERVICE_LABEL: "chat"}}
    _, dashboard, peers, clients = svc["spec"]["ingress"]
    assert dashboard == {"ports": TCP(8265)}
    assert peers == {"from": [KUBERAY.selector()], "ports": TCP(8000)}  # KubeRay reads Serve's health
    assert clients == {"ports": TCP(8000)}  # spec.exposure's default: any source


def test_strict_mode_admits_the_dashboard_only_from_the_peers_and_metrics_only_from_the_scrapers():
    config = NetworkPolicyConfig("strict", (KUBERAY, OPERATOR, Peer(cidr="10.128.0.0/20")),
                                        (Peer("gmp-system"),))
    own, peers, metrics = network_policy(spec.parse(body(name="demo")), config)["spec"]["ingress"]
    assert peers["ports"] == TCP(8265)
    assert peers["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tputorch-system"}}, "podSelector": {}},
        {"ipBlock": {"cidr": "10.128.0.0/20"}}]
    assert metrics == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}},
                                 "podSelector": {}}], "ports": TCP(8080)}
    # strict and no peer: the cluster's own pods only
    assert network_policy(spec.parse(body(name="demo")), NetworkPolicyConfig("strict"))["spec"]["ingress"] == [own]


def test_a_services_exposure_decides_who_reaches_the_serve_port():
    def clients(exposure):
        svc = spec.parse_service(service_body(name="chat", exposure=exposure))
        return network_policy(svc, NetworkPolicyConfig("strict"))["spec"]["ingress"][-1]
    assert clients({"clients": "Anywhere"}) == {"ports": TCP(8000)}
    assert clients({"clients": "InNamespace"}) == {"from": [{"podSelector": {}}], "ports": TCP(8000)}
    listed = clients({"clients": "Listed", "from": [{"namespace": "web", "podLabels": {"app": "front"}},
                                                    {"podLabels": {"role": "client"}}, {"cidr": "10.8.0.0/16"}]})
    assert listed == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "web"}},
                                "podSelector": {"matchLabels": {"app": "front"}}},
                               {"podSelector": {"matchLabels": {"role": "client"}}},
                               {"ipBlock": {"cidr": "10.8.0.0/16"}}], "ports": TCP(8000)}


def test_the_serve_service_is_kuberays_only_when_asked_and_carries_type_annotations_and_ranges():
    # The default ClusterIP: no serveService at all, KubeRay makes <name>-serve-svc as before.
    assert "serveService" not in render.rayservice(spec.parse_service(service_body()))["spec"]
    internal = {"type": "LoadBalancer", "annotations": {"networking.gke.io/load-balancer-type": "Internal"},
                "loadBalancerSourceRanges": ["10.0.0.0/8"]}
    rs = render.rayservice(spec.parse_service(service_body(exposure={"serveService": internal})))
    assert rs["spec"]["serveService"] == {
        "metadata": {"labels": {"app.kubernetes.io/managed-by": "tputorch-operator", "tputorch.io/service": "qwen"},
                     "annotations": {"networking.gke.io/load-balancer-type": "Internal"}},
        "spec": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]}}
    # No name, selector or ports: KubeRay names it <name>-serve-svc (the status's endpoint), selects
    # the serving pods of the active cluster and adds the serve port, at every cluster switch.
    assert "name" not in rs["spec"]["serveService"]["metadata"] and set(rs["spec"]["serveService"]["spec"]) == {
        "type", "loadBalancerSourceRanges"}
    # Outside rayClusterConfig: KubeRay's cluster hash leaves it out, so it never starts a new cluster.
    assert "serveService" not in json.dumps(rs["spec"]["rayClusterConfig"])
    assert render.rayservice(spec.parse_service(service_body(exposure={"serveService": {"type": "ClusterIP"}})))[
        "spec"].get("serveService") is None


def test_serves_keep_alive_outlasts_a_google_load_balancers_600_s_backend_keep_alive():
    # Google's Application Load Balancers keep an idle backend connection for a fixed 600 s: Serve's
    # proxy (Ray 2.60's default 90 s) must not close it first, or the next request on it gets a 502.
    options = serve_config(rendered_service({}))["http_options"]
    assert options == {"keep_alive_timeout_s": SERVE_KEEP_ALIVE_S} and SERVE_KEEP_ALIVE_S > 600


def test_a_job_and_a_service_of_one_name_never_share_a_network_policy_name():
    names = set()
    for name in ("chat", "chat-ray", "chat-rayjob", "x-ray"):
        names.add(network_policy_name(spec.parse(body(name=name))))
        names.add(network_policy_name(spec.parse_service(service_body(name=name))))
    assert len(names) == 8


def test_the_cache_volume_holds_the_weights_and_a_compile_cache_per_slice_shape_on_every_node():
    """Issue 35: vllm-torchtpu 0.29 compiles into VLLM_CACHE_ROOT (nothing reads VLLM_XLA_CACHE_PATH);
    the weights are shared, the compiled graphs (and torch_tpu's Tier-3 executables) are one slice
    shape's."""
    cache = {"model": {"source": "Qwen/Qwen3-0.6B", "cacheVolume": "models"},
             "volumes": [{"name": "models", "mountPath": "/models/", "pvc": {"claimName": "weights"}}]}
    roots, tier3 = set(), set()
    for tpu in ({"accelerator": "v6e", "topology": "4x4"}, {"accelerator": "v6e", "topology": "2x4"},
                {"accelerator": "v5p", "topology": "2x2x2"}):
        cluster = rendered_service({**cache, "tpu": tpu})["spec"]["rayClusterConfig"]
        for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
            env = env_of(container(template))
            assert env["HF_HOME"] == "/models/huggingface" and "VLLM_XLA_CACHE_PATH" not in env
            roots.add(env["VLLM_CACHE_ROOT"])
            tier3.add(env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"])
    assert roots == {"/models/vllm/v6e-4x4", "/models/vllm/v6e-2x4", "/models/vllm/v5p-2x2x2"}
    # Issue 56: torch_tpu's Tier-3 PJRT cache is on only with its root set; one per shape too.
    assert tier3 == {"/models/torch-tpu/v6e-4x4", "/models/torch-tpu/v6e-2x4", "/models/torch-tpu/v5p-2x2x2"}
    assert "HF_HOME" not in env_of(container(rendered_service({})["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]))


def test_every_ray_cluster_of_both_kinds_runs_with_token_auth():
    """Issue 21: KubeRay 1.6 `authOptions` on every RayCluster (a job's Secret is named when its
    RayJob is created: controller/reconcile.py), and the user's env cannot switch it off
    (RAY_AUTH_MODE in env would win over KubeRay's, which it adds only when absent)."""
    job = rendered({})["spec"]["rayClusterSpec"]
    svc = rendered_service({})["spec"]["rayClusterConfig"]
    assert job["authOptions"] == svc["authOptions"] == {"mode": "token"}
    made = {**rendered({}), "metadata": {"name": "demo", "namespace": "ml", "uid": "u1",
                                         "labels": {"tputorch.io/job": "demo", "team": "x"}}}
    assert ray_token_secret_name(made) is None
    with_ray_token_secret(made, "demo-ray-token-abc123")
    assert ray_token_secret_name(made) == "demo-ray-token-abc123"
    secret = ray_token_secret(made, "t0k3n")
    assert (secret["metadata"]["name"], secret["stringData"]) == ("demo-ray-token-abc123", {"auth_token": "t0k3n"})
    assert secret["metadata"]["labels"] == {"tputorch.io/job": "demo"}
    assert secret["metadata"]["ownerReferences"] == [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "demo", "uid": "u1"}]
    # a RayService's the same way (issue 56), owned by the RayService and labelled with its service
    made = {**rendered_service({}), "metadata": {"name": "qwen", "namespace": "ml", "uid": "u2",
                                                 "labels": {"tputorch.io/service": "qwen", "team": "x"}}}
    assert ray_token_secret_name(made) is None
    with_ray_token_secret(made, "qwen-ray-token-abc123")
    assert made["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token", "secretName": "qwen-ray-token-abc123"}
    assert ray_token_secret_name(made) == "qwen-ray-token-abc123" and is_ray_token_secret_of(made, "qwen-ray-token-abc123")
    secret = ray_token_secret(made, "t0k3n")
    assert (secret["metadata"]["name"], secret["stringData"]) == ("qwen-ray-token-abc123", {"auth_token": "t0k3n"})
    assert secret["metadata"]["labels"] == {"tputorch.io/service": "qwen"}
    assert secret["metadata"]["ownerReferences"] == [{"apiVersion": "ray.io/v1", "kind": "RayService", "name": "qwen", "uid": "u2"}]
    for cluster in (job, svc):
        for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
            names = {e["name"] for e in container(group["template"]).get("env") or []}
            assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}, names


def test_the_raycluster_bounds_patch_tests_uid_and_group_and_clamps_replicas():
    svc = spec.parse_service(service_body(replicas={"min": 2, "max": 3}))
    rc = {"metadata": {"uid": "rc-uid"}, "spec": {"workerGroupSpecs": [
        {"groupName": "tpu-slice", "replicas": 5, "minReplicas": 1, "maxReplicas": 5}]}}
    ops = raycluster_bounds_patch(svc, rc)
    assert ops[:3] == [{"op": "test", "path": "/metadata/uid", "value": "rc-uid"},
                       {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "tpu-slice"},
                       # issue 56: the replicas read, so that an autoscaler's write after it is not overwritten
                       {"op": "test", "path": "/spec/workerGroupSpecs/0/replicas", "value": 5}]
    assert {o["path"]: o["value"] for o in ops[3:]} == {
        "/spec/workerGroupSpecs/0/minReplicas": 2, "/spec/workerGroupSpecs/0/maxReplicas": 3, "/spec/workerGroupSpecs/0/replicas": 3}
    # what the autoscaler reached within the bounds stays; nothing to do when the bounds hold
    rc["spec"]["workerGroupSpecs"][0].update(replicas=2, minReplicas=2, maxReplicas=3)
    assert raycluster_bounds_patch(svc, rc) is None
    rc["spec"]["workerGroupSpecs"][0].update(replicas=3, maxReplicas=4)
    assert [o["value"] for o in raycluster_bounds_patch(svc, rc)[2:]] == [3, 2, 3, 3]
    # a group without replicas has none to test
    del rc["spec"]["workerGroupSpecs"][0]["replicas"]
    assert [o["op"] for o in raycluster_bounds_patch(svc, rc)] == ["test", "test", "add", "add", "add"]


def test_an_autoscaled_service_runs_autoscaler_v2_with_idle_timeouts_above_slice_provisioning():
    """Issue 35: KubeRay runs v2 only when autoscalerOptions.version says so; v1's KubeRay provider
    counts a multi-host group's replicas in pods, v2 in slices (numOfHosts)."""
    cluster = rendered_service({"replicas": {"min": 1, "max": 3}})["spec"]["rayClusterConfig"]
    options = cluster["autoscalerOptions"]
    assert cluster["enableInTreeAutoscaling"] is True and options["version"] == "v2"
    assert options["idleTimeoutSeconds"] >= 15 * 60  # a multi-host TPU node pool takes minutes to provision
    # A slice still pending once no demand needs it is cancelled (Ray's default: never), after
    # long enough for a multi-host slice to come, and well before Ray's 60 min allocation timeout.
    (pending,) = [e for e in options["env"] if e["name"] == "RAY_AUTOSCALER_PENDING_NODE_IDLE_TIMEOUT_S"]
    assert 5 * 60 <= int(pending["value"]) < 60 * 60, pending
    # v2 needs the head's and workers' restartPolicy Never or unset (KubeRay's validation)
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        assert template["spec"].get("restartPolicy", "Never") == "Never"
    assert "version" not in rendered({})["spec"]["rayClusterSpec"].get("autoscalerOptions", {})  # a job: no autoscaler


def test_a_services_idle_timeout_is_its_replicas_idle_timeout_seconds():
    """Issue 56: the slice idle timeout has a setting; unset, the operator's (the goldens hold it)."""
    from tputorch.render.cluster import SLICE_IDLE_TIMEOUT_S
    from tputorch.api.service_schema import service_spec_schema

    def options(replicas):
        return rendered_service({"replicas": replicas})["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert options({"min": 1, "max": 3, "idleTimeoutSeconds": 300})["idleTimeoutSeconds"] == 300
    assert options({"min": 0, "max": 2, "idleTimeoutSeconds": 7200})["idleTimeoutSeconds"] == 7200
    assert options({"min": 1, "max": 3})["idleTimeoutSeconds"] == SLICE_IDLE_TIMEOUT_S
    with_field = rendered_service({"replicas": {"min": 1, "max": 3, "idleTimeoutSeconds": SLICE_IDLE_TIMEOUT_S}})
    assert with_field == rendered_service({"replicas": {"min": 1, "max": 3}})  # the default, set, renders the same
    described = service_spec_schema()["properties"]["replicas"]["properties"]["idleTimeoutSeconds"]["description"]
    assert f"default {SLICE_IDLE_TIMEOUT_S}" in described


def test_lora_renders_rays_lora_config_and_vllms_matching_slots():
    cfg = llm_config(rendered_service(SERVICE_CASES["service-v6e-4x4-lora"]))
    assert cfg["lora_config"] == {"dynamic_lora_loading_path": "gs://my-adapters/qwen3", "max_num_adapters_per_replica": 8}
    assert {k: cfg["engine_kwargs"][k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == {
        "enable_lora": True, "max_loras": 8, "max_lora_rank": 64}
    assert "lora_config" not in llm_config(rendered_service({}))


@pytest.mark.parametrize("source", ["gs://my-models/Qwen3-30B-A3B", "/models/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"])
def test_the_load_format_is_the_users_alone(source):
    """No source gets a load_format the user did not set: streaming a gs:// model is opt-in (an
    operator upgrade must not switch a running service's loader, nor what its image needs)."""
    assert "load_format" not in llm_config(rendered_service({"model": {"source": source}}))["engine_kwargs"]
    streamed = llm_config(rendered_service({"model": {"source": source}, "engine": {"args": {"load_format": "runai_streamer"}}}))
    assert streamed["engine_kwargs"]["load_format"] == "runai_streamer"
