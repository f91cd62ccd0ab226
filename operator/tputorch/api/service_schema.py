"""The TPUTorchService's own spec schema (service_spec_schema): model, engine, replicas, Serve,
exposure and upgrades beside the blocks both kinds have, with the CEL rules that tie the engine's
parallelism to the slice's chips.
"""

from __future__ import annotations

import json

from . import network, reader, spec, topology
from .schema import common_properties, described, int_field, string_field, string_map_field
from . import service
from .service import SERVICE_KIND


def _exposure_schema() -> dict:
    peer = described(
        "A client: pods by namespace and/or labels (namespace omitted: the service's own), or an address range.",
        type="object",
        properties={
            "namespace": string_field("The clients' namespace.", maxLength=63, pattern=network.NAMESPACE_NAME.pattern),
            "podLabels": string_map_field("Labels the clients' pods carry (omitted: every pod of the namespace)."),
            "cidr": string_field("An address range (CIDR block), for clients outside the pod network.", maxLength=43),
        },
        **{"x-kubernetes-validations": [
            # namespace is a CEL keyword: escaped as __namespace__
            {"rule": "has(self.cidr) != (has(self.__namespace__) || has(self.podLabels))",
             "message": "a client sets cidr, or namespace and/or podLabels (not both)"},
            {"rule": "!has(self.cidr) || isCIDR(self.cidr)", "message": "cidr must be a CIDR block, e.g. 10.0.0.0/8"},
        ]},
    )
    return described(
        "Who may call the Serve port (the NetworkPolicy of the service's pods; the Serve port checks no token). "
        "Anywhere: any source; InNamespace: pods of the service's namespace; Listed: the clients in from.",
        type="object",
        default={},
        properties={
            "clients": string_field("Anywhere, InNamespace or Listed.", enum=list(network.EXPOSURES), default="Anywhere"),
            "from": described("The clients admitted when clients is Listed.", type="array", items=peer,
                       maxItems=network.MAX_PEERS),
            "serveService": _serve_service_schema(),
        },
        **{"x-kubernetes-validations": [{
            "rule": "(has(self.clients) && self.clients == 'Listed') == (has(self.from) && size(self.from) > 0)",
            "message": "spec.exposure.from lists the clients exactly when spec.exposure.clients is Listed",
        }, {
            # KubeRay 1.6 writes <name>-serve-svc from spec.serveService when it creates it and later
            # replaces only its spec, at a cluster switch (never its annotations): an edit would not
            # reach the Service, or only at the next upgrade.
            "rule": "has(self.serveService) == has(oldSelf.serveService) && "
                    "(!has(self.serveService) || self.serveService == oldSelf.serveService)",
            "message": f"spec.exposure.serveService is immutable: KubeRay creates <name>-serve-svc from it once and "
                       f"never updates its annotations; delete the {SERVICE_KIND} and create it again to change it",
        }]},
    )


def _serve_service_schema() -> dict:
    return described(
        "The Service KubeRay makes in front of the Serve port (<name>-serve-svc, the RayService's serveService): "
        "the same Service is retargeted at every cluster switch, so its address survives upgrades. Immutable.",
        type="object",
        properties={
            "type": string_field("ClusterIP (the default) or LoadBalancer.", enum=list(network.SERVE_SERVICE_TYPES),
                            default="ClusterIP"),
            "annotations": described("Annotations of the Service, e.g. networking.gke.io/load-balancer-type: Internal.",
                              type="object", maxProperties=network.MAX_ANNOTATIONS,
                              additionalProperties={"type": "string", "maxLength": network.MAX_ANNOTATION_VALUE}),
            "loadBalancerSourceRanges": described(
                "Client address ranges a LoadBalancer admits (CIDR blocks).", type="array",
                maxItems=network.MAX_PEERS, items={"type": "string", "maxLength": 43}),
        },
        **{"x-kubernetes-validations": [
            {"rule": "!has(self.loadBalancerSourceRanges) || (has(self.type) && self.type == 'LoadBalancer')",
             "message": "spec.exposure.serveService.loadBalancerSourceRanges may be set only when its type is LoadBalancer"},
            {"rule": "!has(self.loadBalancerSourceRanges) || self.loadBalancerSourceRanges.all(c, isCIDR(c))",
             "message": "spec.exposure.serveService.loadBalancerSourceRanges must be CIDR blocks, e.g. 10.0.0.0/8"},
        ]},
    )


def _chips_table() -> dict[str, int]:
    return {t: topology.chip_count(t) for g in topology.GENERATIONS.values() for t in g.topologies}


def service_spec_schema() -> dict:
    pp = "(has(self.engine.pipelineParallelSize) ? self.engine.pipelineParallelSize : 1)"
    return described(
        "The model to serve, its engine and on which TPU slice; each replica is one slice.",
        type="object",
        required=["tpu", "image", "model"],
        properties={
            **common_properties(SERVICE_KIND),
            "model": described(
                "The model: where its weights are and the name clients ask for.",
                type="object",
                required=["source"],
                properties={
                    "source": string_field(
                        "Hugging Face repo id (e.g. Qwen/Qwen3-30B-A3B), gs://<bucket>/<folder> or a path on the hosts. "
                        "Ray Serve LLM downloads a gs:// model to every host's HF_HOME before vLLM starts, unless "
                        "engine.args sets load_format: runai_streamer (vLLM's Run:ai streamer reads it into memory; the "
                        "image needs runai-model-streamer[gcs]).",
                        minLength=1,
                        maxLength=spec.MAX_STRING,
                    ),
                    "name": string_field(
                        "What clients send as \"model\" (the OpenAI model id); default: metadata.name.",
                        minLength=1,
                        maxLength=253,
                    ),
                    "cacheVolume": string_field(
                        "Name of a spec.volumes entry (gcs or pvc, writable, mounted on the workers) for the Hugging Face "
                        "cache (HF_HOME, <mountPath>/huggingface) and vLLM's compile cache (VLLM_CACHE_ROOT, "
                        "<mountPath>/vllm/<generation>-<topology>: one directory per slice shape) and torch_tpu's Tier-3 PJRT "
                        "cache (TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT, <mountPath>/torch-tpu/<generation>-<topology>). A streamed gs:// "
                        "model writes no weights there: the compile cache is what it keeps.",
                        minLength=1, maxLength=63),
                    "hfTokenSecret": described(
                        "Secret holding a Hugging Face token: HF_TOKEN on the head and every worker.",
                        type="object",
                        required=["name", "key"],
                        properties={
                            "name": string_field("Secret name (same namespace).", minLength=1, maxLength=253),
                            "key": string_field("Key in the Secret.", minLength=1, maxLength=253),
                        },
                    ),
                },
            ),
            "engine": described(
                "vLLM engine settings (LLMConfig.engine_kwargs).",
                type="object",
                default={},
                properties={
                    "tensorParallelSize": int_field(
                        "Chips each layer is split over; default: the slice's chips / pipelineParallelSize. "
                        "tensorParallelSize x pipelineParallelSize must equal the slice's chips.",
                        minimum=1,
                    ),
                    "pipelineParallelSize": int_field(
                        "Pipeline stages.", minimum=1, default=spec.SERVICE_DEFAULTS["engine.pipelineParallelSize"]
                    ),
                    "enableExpertParallel": described(
                        "Expert parallelism for mixture-of-experts models.",
                        type="boolean",
                        default=spec.SERVICE_DEFAULTS["engine.enableExpertParallel"],
                    ),
                    "maxModelLen": int_field("Longest context (prompt + output tokens).", minimum=1),
                    # No CEL rule here: CEL cannot type a map of arbitrary values (the API server
                    # refuses the CRD); the operator refuses the reserved keys (ValidationFailed).
                    "args": described(
                        "Other vLLM engine arguments, passed on as they are (not the fields above, "
                        "model, served_model_name or distributed_executor_backend: the operator refuses them).",
                        type="object",
                        maxProperties=reader.MAX_PROPERTIES,
                        additionalProperties={"x-kubernetes-preserve-unknown-fields": True},
                    ),
                },
            ),
            "replicas": described(
                "Model replicas, one whole slice each; KubeRay's autoscaler scales between min and max.",
                type="object",
                default={},
                properties={
                    "min": int_field("Fewest replicas; 0 scales to zero (no slice while idle).",
                                minimum=0, maximum=reader.MAX_REPLICAS, default=spec.SERVICE_DEFAULTS["replicas.min"]),
                    "max": int_field("Most replicas; default: min (required when min is 0).", minimum=1, maximum=reader.MAX_REPLICAS),
                    "idleTimeoutSeconds": int_field(
                        "Seconds a slice runs idle before Ray's autoscaler gives it back (autoscalerOptions."
                        "idleTimeoutSeconds; default 1800, above a multi-host slice's provisioning time); only with max above min.",
                        minimum=service.MIN_IDLE_TIMEOUT_S, maximum=service.MAX_IDLE_TIMEOUT_S),
                },
                **{"x-kubernetes-validations": [{
                    "rule": "!has(self.max) || self.min <= self.max",
                    "message": "spec.replicas.max must be at least spec.replicas.min",
                }, {
                    "rule": "!has(self.min) || self.min > 0 || has(self.max)",
                    "message": "spec.replicas.max is required when spec.replicas.min is 0 (scale to zero)",
                }, {
                    "rule": "!has(self.idleTimeoutSeconds) || (has(self.max) && self.max > self.min)",
                    "message": "spec.replicas.idleTimeoutSeconds is set only with spec.replicas.max above spec.replicas.min",
                }]},
            ),
            "serve": described(
                "Ray Serve options of the model's deployment (LLMConfig.deployment_config) and how long it may take to start.",
                type="object",
                default={},
                properties={
                    "targetOngoingRequests": int_field(
                        "Requests per replica the autoscaler aims at (Ray Serve LLM's default, 1e9, never scales).",
                        minimum=1, maximum=1_000_000, default=spec.SERVICE_DEFAULTS["serve.targetOngoingRequests"]),
                    "maxOngoingRequests": int_field(
                        "Most requests a replica holds at once; keep it at or above vLLM's max_num_seqs.",
                        minimum=1, maximum=1_000_000, default=spec.SERVICE_DEFAULTS["serve.maxOngoingRequests"]),
                    "healthCheckPeriodSeconds": int_field(
                        "Seconds between Serve's health checks of a replica.",
                        minimum=1, maximum=86400, default=spec.SERVICE_DEFAULTS["serve.healthCheckPeriodSeconds"]),
                    "healthCheckTimeoutSeconds": int_field(
                        "Seconds a health check may take (weights and the XLA compile take minutes).",
                        minimum=1, maximum=86400, default=spec.SERVICE_DEFAULTS["serve.healthCheckTimeoutSeconds"]),
                    "initializingTimeoutSeconds": int_field(
                        "KubeRay fails the service and releases its slices if it is not ready this long after "
                        "creation (ray.io/initializing-timeout); 0: never.",
                        minimum=0, maximum=7 * 86400, default=spec.SERVICE_DEFAULTS["serve.initializingTimeoutSeconds"]),
                    "clusterDeletionDelaySeconds": int_field(
                        "Seconds KubeRay keeps the old RayCluster after an upgrade switched to a new one "
                        "(rayClusterDeletionDelaySeconds; unset: KubeRay's 60): a stream still running on it is cut then.",
                        minimum=0, maximum=spec.MAX_CLUSTER_DELETION_DELAY_S),
                    "gracefulShutdownTimeoutSeconds": int_field(
                        "Seconds Serve gives a replica it stops (scale-down, redeploy) to finish its in-flight requests "
                        "(graceful_shutdown_timeout_s; unset: Serve's 20).",
                        minimum=1, maximum=spec.MAX_GRACEFUL_SHUTDOWN_S),
                    "scaleToZeroDelaySeconds": int_field(
                        "With replicas.min 0: seconds an idle model keeps its last replica before Serve stops it and the "
                        "slice can be given back (downscale_to_zero_delay_s; unset: Serve's downscale_delay_s, 600).",
                        minimum=0, maximum=spec.MAX_SCALE_TO_ZERO_DELAY_S),
                    "downscaleDelaySeconds": int_field(
                        "With replicas.max above replicas.min: seconds the load must stay low before Serve stops a "
                        "replica above the minimum; its slice is then idle and Ray's autoscaler gives it back after the "
                        "cluster's idle timeout (downscale_delay_s; unset: Serve's 600).",
                        minimum=0, maximum=spec.MAX_DOWNSCALE_DELAY_S),
                    "routing": string_field(
                        "How Serve picks a replica for a request. PowerOfTwo: Serve's own (the less loaded of two). "
                        "PrefixAware: Ray Serve LLM's PrefixCacheAffinityRouter, the replica that served the longest "
                        "prefix of the prompt (vLLM's prefix cache hits) until a replica is targetOngoingRequests "
                        "behind another (then the less loaded of two), its prefix tree evicting; for more than one replica. "
                        "Its prefix tree's actor runs on the head: the head gets one Ray CPU, the TPU hosts none.",
                        enum=list(spec.SERVE_ROUTINGS), default=spec.SERVICE_DEFAULTS["serve.routing"]),
                    "ingressReplicas": int_field(
                        "Replicas of Ray Serve LLM's OpenAiIngress, which takes every request's HTTP and streams the "
                        "tokens back (Ray's default: one); on the head pod, never on a TPU host (size head.cpu for them).",
                        minimum=1, maximum=spec.MAX_INGRESS_REPLICAS, default=spec.SERVICE_DEFAULTS["serve.ingressReplicas"]),
                },
                **{"x-kubernetes-validations": [{
                    # has(): the API server checks this rule against the block's default ({}) too,
                    # before the fields' own defaults are in, and refused the whole CRD without it.
                    "rule": "!has(self.maxOngoingRequests) || !has(self.targetOngoingRequests) || "
                            "self.maxOngoingRequests >= self.targetOngoingRequests",
                    "message": "spec.serve.maxOngoingRequests must be at least spec.serve.targetOngoingRequests",
                }]},
            ),
            "exposure": _exposure_schema(),
            "lora": described(
                "LoRA adapters loaded on demand (Ray Serve LLM's lora_config): each folder under path is one adapter, "
                "asked for as model \"<spec.model.name>:<folder>\"; a replica downloads it on its first request.",
                type="object",
                required=["path"],
                properties={
                    "path": string_field(
                        "gs://<bucket>[/<folder>] holding one subfolder per adapter (PEFT's adapter_config.json and "
                        "weights), read with the pods' ServiceAccount (Workload Identity).",
                        pattern="^" + spec.LORA_PATH.pattern + "$", maxLength=spec.MAX_STRING),
                    "maxAdaptersPerReplica": int_field(
                        "Adapters a replica keeps loaded (the least recently used is dropped for a new one); also "
                        "vLLM's max_loras, the adapters one batch may mix.",
                        minimum=1, maximum=spec.MAX_LORA_ADAPTERS, default=spec.SERVICE_DEFAULTS["lora.maxAdaptersPerReplica"]),
                    "maxRank": int_field(
                        "The largest LoRA rank of any adapter (vLLM's max_lora_rank).",
                        enum=list(spec.LORA_RANKS), default=spec.SERVICE_DEFAULTS["lora.maxRank"]),
                },
            ),
            "upgradeStrategy": string_field(
                "KubeRay's RayService upgrade strategy. NewCluster: an edit of the cluster (image, env, resources, "
                "engine placement) starts a second RayCluster, i.e. a second set of slices, and switches over once it "
                "serves. None: such edits are not rolled out until the service is re-created (model and Serve edits "
                "still are, in place, on the same slices).",
                enum=list(spec.UPGRADE_STRATEGIES), default=spec.SERVICE_DEFAULTS["upgradeStrategy"]),
        },
        # One rule per chip count, so that each message names the product its slices need (a
        # messageExpression computing it is refused by the API server's CEL cost estimate).
        **{"x-kubernetes-validations": [*(_parallel_rule(n, ts, pp) for n, ts in sorted(_topologies_by_chips().items())),
                                        _queued_autoscaling_rule()]},
    )


def _autoscaled(obj: str) -> str:
    """CEL: the spec ``obj`` (self or oldSelf) asks for a replica range (max above min, min's default 1)."""
    return (f"(has({obj}.replicas) && has({obj}.replicas.max) && {obj}.replicas.max > "
            f"(has({obj}.replicas.min) ? {obj}.replicas.min : {spec.SERVICE_DEFAULTS['replicas.min']}))")


def _queued_autoscaling_rule() -> dict:
    """A queued service's RayService is Kueue's elastic job exactly when it autoscales (render:
    kueue.x-k8s.io/elastic-job), and Kueue 0.19.1 refuses a change of that annotation on update
    (jobframework validatedUpdateForEnabledWorkloadSlice): the edit is refused here, with the way out."""
    return {
        "rule": f"!has(self.queueName) || !has(oldSelf.queueName) || {_autoscaled('self')} == {_autoscaled('oldSelf')}",
        "message": (f"with spec.queueName, spec.replicas may not change between a fixed count (max == min) and a range "
                    f"(max > min): the range makes the RayService Kueue's elastic job, which Kueue does not change on a "
                    f"live RayService; delete the {SERVICE_KIND} and create it again"),
    }


def _topologies_by_chips() -> dict[int, list[str]]:
    by_chips: dict[int, list[str]] = {}
    for t, n in sorted(_chips_table().items()):
        by_chips.setdefault(n, []).append(t)
    return by_chips


def _parallel_rule(chips: int, topologies: list[str], pp: str) -> dict:
    listed = json.dumps(topologies)
    return {
        "rule": (f"!has(self.engine) || !(self.tpu.topology in {listed}) || "
                 f"(has(self.engine.tensorParallelSize) ? self.engine.tensorParallelSize * {pp} == {chips} "
                 f": {chips} % {pp} == 0)"),
        "message": (f"spec.engine.tensorParallelSize x spec.engine.pipelineParallelSize must equal {chips}, the chips "
                    f"of a {'/'.join(topologies)} slice (one replica is one whole slice)"),
        "fieldPath": ".engine",
        "reason": "FieldValueInvalid",
    }
