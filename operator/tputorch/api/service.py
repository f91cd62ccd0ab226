"""TPUTorchService: its own block (model, engine, replicas) on top of the shared one (common.py), and
its parser."""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from . import topology
from .network import Exposure, parse_exposure
from .storage import check_bucket
from .vllm_args import ENGINE_ARGS, FRONTEND_APP_ARGS, FRONTEND_SERVER_ARGS, VLLM_VERSION
from .common import (
    DNS1123_SUBDOMAIN, MAX_PODS_DEFAULT, COMMON_FIELDS, TPU_FIELDS, CommonSpec, KindRules, TPU, check_pods, common_fields,
    parse_common,
)
from .reader import INT32_MAX, MAX_REPLICAS, FieldError, InvalidSpec, Reader, between, freeform, string

# KubeRay's limit for a RayService name (its RayCluster is <name>-<5 chars> too); the Serve
# Service <name>-serve-svc (10 more characters) stays within a 63-character label below it.
RAYSERVICE_NAME_MAX = 47
SERVICE_KIND = "TPUTorchService"
# The LLMConfig a service renders (accelerator_config with a TPU topology) is checked against 2.60.
SERVICE_MIN_RAY_VERSION = (2, 60, 0)
SERVICE_SINGLE_SLICE_REASON = (
    "must be 1: each model replica of a TPUTorchService is one whole slice; "
    "serve more with spec.replicas (one slice per replica)"
)
# TPUTorchService: vLLM picks its own device split from tensor/pipeline parallelism, so there is no
# chipsPerWorker.
SERVICE_TPU_FIELDS = TPU_FIELDS - {"chipsPerWorker"}
SERVICE_SPEC_FIELDS = COMMON_FIELDS | {"model", "engine", "replicas", "serve", "upgradeStrategy", "exposure", "lora"}
MODEL_FIELDS = {"source", "name", "hfTokenSecret", "cacheVolume"}
# spec.model.cacheVolume: the spec.volumes entry (a GCS FUSE bucket or a PVC) that holds the
# Hugging Face download cache and vLLM's compile cache, so that a restart, an upgrade or a new
# replica reads the weights and compiled graphs instead of downloading and compiling again.
# vllm-torchtpu 0.29 keeps its compile artefacts under VLLM_CACHE_ROOT (VLLM_XLA_CACHE_PATH is the
# JAX tpu-inference variable: nothing in vllm-torchtpu reads it). torch_tpu's on-disk Tier-3 PJRT
# cache (the helper executables it compiles beside vLLM's graphs) is on only when
# TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT names a directory: without it they compile on every start.
TIER3_CACHE_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
CACHE_ENV = ("HF_HOME", "VLLM_CACHE_ROOT", TIER3_CACHE_ENV)
# spec.model.source is one of three forms (source_kind): a Hugging Face repo id, downloaded by Ray
# Serve LLM / vLLM; a path on the hosts (a mounted volume); or gs://<bucket>[/<folder>] on Cloud
# Storage, read with the pods' Workload Identity. Other object stores (s3://, abfss://) need
# credentials the operator does not manage, so any other scheme is refused.
# A gs:// source is downloaded whole by Ray Serve LLM 2.60 to every host's HF_HOME (the boot disk,
# or spec.model.cacheVolume) before vLLM starts, unless engine.args.load_format is a streaming one
# (llm_config.py: only STREAMING_LOAD_FORMATS skip it): runai_streamer makes vLLM's Run:ai streamer
# read the safetensors from the bucket into memory, nothing on disk; the image then needs
# runai-model-streamer[gcs]. It is the user's choice, not the operator's default: it has run here on
# vLLM's CPU build only (tests/serving/test_runai_streamer.py), not with vllm-torchtpu's loader on a
# TPU, and a default would switch every running gs:// service's loader, and its image's needs, at an
# operator upgrade.
GCS_SOURCE = re.compile(r"gs://(?P<bucket>[^/]*)(/.*)?")
SOURCE_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
SOURCE_FORMS = ("a Hugging Face repo id (owner/name), gs://<bucket>/<folder> on Cloud Storage, "
                "or an absolute path on the hosts (a mounted volume)")
STREAMING_LOAD_FORMAT = "runai_streamer"
# vLLM 0.29's runai_streamer_sharded (its ShardedStateLoader) looks for the per-rank files with a
# local glob (it lists only s3:// remotely), and Ray skips its download for a streaming format: from
# gs:// or a Hub repo it finds no file and the replica fails.
PATH_ONLY_LOAD_FORMATS = ("runai_streamer_sharded",)


def source_kind(source: str) -> str:
    """How spec.model.source is read: "gcs" (a bucket), "path" (a directory on the hosts, e.g. a
    GCS FUSE mount) or "hub" (a Hugging Face repo id, downloaded)."""
    if source.startswith("gs://"):
        return "gcs"
    return "path" if source.startswith("/") else "hub"


def _check_source(v: str) -> str | None:
    if (m := GCS_SOURCE.fullmatch(v)) is not None:
        if (problem := check_bucket(m["bucket"])) is not None:
            return f"names the bucket {m['bucket']!r}, which {problem}"
        return None
    if SOURCE_SCHEME.match(v):
        return f"must be {SOURCE_FORMS}: the pods read Cloud Storage with their Workload Identity, no other store"
    return string(what=SOURCE_FORMS)(v)


def cache_env(cache_path: str, s: topology.Slice) -> dict[str, str]:
    """CACHE_ENV under spec.model.cacheVolume's mountPath. The weights are the same on every slice;
    compiled graphs belong to one mesh, so each generation and topology has its own compile
    directory (vLLM's and torch_tpu's alike): two services of different shapes on one volume never
    read each other's graphs or executables."""
    shape = f"{s.generation.name}-{s.topology}"
    return {"HF_HOME": f"{cache_path}/huggingface",
            "VLLM_CACHE_ROOT": f"{cache_path}/vllm/{shape}",
            TIER3_CACHE_ENV: f"{cache_path}/torch-tpu/{shape}"}

# spec.lora: LoRA adapters loaded on demand (Ray Serve LLM's lora_config, Serve's model multiplexing).
# Each folder under spec.lora.path is one adapter, asked for as model "<spec.model.name>:<folder>";
# a replica downloads it on its first request and keeps the most recent maxAdaptersPerReplica.
LORA_FIELDS = {"path", "maxAdaptersPerReplica", "maxRank"}
# A GCS bucket (3-222 characters) and an optional folder in it: the TPU hosts read it through the
# service's Kubernetes ServiceAccount (Workload Identity); Ray's other stores (s3://, abfss://) need
# credentials the operator does not manage.
LORA_PATH = re.compile(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\s]*)?")
# vLLM 0.29's LoRAConfig.max_lora_rank choices.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORA_ADAPTERS = 256
# engine.args the operator sets from spec.lora: vLLM's LoRA slots match what Serve keeps per replica.
LORA_ENGINE_ARGS = {"enable_lora": "spec.lora", "max_loras": "spec.lora.maxAdaptersPerReplica",
                    "max_lora_rank": "spec.lora.maxRank"}


@dataclass(frozen=True)
class Lora:
    path: str  # gs://bucket/folder, one subfolder per adapter
    max_adapters: int  # per replica: Serve's max_num_adapters_per_replica and vLLM's max_loras
    max_rank: int  # vLLM's max_lora_rank: the largest rank of any adapter


SECRET_REF_FIELDS = {"name", "key"}
ENGINE_FIELDS = {"tensorParallelSize", "pipelineParallelSize", "enableExpertParallel", "maxModelLen", "args"}
REPLICA_FIELDS = {"min", "max", "idleTimeoutSeconds"}
SERVE_FIELDS = {"targetOngoingRequests", "maxOngoingRequests", "healthCheckPeriodSeconds", "healthCheckTimeoutSeconds",
                "initializingTimeoutSeconds", "clusterDeletionDelaySeconds", "gracefulShutdownTimeoutSeconds", "routing",
                "ingressReplicas", "scaleToZeroDelaySeconds", "downscaleDelaySeconds"}
# Optional, unset: KubeRay's and Serve's own defaults (60 s; 20 s). Long streamed completions want more:
# KubeRay deletes the old RayCluster this long after an upgrade's switch (cutting its streams), and Serve
# gives a replica it stops (scale-down, in-place redeploy) this long to finish its requests.
MAX_CLUSTER_DELETION_DELAY_S = 86400
MAX_GRACEFUL_SHUTDOWN_S = 86400
# spec.serve.scaleToZeroDelaySeconds: how long an idle model keeps its last replica (Serve's
# downscale_to_zero_delay_s; unset, Serve waits its downscale_delay_s, 600 s).
MAX_SCALE_TO_ZERO_DELAY_S = 86400
# spec.serve.downscaleDelaySeconds: how long load must stay low before Serve stops a replica above
# replicas.min (its downscale_delay_s, unset 600 s); the slice under it is then idle, and Ray's
# autoscaler gives it back after the cluster's idle timeout (render/cluster.py SLICE_IDLE_TIMEOUT_S).
MAX_DOWNSCALE_DELAY_S = 86400
# spec.replicas.idleTimeoutSeconds: how long a slice runs idle before Ray's autoscaler gives it back
# (autoscalerOptions.idleTimeoutSeconds; unset, the operator's 1800 s, render/cluster.py
# SLICE_IDLE_TIMEOUT_S). At least a minute (Ray's own default): a slice given back within seconds of
# a lull costs minutes of provisioning and a cold start when the load returns; at most a day.
MIN_IDLE_TIMEOUT_S = 60
MAX_IDLE_TIMEOUT_S = 86400
# KubeRay 1.5's RayService upgrade strategies (spec.upgradeStrategy.type) that run without a feature
# gate. NewCluster (KubeRay's default): a cluster-spec edit starts a whole second RayCluster, i.e. a
# second set of slices, and switches over when it serves. None: cluster-spec edits are not rolled
# out (serveConfigV2 edits still are, in place). NewClusterWithIncrementalUpgrade needs KubeRay's
# RayServiceIncrementalUpgrade gate and the Gateway API: not offered.
NO_UPGRADE = "None"  # KubeRay rolls out no cluster-spec edit (rayservice_controller.go isZeroDowntimeUpgradeEnabled)
UPGRADE_STRATEGIES = ("NewCluster", NO_UPGRADE)
# How Serve picks the replica for a request: PowerOfTwo is Serve's own (the less loaded of two at
# random); PrefixAware is Ray Serve LLM's PrefixCacheAffinityRouter (a request goes to the replica
# that served the longest prefix of its prompt, so vLLM's prefix cache hits, while load is even).
SERVE_ROUTINGS = ("PowerOfTwo", "PrefixAware")
MAX_INGRESS_REPLICAS = 64
# engine.args keys the operator owns: the first-class fields (in vLLM's spelling), what Ray Serve
# LLM sets itself (model, served_model_name from spec.model) and the executor, which Ray forces
# to "ray" on TPU.
ENGINE_FIELD_ARGS = {
    "tensor_parallel_size": "spec.engine.tensorParallelSize",
    "pipeline_parallel_size": "spec.engine.pipelineParallelSize",
    "enable_expert_parallel": "spec.engine.enableExpertParallel",
    "max_model_len": "spec.engine.maxModelLen",
}
ENGINE_OWNED_ARGS = {
    "model": "Ray Serve LLM sets it from spec.model.source; use that",
    "served_model_name": "Ray Serve LLM sets it from spec.model.name; use that",
    "distributed_executor_backend": "Ray forces the ray executor on TPU",
}
# FrontendArgs' own fields configure vLLM's HTTP server, which never runs under Ray Serve: Serve's
# proxy answers on the head's port 8000 (<name>-serve-svc). Set, they would do nothing, and an API
# key or TLS would seem to protect a service that is open; so each is refused with the reason.
_SERVE_ANSWERS_HTTP = ("Ray Serve's proxy answers HTTP on the head's serve port 8000 (the <name>-serve-svc Service); "
                       "vLLM's own HTTP server, which this configures, does not run under Ray Serve")
_AUTH_AT_THE_EDGE = ("put a Gateway with IAP or an API gateway in front of <name>-serve-svc "
                     "(docs/tasks/expose-a-service.md)")
_SERVER_ARG_REASONS = {
    "host": _SERVE_ANSWERS_HTTP, "port": _SERVE_ANSWERS_HTTP, "uds": _SERVE_ANSWERS_HTTP,
    "api_key": f"{_SERVE_ANSWERS_HTTP}, so no key would be checked: {_AUTH_AT_THE_EDGE}",
    **{k: f"{_SERVE_ANSWERS_HTTP}: terminate TLS at a Gateway or Ingress in front of <name>-serve-svc"
       for k in FRONTEND_SERVER_ARGS if k.startswith("ssl_") or k == "enable_ssl_refresh"},
    **{k: ("vLLM's data-parallel supervisor of its own multi-port server, which does not run under Ray Serve; "
           "serve more with spec.replicas") for k in FRONTEND_SERVER_ARGS if k.startswith(("dp_supervisor_", "data_parallel_supervisor"))},
}
# The one FrontendArgs field the frontend's app state reads (the pooling score endpoint's MaxSim).
_SERVER_ARGS_READ = {"enable_flash_late_interaction"}
REFUSED_FRONTEND_ARGS = {k: _SERVER_ARG_REASONS.get(k, _SERVE_ANSWERS_HTTP)
                         for k in FRONTEND_SERVER_ARGS - _SERVER_ARGS_READ}
# What Ray Serve LLM takes in engine_kwargs (vllm_models.py: FrontendArgs fields, else AsyncEngineArgs).
SERVE_ENGINE_ARGS = ENGINE_ARGS | FRONTEND_APP_ARGS | (FRONTEND_SERVER_ARGS & _SERVER_ARGS_READ)
SERVICE_DEFAULTS: dict[str, Any] = {
    "engine.pipelineParallelSize": 1,
    "engine.enableExpertParallel": False,
    "replicas.min": 1,
    # Ray Serve LLM's own defaults are 1e9 for both, so an autoscaled service never scales on load.
    # Starting points for a batching engine (vLLM's max_num_seqs is in the hundreds); tune them.
    "serve.targetOngoingRequests": 32,
    "serve.maxOngoingRequests": 128,
    # Google's vLLM TorchTPU Ray Serve sample: loading weights and the XLA compile take minutes.
    "serve.healthCheckPeriodSeconds": 30,
    "serve.healthCheckTimeoutSeconds": 900,
    # KubeRay's ray.io/initializing-timeout: how long a service may stay un-ready from its creation
    # (slice provisioning, image pull, weights, compile) before KubeRay fails it and releases the
    # slices. 0: never.
    "serve.initializingTimeoutSeconds": 3600,
    "serve.routing": "PowerOfTwo",
    # Ray Serve LLM's OpenAiIngress: one replica (min = max = 1) takes every request's HTTP and
    # streams the tokens back; more for many concurrent streams.
    "serve.ingressReplicas": 1,
    "upgradeStrategy": "NewCluster",
    # A few adapters per replica: vLLM reserves device memory for every slot at every rank.
    "lora.maxAdaptersPerReplica": 4,
    "lora.maxRank": 16,  # vLLM's own default
}
# Environment the operator sets on a service's pods (render/env.py), never the user's to repeat.
SERVICE_ENV = {
    "TPU_MULTIHOST_BACKEND": "the operator sets it to ray on every slice: vllm-torchtpu then runs its engine on the slice's hosts through Ray",
    topology.RAY_TPU_RESOURCE_PER_CHIP: "the operator decides it from spec.tpu (Ray's default of 1 TPU resource per chip; TPU7x, whose chips would count 2, is refused for services)",
    "TORCH_TPU_TOPOLOGY": "the operator sets it from spec.tpu (the slice's mesh for vllm-torchtpu)",
}
HF_TOKEN_ENV = "HF_TOKEN"

SERVICE = KindRules(SERVICE_KIND, SERVICE_SPEC_FIELDS, SERVICE_TPU_FIELDS, SERVICE_SINGLE_SLICE_REASON, RAYSERVICE_NAME_MAX,
                    "RayService", SERVICE_MIN_RAY_VERSION, "the TPU LLMConfig the operator writes is checked against Ray 2.60")


@dataclass(frozen=True, kw_only=True)
class ServiceSpec(CommonSpec):
    model_source: str
    model_name: str
    hf_token_secret: tuple[str, str] | None  # (Secret name, key)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    enable_expert_parallel: bool
    max_model_len: int | None
    engine_args: dict
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: int = SERVICE_DEFAULTS["serve.targetOngoingRequests"]
    max_ongoing_requests: int = SERVICE_DEFAULTS["serve.maxOngoingRequests"]
    health_check_period_s: int = SERVICE_DEFAULTS["serve.healthCheckPeriodSeconds"]
    health_check_timeout_s: int = SERVICE_DEFAULTS["serve.healthCheckTimeoutSeconds"]
    initializing_timeout_s: int = SERVICE_DEFAULTS["serve.initializingTimeoutSeconds"]
    cluster_deletion_delay_s: int | None = None  # RayService rayClusterDeletionDelaySeconds; None: KubeRay's 60 s
    graceful_shutdown_timeout_s: int | None = None  # Serve's graceful_shutdown_timeout_s; None: Serve's 20 s
    routing: str = SERVICE_DEFAULTS["serve.routing"]  # one of SERVE_ROUTINGS
    ingress_replicas: int = SERVICE_DEFAULTS["serve.ingressReplicas"]
    scale_to_zero_delay_s: int | None = None  # Serve's downscale_to_zero_delay_s; None: its downscale_delay_s
    downscale_delay_s: int | None = None  # Serve's downscale_delay_s; None: its own (600 s)
    idle_timeout_s: int | None = None  # autoscalerOptions.idleTimeoutSeconds; None: the operator's (render/cluster.py)
    cache_path: str | None = None  # spec.model.cacheVolume's mountPath
    upgrade_strategy: str = SERVICE_DEFAULTS["upgradeStrategy"]
    exposure: Exposure = Exposure()  # who may call the Serve port (its NetworkPolicy)
    lora: Lora | None = None  # spec.lora: adapters loaded on demand

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas > self.min_replicas


def _arg_key(key: str) -> str:
    """One spelling for every way a vLLM argument is written: tensor_parallel_size,
    tensorParallelSize and tensor-parallel-size are the same argument."""
    return re.sub(r"[-_]", "", key).lower()


_FIELD_ARG_KEYS = {_arg_key(k): (k, where) for k, where in ENGINE_FIELD_ARGS.items()}
_OWNED_ARG_KEYS = {_arg_key(k): (k, why) for k, why in ENGINE_OWNED_ARGS.items()}
_LORA_ARG_KEYS = {_arg_key(k): (k, where) for k, where in LORA_ENGINE_ARGS.items()}


_ENGINE_ARG_SPELLINGS = {_arg_key(k): k for k in SERVE_ENGINE_ARGS | set(REFUSED_FRONTEND_ARGS)}


def _parse_engine_args(r: Reader, engine: Mapping, lora_set: bool) -> dict:
    args = r.mapping(engine, "args", "spec.engine.args")
    if not freeform(r, args, "spec.engine.args"):
        return {}
    for key, value in args.items():
        path = f"spec.engine.args.{key}"
        if not isinstance(key, str) or not key:
            r.error("spec.engine.args", key, "keys must be non-empty strings (vLLM engine argument names)")
            continue
        normal = _arg_key(key)
        if normal in _FIELD_ARG_KEYS:
            name, where = _FIELD_ARG_KEYS[normal]
            r.error(path, value, f"must not be set in spec.engine.args: {name} is {where}; set it there")
        elif normal in _OWNED_ARG_KEYS:
            name, why = _OWNED_ARG_KEYS[normal]
            r.error(path, value, f"must not be set: {why}")
        elif lora_set and normal in _LORA_ARG_KEYS:
            name, where = _LORA_ARG_KEYS[normal]
            r.error(path, value, f"must not be set with spec.lora: the operator sets {name} from {where}")
        elif _ENGINE_ARG_SPELLINGS.get(normal) in REFUSED_FRONTEND_ARGS:
            r.error(path, value, f"must not be set: {REFUSED_FRONTEND_ARGS[_ENGINE_ARG_SPELLINGS[normal]]}")
        elif key not in SERVE_ENGINE_ARGS:
            # Ray Serve LLM passes engine_kwargs to vLLM's FrontendArgs or AsyncEngineArgs in the
            # replica: any other spelling fails there, after the slice was provisioned.
            known = _ENGINE_ARG_SPELLINGS.get(normal)
            r.error(path, value, f"must be written {known} (vLLM's argument name, snake_case)" if known
                    else f"is not an argument of vLLM {VLLM_VERSION} that Ray Serve LLM takes (names as in "
                    "vllm.engine.arg_utils.EngineArgs or vllm.entrypoints.launchers.cli_args.BaseFrontendArgs, snake_case)")
    return args


def _check_load_format(r: Reader, source: str | None, engine_args: Mapping) -> None:
    fmt = engine_args.get("load_format")
    if source is None or fmt not in PATH_ONLY_LOAD_FORMATS or source_kind(source) == "path":
        return
    instead = (f"set {STREAMING_LOAD_FORMAT} to stream it from the bucket, or mount the bucket with GCS FUSE and give its path"
               if source_kind(source) == "gcs" else "put the pre-sharded files on a volume and give its path")
    r.error("spec.engine.args.load_format", fmt, f"needs a spec.model.source that is a path on the hosts (starting with /), "
            f"not {source!r}: vLLM {VLLM_VERSION} finds its pre-sharded files with a local glob; {instead}")


def _secret_key(v: str) -> str | None:
    if not re.fullmatch(r"^[-._a-zA-Z0-9]+$", v) or len(v) > 253:
        return "must be a Secret key (at most 253 characters of [-._a-zA-Z0-9])"
    return None


def serving_problem(s: topology.Slice) -> tuple[str, str] | None:
    """Why a TPUTorchService cannot run on this slice, as (the spec.tpu field at fault, why), None if
    it can: the one predicate for which table rows serve (the parser and ``tputorch topologies`` ask it)."""
    if s.generation.name == "tpu7x":
        # vllm-torchtpu's tables and executor count TPU7x's two cores per chip as two devices (one
        # engine worker each), while a service's tensorParallelSize x pipelineParallelSize is its chips.
        return ("accelerator", "cannot serve a TPUTorchService: vllm-torchtpu 0.29 runs one engine worker per TPU7x "
                "core (2 per chip) and has no mesh for tensorParallelSize x pipelineParallelSize = chips; "
                "serving on TPU7x is not verified and not offered")
    default_layout = topology.host_layouts(s.generation, s.topology)[0]
    if s.chips_per_host != default_layout:
        # Ray Serve LLM reserves the slice from its topology alone (slice_placement_group), and
        # Ray maps this topology to hosts of default_layout chips: other hosts never match.
        return ("chipsPerHost", f"must be {default_layout} for a TPUTorchService on a {s.generation.name} {s.topology} slice: "
                f"Ray Serve LLM reserves the slice by its topology, which Ray maps to {default_layout}-chip hosts")
    return None


def parse_lora(r: Reader, spec: Mapping, model_name: str | None) -> Lora | None:
    lora = r.mapping(spec, "lora", "spec.lora", LORA_FIELDS)
    if not isinstance(spec.get("lora"), Mapping):  # unset, or not an object (refused above)
        return None
    path = r.value(lora, "path", "spec.lora.path", str, required=True, check=lambda v: None if LORA_PATH.fullmatch(v) else (
        "must be gs://<bucket>[/<folder>], the folder whose subfolders are the adapters (Ray Serve LLM reads it "
        "with the pods' Workload Identity; other stores are not offered)"))
    max_adapters = r.value(lora, "maxAdaptersPerReplica", "spec.lora.maxAdaptersPerReplica", int,
                           default=SERVICE_DEFAULTS["lora.maxAdaptersPerReplica"], check=between(1, MAX_LORA_ADAPTERS))
    max_rank = r.value(lora, "maxRank", "spec.lora.maxRank", int, default=SERVICE_DEFAULTS["lora.maxRank"],
                       check=lambda v: None if v in LORA_RANKS else
                       f"must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's max_lora_rank choices)")
    if model_name and ":" in model_name:
        # Ray Serve LLM splits "<model>:<adapter>" at the first colon.
        r.error("spec.model.name", model_name, "must not contain ':' when spec.lora is set: an adapter is asked for "
                "as model \"<spec.model.name>:<adapter>\"")
    if path is None or max_adapters is None or max_rank is None:
        return None
    return Lora(path=path.rstrip("/"), max_adapters=max_adapters, max_rank=max_rank)


def check_scale_to_zero(r, max_replicas: int | None, queue_name: str | None) -> None:
    """spec.replicas.min 0: what Ray's autoscaler can bring back from no slice at all (any slice: a
    multi-host replica's placement group asks for every host at once, render.replica_placement)."""
    if max_replicas is None and not any(e.path == "spec.replicas.max" for e in r.errors):
        r.error("spec.replicas.max", None, "is required when spec.replicas.min is 0 (scale to zero): the most slices "
                "the first requests may bring back, at least 1")
    if queue_name:  # not shown on the chain's Kueue: a Workload admitted with no slice, then grown by a slice
        r.error("spec.replicas.min", 0, "must be at least 1 when spec.queueName is set: a queued service may "
                "autoscale (Kueue's elastic jobs) but not to zero slices, which this operator does not support under Kueue")


def parse_service(body: Any, max_pods: int = MAX_PODS_DEFAULT) -> ServiceSpec:
    """Validate a TPUTorchService object (as a dict) and return its ServiceSpec; InvalidSpec lists every error.
    ``max_pods``: the most pods the service may make at spec.replicas.max (common.check_pods).
    The blocks are read in turn (the shared one, model, engine and lora, replicas, serve, the upgrade
    strategy, exposure), each stage returning its ServiceSpec fields; errors are listed in that order."""
    r = Reader()
    if not isinstance(body, Mapping):
        raise InvalidSpec([FieldError("", body, "must be a TPUTorchService object")])
    fields, spec, tpu = parse_common(r, body, SERVICE, _operator_env(body))
    model = _parse_model(r, spec, fields)
    engine = _parse_engine(r, spec, tpu, model["model_source"], model["model_name"])
    replicas = _parse_replicas(r, spec, tpu, fields.get("queue_name"), max_pods)
    serve = _parse_serve(r, spec, replicas["min_replicas"], replicas["max_replicas"])
    strategy = r.value(spec, "upgradeStrategy", "spec.upgradeStrategy", str, default=SERVICE_DEFAULTS["upgradeStrategy"],
                       check=lambda v: None if v in UPGRADE_STRATEGIES else
                       f"must be one of {', '.join(UPGRADE_STRATEGIES)} (KubeRay's RayService upgrade strategies)")
    exposure = parse_exposure(r, spec)

    if r.errors:
        raise InvalidSpec(r.errors)
    return ServiceSpec(**common_fields(fields, tpu), **model, **engine, **replicas, **serve,
                       upgrade_strategy=strategy, exposure=exposure)


def _operator_env(body: Mapping) -> dict[str, str]:
    """The environment variables the operator sets in a service's pods (spec.env may not set them):
    the serving ones, HF_TOKEN with spec.model.hfTokenSecret, the caches with spec.model.cacheVolume.
    Read from the raw body, before the model block is validated."""
    model = body.get("spec", {}).get("model") if isinstance(body.get("spec"), Mapping) else None
    token_secret_set = isinstance(model, Mapping) and model.get("hfTokenSecret") is not None
    operator_env = dict(SERVICE_ENV)
    if token_secret_set:
        operator_env[HF_TOKEN_ENV] = "the operator sets it from spec.model.hfTokenSecret"
    if isinstance(model, Mapping) and model.get("cacheVolume") is not None:
        operator_env.update({k: "the operator sets it under spec.model.cacheVolume's mountPath" for k in CACHE_ENV})
    return operator_env


def _parse_model(r: Reader, spec: Mapping, fields: dict) -> dict:
    """spec.model: model_source, model_name (the object's name unless set), hf_token_secret
    ((name, key) or None) and cache_path (where spec.model.cacheVolume is mounted, or None)."""
    model = r.mapping(spec, "model", "spec.model", MODEL_FIELDS)
    if spec.get("model") is None:
        r.error("spec.model", None, "is required")
    source = r.value(model, "source", "spec.model.source", str, required=isinstance(spec.get("model"), Mapping),
                     check=_check_source)
    model_name = r.value(model, "name", "spec.model.name", str, default=fields["name"], check=string(253))
    secret = r.mapping(model, "hfTokenSecret", "spec.model.hfTokenSecret", SECRET_REF_FIELDS)
    hf_token_secret = None
    if secret:
        secret_name = r.value(secret, "name", "spec.model.hfTokenSecret.name", str, required=True,
                              check=string(253, DNS1123_SUBDOMAIN, "a Secret name (a DNS subdomain)"))
        secret_key = r.value(secret, "key", "spec.model.hfTokenSecret.key", str, required=True, check=_secret_key)
        if secret_name and secret_key:
            hf_token_secret = (secret_name, secret_key)
    cache_name = r.value(model, "cacheVolume", "spec.model.cacheVolume", str, check=string(63))
    return {"model_source": source, "model_name": model_name, "hf_token_secret": hf_token_secret,
            "cache_path": _cache_path(r, cache_name, fields["volumes"])}


def _cache_path(r: Reader, cache_name: str | None, volumes: list) -> str | None:
    """The mountPath of the spec.volumes entry spec.model.cacheVolume names, when it may hold the
    caches (writable, gcs or pvc, on the workers); None when it is not set or may not."""
    if cache_name is None:
        return None
    volume = next((v for v in volumes if v.name == cache_name), None)
    if volume is None:
        r.error("spec.model.cacheVolume", cache_name, "must name one of spec.volumes"
                + (f" ({', '.join(v.name for v in volumes)})" if volumes else " (there are none)"))
    elif volume.source == "emptyDir" or volume.read_only or "worker" not in volume.mount_on:
        r.error("spec.model.cacheVolume", cache_name, "must be a writable gcs or pvc volume mounted on the workers "
                "(the TPU hosts download the weights and compile there)")
    else:
        return volume.mount_path.rstrip("/")
    return None


def _parse_engine(r: Reader, spec: Mapping, tpu: TPU, source: str | None, model_name: str | None) -> dict:
    """spec.engine and spec.lora (the engine's args depend on whether adapters are served):
    tensor_parallel_size (chips / pipelineParallelSize unless set), pipeline_parallel_size,
    enable_expert_parallel, max_model_len, engine_args and lora; and whether the slice can serve."""
    engine = r.mapping(spec, "engine", "spec.engine", ENGINE_FIELDS)
    chips = tpu.slice.chips if tpu.slice else None
    tp = r.value(engine, "tensorParallelSize", "spec.engine.tensorParallelSize", int, check=between(1, INT32_MAX))
    pp = r.value(engine, "pipelineParallelSize", "spec.engine.pipelineParallelSize", int,
                 default=SERVICE_DEFAULTS["engine.pipelineParallelSize"], check=between(1, INT32_MAX))
    expert = r.value(engine, "enableExpertParallel", "spec.engine.enableExpertParallel", bool,
                     default=SERVICE_DEFAULTS["engine.enableExpertParallel"])
    max_model_len = r.value(engine, "maxModelLen", "spec.engine.maxModelLen", int, check=between(1, INT32_MAX))
    lora = parse_lora(r, spec, model_name)
    engine_args = _parse_engine_args(r, engine, lora_set=isinstance(spec.get("lora"), Mapping))
    _check_load_format(r, source, engine_args)
    if tp is None and chips is not None and pp is not None:
        tp = chips // pp if chips % pp == 0 else None
        if tp is None:
            r.error("spec.engine.pipelineParallelSize", pp,
                    f"must divide the {chips} chips of the slice (tensorParallelSize defaults to chips / pipelineParallelSize)")
    elif tp is not None and pp is not None and chips is not None and tp * pp != chips:
        s = tpu.slice
        r.error("spec.engine.tensorParallelSize", tp,
                f"x spec.engine.pipelineParallelSize {pp} = {tp * pp} chips, but one replica is one whole "
                f"{s.generation.name} {s.topology} slice: tensorParallelSize x pipelineParallelSize must be {chips}")
    if tpu.slice is not None and (problem := serving_problem(tpu.slice)) is not None:
        field, message = problem
        r.error(f"spec.tpu.{field}", tpu.slice.chips_per_host if field == "chipsPerHost" else tpu.slice.generation.name, message)
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "enable_expert_parallel": expert,
            "max_model_len": max_model_len, "engine_args": engine_args, "lora": lora}


def _parse_replicas(r: Reader, spec: Mapping, tpu: TPU, queue_name: str | None, max_pods: int) -> dict:
    """spec.replicas: min_replicas and max_replicas (min unless set; required when min is 0), and
    the pods they make at most."""
    replicas = r.mapping(spec, "replicas", "spec.replicas", REPLICA_FIELDS)
    min_replicas = r.value(replicas, "min", "spec.replicas.min", int, default=SERVICE_DEFAULTS["replicas.min"], check=between(0, MAX_REPLICAS))
    max_replicas = r.value(replicas, "max", "spec.replicas.max", int, default=min_replicas or None, check=between(1, MAX_REPLICAS))
    if min_replicas == 0:
        check_scale_to_zero(r, max_replicas, queue_name)
    if min_replicas is not None and max_replicas is not None and max_replicas < min_replicas:
        r.error("spec.replicas.max", max_replicas, f"must be at least spec.replicas.min ({min_replicas})")

    if tpu.slice is not None and max_replicas is not None:
        check_pods(r, "spec.replicas.max", 1 + max_replicas * tpu.slice.hosts, max_pods,
                   "the head and every host of spec.replicas.max slices")
    idle_timeout = r.value(replicas, "idleTimeoutSeconds", "spec.replicas.idleTimeoutSeconds", int,
                           check=between(MIN_IDLE_TIMEOUT_S, MAX_IDLE_TIMEOUT_S))
    if idle_timeout is not None and min_replicas is not None and min_replicas == max_replicas:
        r.error("spec.replicas.idleTimeoutSeconds", idle_timeout, "is set only with spec.replicas.max above "
                f"spec.replicas.min (autoscaled): both are {min_replicas}, so Ray's autoscaler never gives a slice back")
    return {"min_replicas": min_replicas, "max_replicas": max_replicas, "idle_timeout_s": idle_timeout}


def _parse_serve(r: Reader, spec: Mapping, min_replicas: int | None, max_replicas: int | None) -> dict:
    """spec.serve: Ray Serve's request targets, health checks, timeouts, routing and ingress, and
    the autoscaling delays (each allowed only with the replica range it acts on)."""
    serve = r.mapping(spec, "serve", "spec.serve", SERVE_FIELDS)
    target = r.value(serve, "targetOngoingRequests", "spec.serve.targetOngoingRequests", int,
                     default=SERVICE_DEFAULTS["serve.targetOngoingRequests"], check=between(1, 1_000_000))
    max_ongoing = r.value(serve, "maxOngoingRequests", "spec.serve.maxOngoingRequests", int,
                          default=SERVICE_DEFAULTS["serve.maxOngoingRequests"], check=between(1, 1_000_000))
    if target is not None and max_ongoing is not None and max_ongoing < target:
        r.error("spec.serve.maxOngoingRequests", max_ongoing,
                f"must be at least spec.serve.targetOngoingRequests ({target}): a replica never holds more than this many requests")
    period = r.value(serve, "healthCheckPeriodSeconds", "spec.serve.healthCheckPeriodSeconds", int,
                     default=SERVICE_DEFAULTS["serve.healthCheckPeriodSeconds"], check=between(1, 86400))
    timeout = r.value(serve, "healthCheckTimeoutSeconds", "spec.serve.healthCheckTimeoutSeconds", int,
                      default=SERVICE_DEFAULTS["serve.healthCheckTimeoutSeconds"], check=between(1, 86400))
    init_timeout = r.value(serve, "initializingTimeoutSeconds", "spec.serve.initializingTimeoutSeconds", int,
                           default=SERVICE_DEFAULTS["serve.initializingTimeoutSeconds"], check=between(0, 7 * 86400))
    deletion_delay = r.value(serve, "clusterDeletionDelaySeconds", "spec.serve.clusterDeletionDelaySeconds", int,
                             check=between(0, MAX_CLUSTER_DELETION_DELAY_S))
    graceful = r.value(serve, "gracefulShutdownTimeoutSeconds", "spec.serve.gracefulShutdownTimeoutSeconds", int,
                       check=between(1, MAX_GRACEFUL_SHUTDOWN_S))
    routing = r.value(serve, "routing", "spec.serve.routing", str, default=SERVICE_DEFAULTS["serve.routing"],
                      check=lambda v: None if v in SERVE_ROUTINGS else f"must be one of {', '.join(SERVE_ROUTINGS)}")
    ingress = r.value(serve, "ingressReplicas", "spec.serve.ingressReplicas", int,
                      default=SERVICE_DEFAULTS["serve.ingressReplicas"], check=between(1, MAX_INGRESS_REPLICAS))
    to_zero_delay = r.value(serve, "scaleToZeroDelaySeconds", "spec.serve.scaleToZeroDelaySeconds", int,
                            check=between(0, MAX_SCALE_TO_ZERO_DELAY_S))
    if to_zero_delay is not None and min_replicas:
        r.error("spec.serve.scaleToZeroDelaySeconds", to_zero_delay, "is set only with spec.replicas.min 0 (scale to "
                f"zero): it is how long an idle model keeps its last replica, and spec.replicas.min is {min_replicas}")
    downscale_delay = r.value(serve, "downscaleDelaySeconds", "spec.serve.downscaleDelaySeconds", int,
                              check=between(0, MAX_DOWNSCALE_DELAY_S))
    if downscale_delay is not None and min_replicas == max_replicas:
        r.error("spec.serve.downscaleDelaySeconds", downscale_delay, "is set only with spec.replicas.max above "
                f"spec.replicas.min (autoscaled): both are {min_replicas}, so Serve never stops a replica for low load")
    return {"target_ongoing_requests": target, "max_ongoing_requests": max_ongoing, "health_check_period_s": period,
            "health_check_timeout_s": timeout, "initializing_timeout_s": init_timeout,
            "cluster_deletion_delay_s": deletion_delay, "graceful_shutdown_timeout_s": graceful, "routing": routing,
            "ingress_replicas": ingress, "scale_to_zero_delay_s": to_zero_delay, "downscale_delay_s": downscale_delay}

