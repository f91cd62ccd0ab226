"""TPUTorchService: every validation rule, its field path and message; defaults; parse_any."""

import pytest

import yaml

from tputorch import render
from tputorch.api import network, spec

from ..jobs import body
from ..services import service_body


def errors_of(obj):
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse_service(obj)
    return err.value.errors


def only_error(obj):
    errors = errors_of(obj)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def test_minimal_service_gets_the_documented_defaults():
    svc = spec.parse_service(service_body())
    assert (svc.slice.topology, svc.slice.hosts, svc.slice.chips) == ("4x4", 4, 16)
    assert svc.model_name == "qwen" and svc.model_source == "Qwen/Qwen3-30B-A3B" and svc.hf_token_secret is None
    assert (svc.tensor_parallel_size, svc.pipeline_parallel_size) == (16, 1)
    assert svc.enable_expert_parallel is False and svc.max_model_len is None and svc.engine_args == {}
    assert (svc.min_replicas, svc.max_replicas, svc.autoscaling) == (1, 1, False)
    assert svc.ray_version == "2.60.0" and (svc.worker.cpu, svc.head.memory) == ("8", "8Gi")


def test_scale_to_zero_on_a_single_host_slice():
    svc = spec.parse_service(service_body(tpu={"accelerator": "v6e", "topology": "2x2"}, replicas={"min": 0, "max": 2}))
    assert (svc.min_replicas, svc.max_replicas, svc.autoscaling) == (0, 2, True)


def test_scale_to_zero_on_a_multi_host_slice():
    """Issue 56: a multi-host replica's placement group brings a whole slice (tests/raysim/test_autoscaler_demand.py)."""
    svc = spec.parse_service(service_body(replicas={"min": 0, "max": 2}))
    assert (svc.slice.hosts, svc.min_replicas, svc.max_replicas, svc.autoscaling) == (4, 0, 2, True)


def test_a_queued_service_may_autoscale_from_one_slice_kueues_elastic_jobs():
    """Kueue 0.19.1 admits Ray's autoscaler on a queued RayService that is its elastic job
    (render: kueue.x-k8s.io/elastic-job); scale to zero under Kueue stays refused."""
    svc = spec.parse_service(service_body(queueName="q", replicas={"min": 1, "max": 3}))
    assert (svc.queue_name, svc.min_replicas, svc.max_replicas, svc.autoscaling) == ("q", 1, 3, True)
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse_service(service_body(queueName="q", replicas={"min": 0, "max": 3}))
    assert [e.path for e in err.value.errors] == ["spec.replicas.min"]


def test_the_reference_service():
    svc = spec.parse_service(service_body(
        model={"name": "qwen3-30b-a3b", "hfTokenSecret": {"name": "hf-token", "key": "token"}},
        engine={"tensorParallelSize": 16, "enableExpertParallel": True, "maxModelLen": 8192, "args": {"gpu_memory_utilization": 0.9}},
        replicas={"min": 1, "max": 3},
    ))
    assert svc.model_name == "qwen3-30b-a3b" and svc.hf_token_secret == ("hf-token", "token")
    assert (svc.tensor_parallel_size, svc.enable_expert_parallel, svc.max_model_len) == (16, True, 8192)
    assert svc.engine_args == {"gpu_memory_utilization": 0.9}
    assert (svc.min_replicas, svc.max_replicas, svc.autoscaling) == (1, 3, True)


def test_pipeline_parallel_sets_the_tensor_parallel_default_and_max_defaults_to_min():
    svc = spec.parse_service(service_body(engine={"pipelineParallelSize": 4}, replicas={"min": 2}))
    assert (svc.tensor_parallel_size, svc.pipeline_parallel_size) == (4, 4)
    assert (svc.min_replicas, svc.max_replicas) == (2, 2)


def test_both_kinds_expose_the_same_reconcile_attributes():
    job, svc = spec.parse(body(name="a")), spec.parse_service(service_body(name="b"))
    for s in (job, svc):
        assert (s.namespace, s.slice.topology, s.labels) == ("ml", "4x4", {})
    assert (job.name, svc.name) == ("a", "b")


@pytest.mark.parametrize(
    "overrides,path,fragment",
    [
        ({"engine": {"tensorParallelSize": 8}}, "spec.engine.tensorParallelSize",
         "8 x spec.engine.pipelineParallelSize 1 = 8 chips, but one replica is one whole v6e 4x4 slice: tensorParallelSize x pipelineParallelSize must be 16"),
        ({"engine": {"tensorParallelSize": 8, "pipelineParallelSize": 4}}, "spec.engine.tensorParallelSize", "= 32 chips"),
        ({"engine": {"pipelineParallelSize": 3}}, "spec.engine.pipelineParallelSize", "must divide the 16 chips of the slice"),
        ({"engine": {"tensorParallelSize": 0}}, "spec.engine.tensorParallelSize", "must be at least 1"),
        ({"engine": {"maxModelLen": 0}}, "spec.engine.maxModelLen", "must be at least 1"),
        ({"engine": {"maxModelLen": "8k"}}, "spec.engine.maxModelLen", "must be an integer"),
        ({"engine": {"enableExpertParallel": "yes"}}, "spec.engine.enableExpertParallel", "must be a boolean"),
        ({"engine": {"tp": 16}}, "spec.engine.tp", "is not a known field"),
        ({"engine": {"args": ["--x"]}}, "spec.engine.args", "must be an object"),
        ({"engine": {"args": {"tensor_parallel_size": 16}}}, "spec.engine.args.tensor_parallel_size",
         "tensor_parallel_size is spec.engine.tensorParallelSize; set it there"),
        ({"engine": {"args": {"tensorParallelSize": 16}}}, "spec.engine.args.tensorParallelSize", "is spec.engine.tensorParallelSize"),
        ({"engine": {"args": {"pipeline-parallel-size": 1}}}, "spec.engine.args.pipeline-parallel-size", "is spec.engine.pipelineParallelSize"),
        ({"engine": {"args": {"enable_expert_parallel": True}}}, "spec.engine.args.enable_expert_parallel", "is spec.engine.enableExpertParallel"),
        ({"engine": {"args": {"maxModelLen": 4096}}}, "spec.engine.args.maxModelLen", "is spec.engine.maxModelLen"),
        ({"engine": {"args": {"distributed_executor_backend": "mp"}}}, "spec.engine.args.distributed_executor_backend", "Ray forces the ray executor on TPU"),
        ({"engine": {"args": {"distributedExecutorBackend": "ray"}}}, "spec.engine.args.distributedExecutorBackend", "Ray forces the ray executor"),
        ({"engine": {"args": {"model": "x"}}}, "spec.engine.args.model", "from spec.model.source"),
        ({"engine": {"args": {"served_model_name": "x"}}}, "spec.engine.args.served_model_name", "from spec.model.name"),
        ({"model": {"source": ""}}, "spec.model.source", "must not be empty"),
        ({"model": {"source": 7}}, "spec.model.source", "must be a string"),
        ({"model": {"source": "q", "hfTokenSecret": {"name": "hf"}}}, "spec.model.hfTokenSecret.key", "is required"),
        ({"model": {"source": "q", "hfTokenSecret": {"name": "Bad_Name", "key": "t"}}}, "spec.model.hfTokenSecret.name", "a Secret name"),
        ({"model": {"source": "q", "hfTokenSecret": {"name": "hf", "key": "a b"}}}, "spec.model.hfTokenSecret.key", "must be a Secret key"),
        ({"model": {"source": "q", "format": "gguf"}}, "spec.model.format", "is not a known field"),
        ({"replicas": {"min": -1}}, "spec.replicas.min", "must be between 0 and 64"),
        ({"replicas": {"min": 1, "max": 2, "idleTimeoutSeconds": 59}}, "spec.replicas.idleTimeoutSeconds", "must be between 60 and 86400"),
        ({"replicas": {"min": 1, "max": 2, "idleTimeoutSeconds": 86401}}, "spec.replicas.idleTimeoutSeconds", "must be between 60 and 86400"),
        ({"replicas": {"min": 1, "max": 2, "idleTimeoutSeconds": "30m"}}, "spec.replicas.idleTimeoutSeconds", "must be an integer"),
        ({"replicas": {"min": 2, "max": 2, "idleTimeoutSeconds": 600}}, "spec.replicas.idleTimeoutSeconds",
         "is set only with spec.replicas.max above spec.replicas.min (autoscaled): both are 2, so Ray's autoscaler never gives a slice back"),
        ({"replicas": {"idleTimeoutSeconds": 600}}, "spec.replicas.idleTimeoutSeconds", "is set only with spec.replicas.max above"),
        ({"tpu": {"accelerator": "v6e", "topology": "2x2"}, "replicas": {"min": 0}}, "spec.replicas.max",
         "is required when spec.replicas.min is 0 (scale to zero)"),
        ({"tpu": {"accelerator": "v6e", "topology": "2x2"}, "replicas": {"min": 0, "max": 0}}, "spec.replicas.max",
         "must be between 1 and 64"),
        ({"tpu": {"accelerator": "v6e", "topology": "2x2"}, "replicas": {"min": 0, "max": 1}, "queueName": "q"},
         "spec.replicas.min", "must be at least 1 when spec.queueName is set"),
        ({"serve": {"scaleToZeroDelaySeconds": 60}}, "spec.serve.scaleToZeroDelaySeconds",
         "is set only with spec.replicas.min 0 (scale to zero)"),
        ({"tpu": {"accelerator": "v6e", "topology": "2x2"}, "replicas": {"min": 0, "max": 1},
          "serve": {"scaleToZeroDelaySeconds": -1}}, "spec.serve.scaleToZeroDelaySeconds", "must be between 0 and 86400"),
        ({"serve": {"downscaleDelaySeconds": 30}}, "spec.serve.downscaleDelaySeconds",
         "is set only with spec.replicas.max above spec.replicas.min (autoscaled): both are 1"),
        ({"replicas": {"min": 1, "max": 2}, "serve": {"downscaleDelaySeconds": 86401}}, "spec.serve.downscaleDelaySeconds",
         "must be between 0 and 86400"),
        ({"replicas": {"max": 10**6}}, "spec.replicas.max", "must be between 1 and 64"),
        ({"replicas": {"min": 3, "max": 2}}, "spec.replicas.max", "must be at least spec.replicas.min (3)"),
        ({"replicas": {"max": "3"}}, "spec.replicas.max", "must be an integer"),
        ({"tpu": {"slices": 2}}, "spec.tpu.slices", "each model replica of a TPUTorchService is one whole slice"),
        ({"tpu": {"chipsPerWorker": 4}}, "spec.tpu.chipsPerWorker", "is not a known field"),
        ({"tpu": {"topology": "2x4", "chipsPerHost": 4}, "engine": {"tensorParallelSize": 8}}, "spec.tpu.chipsPerHost",
         "must be 8 for a TPUTorchService on a v6e 2x4 slice: Ray Serve LLM reserves the slice by its topology"),
        ({"tpu": {"topology": "4x5"}}, "spec.tpu.topology", "is not a v6e slice on GKE"),
        ({"rayVersion": "2.59.1"}, "spec.rayVersion", "must be 2.60.0 or newer"),
        ({"env": [{"name": "TPU_VISIBLE_CHIPS", "value": "0"}]}, "spec.env[0].name", "Ray sets it per worker"),
        ({"env": [{"name": "TPU_MULTIHOST_BACKEND", "value": "mp"}]}, "spec.env[0].name", "the operator sets it to ray"),
        ({"runtimeEnv": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS": "1"}}},
         "spec.runtimeEnv.env_vars.RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "chip isolation off"),
        ({"entrypoint": "python serve.py"}, "spec.entrypoint", "is not a known field"),
        ({"image": ""}, "spec.image", "must not be empty"),
        # engine.args are vLLM 0.29's AsyncEngineArgs and frontend names, as Ray Serve LLM passes them on.
        ({"engine": {"args": {"gpuMemoryUtilization": 0.9}}}, "spec.engine.args.gpuMemoryUtilization",
         "must be written gpu_memory_utilization (vLLM's argument name, snake_case)"),
        ({"engine": {"args": {"enable-prefix-caching": True}}}, "spec.engine.args.enable-prefix-caching",
         "must be written enable_prefix_caching"),
        ({"engine": {"args": {"toolCallParser": "hermes"}}}, "spec.engine.args.toolCallParser", "must be written tool_call_parser"),
        ({"engine": {"args": {"gpu_mem_util": 0.9}}}, "spec.engine.args.gpu_mem_util",
         "is not an argument of vLLM 0.29.0 that Ray Serve LLM takes"),
        ({"engine": {"args": {"_api_process_rank": 1}}}, "spec.engine.args._api_process_rank", "is not an argument"),
        ({"tpu": {"accelerator": "tpu7x", "topology": "2x2x2"}}, "spec.tpu.accelerator",
         "vllm-torchtpu 0.29 runs one engine worker per TPU7x core"),
        ({"env": [{"name": "TORCH_TPU_TOPOLOGY", "value": "4x4x1"}]}, "spec.env[0].name", "the operator sets it from spec.tpu"),
        # vLLM's own HTTP server's options: refused by name with the reason, in any spelling.
        ({"engine": {"args": {"port": 8080}}}, "spec.engine.args.port", "does not run under Ray Serve"),
        ({"engine": {"args": {"host": "0.0.0.0"}}}, "spec.engine.args.host", "Ray Serve's proxy answers HTTP on the head's serve port 8000"),
        ({"engine": {"args": {"api_key": ["k"]}}}, "spec.engine.args.api_key", "no key would be checked"),
        ({"engine": {"args": {"apiKey": ["k"]}}}, "spec.engine.args.apiKey", "no key would be checked"),
        ({"engine": {"args": {"ssl_certfile": "/c.pem"}}}, "spec.engine.args.ssl_certfile", "terminate TLS at a Gateway"),
        ({"engine": {"args": {"ssl-keyfile": "/k.pem"}}}, "spec.engine.args.ssl-keyfile", "terminate TLS at a Gateway"),
        ({"engine": {"args": {"allowed_origins": ["*"]}}}, "spec.engine.args.allowed_origins", "does not run under Ray Serve"),
        ({"engine": {"args": {"dp_supervisor_probe_interval_s": 1.0}}}, "spec.engine.args.dp_supervisor_probe_interval_s",
         "serve more with spec.replicas"),
        ({"serve": {"targetOngoingRequests": 0}}, "spec.serve.targetOngoingRequests", "must be between 1 and 1000000"),
        ({"serve": {"targetOngoingRequests": 64, "maxOngoingRequests": 16}}, "spec.serve.maxOngoingRequests",
         "must be at least spec.serve.targetOngoingRequests (64)"),
        ({"serve": {"healthCheckTimeoutSeconds": "15m"}}, "spec.serve.healthCheckTimeoutSeconds", "must be an integer"),
        ({"serve": {"initializingTimeoutSeconds": -1}}, "spec.serve.initializingTimeoutSeconds", "must be between 0"),
        ({"serve": {"numReplicas": 2}}, "spec.serve.numReplicas", "is not a known field"),
        ({"serve": {"clusterDeletionDelaySeconds": -1}}, "spec.serve.clusterDeletionDelaySeconds", "must be between 0 and 86400"),
        ({"serve": {"clusterDeletionDelaySeconds": 86401}}, "spec.serve.clusterDeletionDelaySeconds", "must be between 0 and 86400"),
        ({"serve": {"clusterDeletionDelaySeconds": "10m"}}, "spec.serve.clusterDeletionDelaySeconds", "must be an integer"),
        ({"serve": {"gracefulShutdownTimeoutSeconds": 0}}, "spec.serve.gracefulShutdownTimeoutSeconds", "must be between 1 and 86400"),
        ({"serve": {"gracefulShutdownTimeoutSeconds": 86401}}, "spec.serve.gracefulShutdownTimeoutSeconds", "must be between 1 and 86400"),
        ({"serve": {"gracefulShutdownTimeoutSeconds": 2.5}}, "spec.serve.gracefulShutdownTimeoutSeconds", "must be an integer"),
        ({"serve": {"routing": "RoundRobin"}}, "spec.serve.routing", "must be one of PowerOfTwo, PrefixAware"),
        ({"serve": {"ingressReplicas": 0}}, "spec.serve.ingressReplicas", "must be between 1 and 64"),
        ({"upgradeStrategy": "NewClusterWithIncrementalUpgrade"}, "spec.upgradeStrategy", "must be one of NewCluster, None"),
        ({"env": [{"name": "RAY_TPU_RESOURCE_PER_CHIP", "value": "1"}]}, "spec.env[0].name", "TPU7x"),
        # spec.lora: a gs:// folder of adapters; vLLM's LoRA arguments are the operator's then.
        ({"lora": {}}, "spec.lora.path", "is required"),
        ({"lora": "gs://b/a"}, "spec.lora", "must be an object"),
        ({"lora": {"path": "s3://b/adapters"}}, "spec.lora.path", "must be gs://<bucket>[/<folder>]"),
        ({"lora": {"path": "gs://MyBucket/adapters"}}, "spec.lora.path", "other stores are not offered"),
        ({"lora": {"path": "/models/adapters"}}, "spec.lora.path", "must be gs://"),
        ({"lora": {"path": "gs://bkt/a", "maxRank": 12}}, "spec.lora.maxRank",
         "must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vLLM's max_lora_rank choices)"),
        ({"lora": {"path": "gs://bkt/a", "maxAdaptersPerReplica": 0}}, "spec.lora.maxAdaptersPerReplica", "must be between 1 and 256"),
        ({"lora": {"path": "gs://bkt/a", "adapters": ["x"]}}, "spec.lora.adapters", "is not a known field"),
        ({"lora": {"path": "gs://bkt/a"}, "model": {"source": "q", "name": "qwen:8b"}}, "spec.model.name",
         "must not contain ':' when spec.lora is set"),
        ({"lora": {"path": "gs://bkt/a"}, "engine": {"args": {"enable_lora": False}}}, "spec.engine.args.enable_lora",
         "must not be set with spec.lora: the operator sets enable_lora from spec.lora"),
        ({"lora": {"path": "gs://bkt/a"}, "engine": {"args": {"maxLoras": 8}}}, "spec.engine.args.maxLoras",
         "the operator sets max_loras from spec.lora.maxAdaptersPerReplica"),
        ({"lora": {"path": "gs://bkt/a"}, "engine": {"args": {"max_lora_rank": 64}}}, "spec.engine.args.max_lora_rank",
         "the operator sets max_lora_rank from spec.lora.maxRank"),
    ],
)
def test_each_rule_names_field_value_and_what_is_allowed(overrides, path, fragment):
    err = only_error(service_body(**overrides))
    assert err.path == path
    assert fragment in str(err), str(err)
    assert str(err).startswith(path + ": ")


def test_hf_token_env_is_the_operators_only_with_a_token_secret():
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "t"}}}]
    assert spec.parse_service(service_body(env=env)).env[0]["name"] == "HF_TOKEN"
    err = only_error(service_body(env=env, model={"hfTokenSecret": {"name": "hf", "key": "token"}}))
    assert (err.path, err.value) == ("spec.env[0].name", "HF_TOKEN") and "spec.model.hfTokenSecret" in err.message


def test_model_is_required():
    b = service_body()
    del b["spec"]["model"]
    assert only_error(b).path == "spec.model"


def test_name_limit_is_kuberays_rayservice_limit():
    assert spec.RAYSERVICE_NAME_MAX == 47
    # <name>-serve-svc must stay a DNS-1035 label of at most 63 characters: 47 leaves room.
    assert len("a" * spec.RAYSERVICE_NAME_MAX + "-serve-svc") <= 63
    spec.parse_service(service_body(name="a" * 47))
    err = only_error(service_body(name="a" * 48))
    assert err.path == "metadata.name" and "at most 47 characters, since the RayService takes this name" in err.message


def test_every_error_at_once():
    errors = errors_of(service_body(
        name="Bad", tpu={"slices": 3}, engine={"maxModelLen": -1, "args": {"max_model_len": 1}},
        replicas={"min": 2, "max": 1}, model={"source": ""},
    ))
    assert {e.path for e in errors} == {
        "metadata.name", "spec.tpu.slices", "spec.engine.maxModelLen", "spec.engine.args.max_model_len",
        "spec.replicas.max", "spec.model.source",
    }


@pytest.mark.parametrize("bad", [None, [], "x", 3, {"spec": []}, {"metadata": "x", "spec": {"model": []}}])
def test_anything_else_is_an_invalid_spec(bad):
    with pytest.raises(spec.InvalidSpec):
        spec.parse_service(bad)


def test_parse_any_dispatches_on_kind():
    assert isinstance(spec.parse_any(body()), spec.JobSpec)
    assert isinstance(spec.parse_any(service_body()), spec.ServiceSpec)
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse_any({**body(), "kind": "RayJob"})
    (e,) = err.value.errors
    assert e.path == "kind" and e.message == "must be TPUTorchJob or TPUTorchService"
    with pytest.raises(spec.InvalidSpec):
        spec.parse_any(["not", "an", "object"])


@pytest.mark.parametrize("field", ["tpu", "model"])
def test_a_null_required_block_is_missing(field):
    b = service_body()
    b["spec"][field] = None
    assert only_error(b).path == f"spec.{field}"


def test_an_empty_block_lists_its_required_fields():
    b = service_body(tpu=None, model=None)
    b["spec"]["tpu"], b["spec"]["model"] = {}, {}
    assert {e.path for e in errors_of(b)} == {"spec.tpu.accelerator", "spec.tpu.topology", "spec.model.source"}


def test_serve_options_and_upgrade_strategy_defaults_and_values():
    svc = spec.parse_service(service_body())
    assert (svc.target_ongoing_requests, svc.max_ongoing_requests) == (32, 128)
    assert (svc.health_check_period_s, svc.health_check_timeout_s, svc.initializing_timeout_s) == (30, 900, 3600)
    assert svc.upgrade_strategy == "NewCluster"
    svc = spec.parse_service(service_body(serve={"targetOngoingRequests": 4, "maxOngoingRequests": 4,
                                                 "initializingTimeoutSeconds": 0}, upgradeStrategy="None"))
    assert (svc.target_ongoing_requests, svc.max_ongoing_requests, svc.initializing_timeout_s, svc.upgrade_strategy) == (4, 4, 0, "None")


def test_stream_knobs_are_unset_by_default_and_parsed_when_given():
    """spec.serve.clusterDeletionDelaySeconds and gracefulShutdownTimeoutSeconds (issue 37): unset
    leaves KubeRay's and Serve's own defaults; 0 is a valid delay (KubeRay's minimum), not unset."""
    svc = spec.parse_service(service_body())
    assert (svc.cluster_deletion_delay_s, svc.graceful_shutdown_timeout_s) == (None, None)
    svc = spec.parse_service(service_body(serve={"clusterDeletionDelaySeconds": 0, "gracefulShutdownTimeoutSeconds": 1}))
    assert (svc.cluster_deletion_delay_s, svc.graceful_shutdown_timeout_s) == (0, 1)
    svc = spec.parse_service(service_body(serve={"clusterDeletionDelaySeconds": 86400, "gracefulShutdownTimeoutSeconds": 86400}))
    assert (svc.cluster_deletion_delay_s, svc.graceful_shutdown_timeout_s) == (86400, 86400)


def test_engine_args_in_vllms_spelling_pass():
    svc = spec.parse_service(service_body(engine={"args": {"gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
                                                           "max_num_seqs": 64, "kv_cache_dtype": "auto"}}))
    assert svc.engine_args["max_num_seqs"] == 64


def test_frontend_args_ray_serve_llm_takes_pass_tool_calling_and_chat_templates():
    """Issue 35: Ray Serve LLM hands engine_kwargs that are FrontendArgs fields to vLLM's OpenAI app
    state (vllm_models.py), so tool calling and chat templates are set here."""
    args = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "chat_template": "{{ messages }}",
            "response_role": "assistant", "default_chat_template_kwargs": {"enable_thinking": False},
            "enable_flash_late_interaction": False}
    svc = spec.parse_service(service_body(engine={"args": args}))
    assert svc.engine_args == args
    cfg = yaml.safe_load(render.rayservice(svc)["spec"]["serveConfigV2"])["applications"][0]["args"]["llm_configs"][0]
    assert {k: cfg["engine_kwargs"][k] for k in args} == args


def test_every_refused_frontend_arg_is_a_vllm_server_field_and_every_server_field_is_decided():
    from tputorch.api import service, vllm_args
    assert set(service.REFUSED_FRONTEND_ARGS) < vllm_args.FRONTEND_SERVER_ARGS
    # A server field is either refused with a reason or one the app state reads: none passes unexamined.
    assert vllm_args.FRONTEND_SERVER_ARGS - set(service.REFUSED_FRONTEND_ARGS) == {"enable_flash_late_interaction"}
    assert {"host", "port", "api_key", "ssl_keyfile", "ssl_certfile", "root_path", "middleware"} <= set(service.REFUSED_FRONTEND_ARGS)
    assert not vllm_args.FRONTEND_APP_ARGS & set(service.REFUSED_FRONTEND_ARGS)


CACHE = {"name": "models", "mountPath": "/models/", "gcs": {"bucket": "my-models"}}


def test_cache_volume_names_a_writable_gcs_or_pvc_volume_on_the_workers():
    svc = spec.parse_service(service_body(model={"source": "Qwen/Qwen3-0.6B", "cacheVolume": "models"}, volumes=[CACHE]))
    assert svc.cache_path == "/models"
    for volumes, fragment in [
        ([], "must name one of spec.volumes (there are none)"),
        ([{**CACHE, "name": "other"}], "must name one of spec.volumes (other)"),
        ([{**CACHE, "readOnly": True}], "must be a writable gcs or pvc volume mounted on the workers"),
        ([{"name": "models", "mountPath": "/models", "emptyDir": {}}], "must be a writable gcs or pvc volume"),
        ([{**CACHE, "mountOn": ["head"]}], "mounted on the workers"),
    ]:
        err = only_error(service_body(model={"source": "q", "cacheVolume": "models"}, volumes=volumes))
        assert err.path == "spec.model.cacheVolume" and fragment in str(err), str(err)
    err = only_error(service_body(model={"source": "q", "cacheVolume": "models"}, volumes=[CACHE],
                                  env=[{"name": "HF_HOME", "value": "/tmp"}]))
    assert err.path == "spec.env[0].name" and "cacheVolume" in str(err)


def test_exposure_defaults_to_any_source_and_takes_namespaces_pods_and_cidrs():
    assert spec.parse_service(service_body()).exposure.clients == "Anywhere"
    assert spec.parse_service(service_body(exposure={"clients": "InNamespace"})).exposure.clients == "InNamespace"
    listed = spec.parse_service(service_body(exposure={"clients": "Listed", "from": [
        {"namespace": "web"}, {"podLabels": {"app": "front"}}, {"cidr": "10.8.0.0/16"}]})).exposure
    assert [str(p) for p in listed.peers] == ["web", ":app=front", "10.8.0.0/16"]


@pytest.mark.parametrize("exposure,path,fragment", [
    ({"clients": "Everyone"}, "spec.exposure.clients", "must be one of Anywhere, InNamespace, Listed"),
    ({"clients": "Listed"}, "spec.exposure.from", "must list at least one client"),
    ({"from": [{"namespace": "web"}]}, "spec.exposure.from", "only when spec.exposure.clients is Listed"),
    ({"clients": "Listed", "from": [{"cidr": "10.0.0.1/8"}]}, "spec.exposure.from[0].cidr", "no host bits"),
    ({"clients": "Listed", "from": [{"cidr": "10.0.0.0/8", "namespace": "web"}]}, "spec.exposure.from[0]", "cidr excludes"),
    ({"clients": "Listed", "from": [{}]}, "spec.exposure.from[0]", "must set namespace and/or podLabels, or cidr"),
    ({"clients": "Listed", "from": [{"namespace": "Web_1"}]}, "spec.exposure.from[0].namespace", "a namespace name"),
    ({"clients": "Listed", "from": [{"podLabels": {"app": "a b"}}]}, "spec.exposure.from[0].podLabels", "not a label value"),
    ({"clients": "Listed", "from": [{"ports": [80]}]}, "spec.exposure.from[0]", "unknown field"),
    ({"clients": "Listed", "from": "web"}, "spec.exposure.from", "must be a list"),
    ({"level": 1}, "spec.exposure.level", "is not a known field"),
])
def test_exposure_errors_name_the_field(exposure, path, fragment):
    err = only_error(service_body(exposure=exposure))
    assert err.path == path and fragment in str(err), str(err)


def test_the_serve_service_defaults_to_clusterip_and_takes_a_load_balancer_with_annotations_and_ranges():
    assert spec.parse_service(service_body()).exposure.serve_service == network.ServeService("ClusterIP", (), ())
    lb = spec.parse_service(service_body(exposure={"serveService": {
        "type": "LoadBalancer", "annotations": {"networking.gke.io/load-balancer-type": "Internal"},
        "loadBalancerSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]}})).exposure.serve_service
    assert lb == network.ServeService("LoadBalancer", (("networking.gke.io/load-balancer-type", "Internal"),),
                                      ("10.0.0.0/8", "192.168.0.0/16"))


@pytest.mark.parametrize("serve_service,path,fragment", [
    ({"type": "NodePort"}, "spec.exposure.serveService.type", "must be one of ClusterIP, LoadBalancer (NodePort is not offered"),
    ({"type": "ExternalName"}, "spec.exposure.serveService.type", "must be one of ClusterIP, LoadBalancer"),
    ({"loadBalancerSourceRanges": ["10.0.0.0/8"]}, "spec.exposure.serveService.loadBalancerSourceRanges",
     "only when spec.exposure.serveService.type is LoadBalancer"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": []}, "spec.exposure.serveService.loadBalancerSourceRanges",
     "non-empty list of CIDR blocks"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.1/8"]},
     "spec.exposure.serveService.loadBalancerSourceRanges[0]", "no host bits"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": [8]},
     "spec.exposure.serveService.loadBalancerSourceRanges[0]", "must be a string"),
    ({"annotations": {"bad key!": "x"}}, "spec.exposure.serveService.annotations", "is not an annotation name"),
    ({"annotations": {"a": 1}}, "spec.exposure.serveService.annotations.a", "must be a string"),
    ({"annotations": ["a"]}, "spec.exposure.serveService.annotations", "must be a map"),
    ({"annotations": {f"k{i}": "v" for i in range(33)}}, "spec.exposure.serveService.annotations", "at most 32"),
    ({"name": "mine"}, "spec.exposure.serveService.name", "is not a known field"),
])
def test_serve_service_errors_name_the_field_the_value_and_what_is_allowed(serve_service, path, fragment):
    err = only_error(service_body(exposure={"serveService": serve_service}))
    assert err.path == path and fragment in str(err), str(err)


def test_lora_defaults_and_vllms_lora_args_are_the_users_without_it():
    svc = spec.parse_service(service_body(lora={"path": "gs://my-adapters/qwen3/"}))
    assert svc.lora == spec.Lora(path="gs://my-adapters/qwen3", max_adapters=4, max_rank=16)
    assert spec.parse_service(service_body()).lora is None
    # without spec.lora, vLLM's own LoRA arguments pass through (e.g. adapters baked into the image)
    plain = spec.parse_service(service_body(engine={"args": {"enable_lora": True, "max_lora_rank": 64}}))
    assert plain.lora is None and plain.engine_args == {"enable_lora": True, "max_lora_rank": 64}


@pytest.mark.parametrize("source", ["gs://my-models/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"])
def test_runai_streamer_sharded_needs_a_path_on_the_hosts(source):
    """vLLM 0.29 finds runai_streamer_sharded's per-rank files with a local glob: from a bucket or a
    Hub repo there is nothing to find, so the replica would fail after the slice was provisioned."""
    err = only_error(service_body(model={"source": source}, engine={"args": {"load_format": "runai_streamer_sharded"}}))
    assert (err.path, err.value) == ("spec.engine.args.load_format", "runai_streamer_sharded")
    assert source in err.message and "path on the hosts" in err.message
    # what to do instead depends on where the model is
    assert ("set runai_streamer to stream it" in err.message) == source.startswith("gs://")


@pytest.mark.parametrize("source,fragment", [
    ("gs://", "names the bucket ''"),
    ("gs:///Qwen3", "names the bucket ''"),
    ("gs://My_Models/Qwen3", "names the bucket 'My_Models'"),
    ("s3://my-models/Qwen3", "no other store"),
    ("GS://my-models/Qwen3", "no other store"),
    ("hf://Qwen/Qwen3-30B-A3B", "no other store"),
])
def test_a_model_source_of_no_known_form_is_refused(source, fragment):
    err = only_error(service_body(model={"source": source}))
    assert (err.path, err.value) == ("spec.model.source", source) and fragment in err.message, err.message
    assert "Hugging Face repo id" in err.message or "Cloud Storage bucket name" in err.message


@pytest.mark.parametrize("source", ["gs://my-models", "gs://my-models/Qwen/Qwen3-30B-A3B", "/models/q", "Qwen/Qwen3-30B-A3B"])
def test_each_known_model_source_form_passes(source):
    assert spec.parse_service(service_body(model={"source": source})).model_source == source


@pytest.mark.parametrize("source,load_format", [
    ("/models/Qwen3-30B-A3B", "runai_streamer_sharded"),  # pre-sharded files on a mount
    ("Qwen/Qwen3-30B-A3B", "runai_streamer"),  # vLLM downloads from the Hub, then streams from disk
    ("gs://my-models/Qwen3-30B-A3B", "safetensors"),  # the user's choice: Ray downloads to every host
])
def test_other_load_formats_pass_with_any_source(source, load_format):
    svc = spec.parse_service(service_body(model={"source": source}, engine={"args": {"load_format": load_format}}))
    assert svc.engine_args == {"load_format": load_format}
