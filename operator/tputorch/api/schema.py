"""The OpenAPI pieces both CRDs (crd.py) are written in: the typed field helpers (described,
string_field, int_field, ...), the generic bound every spec gets (bounded), and the schema of the
blocks both kinds have (common_properties: tpu, image, resources, volumes, gcsFuseSidecar, env,
tolerations, securityContext, ...), built from the tables the parser (common.py, storage.py)
validates with.
"""

from __future__ import annotations

import json

from . import common, reader, spec, storage, topology
from .reader import INT32_MAX
from .job import JOB_KIND
from .quantity import QUANTITY


def described(description: str, **schema) -> dict:
    return {"description": description, **schema}


def string_field(description: str, **schema) -> dict:
    return described(description, type="string", **schema)


def int_field(description: str, **schema) -> dict:
    # The API server does not enforce format: int32; without a maximum a huge number reaches the
    # child and KubeRay (Go, int32 fields) could not decode it.
    schema.setdefault("maximum", INT32_MAX)
    return described(description, type="integer", format="int32", **schema)


def bounded(schema: dict) -> dict:
    """``schema`` with the generic bound (reader.MAX_*) on every string, list and map that has none
    of its own: a field added later is bounded without anyone remembering to. Applied to the spec."""
    if not isinstance(schema, dict):
        return schema
    out = {k: ({n: bounded(v) for n, v in val.items()} if k == "properties" else
               bounded(val) if k in ("items", "additionalProperties") else val)
           for k, val in schema.items()}
    kind = out.get("type")
    if kind == "string" and "enum" not in out:
        out.setdefault("maxLength", reader.MAX_STRING)
    elif kind == "array":
        out.setdefault("maxItems", reader.MAX_ITEMS)
    elif kind == "object" and ("additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")):
        out.setdefault("maxProperties", reader.MAX_PROPERTIES)
    return out


def string_map_field(description: str) -> dict:
    return described(description, type="object", additionalProperties={"type": "string"})


def topology_rule() -> dict:
    table = {
        alias: list(topology.GENERATIONS[name].topologies)
        for alias, name in sorted(topology.ACCELERATOR_ALIASES.items())
    }
    table_cel = json.dumps(table, separators=(",", ":"))
    # The message joins the allowed list beforehand: join() on a looked-up list has an unbounded
    # cost estimate, which the API server refuses (messageExpression cost budget).
    allowed_cel = json.dumps({a: ", ".join(t) for a, t in table.items()}, separators=(",", ":"))
    return {
        "rule": f"self.topology in {table_cel}[self.accelerator]",
        "messageExpression": (
            f"'topology ' + self.topology + ' is not a ' + self.accelerator + "
            f"' slice on GKE; allowed: ' + {allowed_cel}[self.accelerator]"
        ),
        "fieldPath": ".topology",
        "reason": "FieldValueInvalid",
    }


def tpu_schema(kind: str) -> dict:
    accelerators = sorted(topology.ACCELERATOR_ALIASES)
    job = kind == JOB_KIND
    properties = {
        "accelerator": string_field(
            "TPU generation: v4, v5e, v5p, v6e or tpu7x (GKE's node-label forms such as "
            "tpu-v6e-slice are accepted too).",
            enum=accelerators,
            # CEL's cost estimate ignores enum: without a length bound the topology rule's
            # messageExpression is refused by the API server (cost budget exceeded).
            maxLength=max(map(len, accelerators)),
        ),
        "topology": string_field(
            "Slice topology as GKE names it (node label cloud.google.com/gke-tpu-topology), "
            "e.g. 2x2, 4x4 for v5e/v6e and 2x2x1, 2x2x2 for v4/v5p/tpu7x. "
            "`tputorch topologies` lists every supported slice.",
            pattern=r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}(x[1-9][0-9]{0,2})?$",
            maxLength=12,
        ),
        "slices": int_field(
            "Number of slices. Must be 1: PyTorch training on TPU through Ray is supported on a "
            "single slice only." if job else
            "Slices per model replica. Must be 1: scale with spec.replicas, one slice each.",
            default=spec.DEFAULTS["tpu.slices"],
            **{"x-kubernetes-validations": [{"rule": "self == 1", "message": spec.SINGLE_SLICE_REASON if job else spec.SERVICE_SINGLE_SLICE_REASON}]},
        ),
    }
    if job:
        properties["chipsPerWorker"] = int_field(
            "TPU chips per Ray Train worker (one process each). 1 (default) gives one TPU "
            "device per worker, as Ray recommends for PyTorch; must divide the chips per host.",
            enum=list(topology.VALID_CHIPS_PER_WORKER),
            default=spec.DEFAULTS["tpu.chipsPerWorker"],
        )
    properties.update({
        "chipsPerHost": int_field(
            "Chips per TPU VM, only needed where a topology has two layouts: v5e/v6e 2x4 is one "
            "8-chip VM by default, or two 4-chip VMs with chipsPerHost 4"
            + ("." if job else " (not for a service: Ray Serve LLM reserves 2x4 as one 8-chip host)."),
            enum=sorted({c for g in topology.GENERATIONS.values() for t in g.topologies for c in topology.host_layouts(g, t)}),
        ),
        "spot": described(
            "Run on Spot TPU capacity (node label cloud.google.com/gke-spot=true).",
            type="boolean",
            default=spec.DEFAULTS["tpu.spot"],
        ),
        "reservation": string_field(
            "Name of a TPU reservation to run in (node label cloud.google.com/reservation-name).",
            maxLength=63,
        ),
    })
    return described(
        f"The TPU slice {'to train on' if job else 'each model replica runs on'}: one GKE TPU node pool. "
        "Immutable after creation.",
        type="object",
        required=["accelerator", "topology"],
        properties=properties,
        **{
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": f"spec.tpu is immutable: delete the {kind} and create it again to change the slice",
                },
                topology_rule(),
                {
                    "rule": "!(has(self.reservation) && self.spot)",
                    "message": "spec.tpu.reservation must not be set together with spec.tpu.spot",
                },
            ]
        },
    )


def resources_schema(role: str, extra: dict | None = None) -> dict:
    return described(
        f"CPU, memory and ephemeral storage of each {role} pod (requests = limits; see ephemeralStorage).",
        type="object",
        properties={
            "cpu": common.resource_schema("cpu", f"CPU of each {role} pod.", spec.DEFAULTS[f"{role}.cpu"]),
            "memory": common.resource_schema("memory", f"Memory of each {role} pod.", spec.DEFAULTS[f"{role}.memory"]),
            "ephemeralStorage": described(
                f"Local ephemeral storage of each {role} pod (requests = limits): its writable layer, logs "
                "and the emptyDir volumes it mounts on the node's disk (gcs.fileCache capacities and "
                "the file cache's volume and emptyDir sizeLimits without medium Memory); must be at least their sum plus "
                f"{storage.DISK_HEADROOM}. Not set: a request of that sum plus {storage.DISK_HEADROOM} and no limit "
                "or nothing when the pod has none.",
                **{"x-kubernetes-int-or-string": True}, pattern=QUANTITY.pattern,
            ),
            **(extra or {}),
        },
        default={},
    )


def quantity_field(description: str) -> dict:
    return described(description, **{"x-kubernetes-int-or-string": True}, pattern=QUANTITY.pattern)


def _volumes_schema() -> dict:
    """spec.volumes (api/storage.py): the admission-time subset of its rules."""
    sources = storage.SOURCES
    return described(
        "Volumes mounted into the Ray containers: a Cloud Storage bucket through GKE's Cloud Storage FUSE "
        "CSI driver (gcs), a PersistentVolumeClaim (pvc) or scratch space (emptyDir); exactly one each.",
        type="array",
        maxItems=storage.MAX_VOLUMES,
        items={
            "type": "object",
            "required": ["name", "mountPath"],
            "properties": {
                "name": string_field("Volume name (DNS-1123 label), unique.", maxLength=63, pattern=storage.DNS1123_LABEL.pattern),
                "mountPath": string_field("Absolute path where the containers see it.", minLength=1, maxLength=1024,
                                     **{"x-kubernetes-validations": [{
                                         "rule": f"!self.matches('{storage.RESERVED_MOUNT_PATTERN}')",
                                         "message": "must not be " + ", ".join(storage.RESERVED_MOUNT_PATHS) + " or under them"}]}),
                "readOnly": described("Mount read-only.", type="boolean"),
                "mountOn": described(
                    "Containers that mount it: head, worker (default both).", type="array", maxItems=2,
                    items={"type": "string", "enum": list(storage.ROLES)},
                ),
                "gcs": described(
                    "A Cloud Storage bucket (the pods get the gke-gcsfuse/volumes annotation; GKE's webhook adds the "
                    "gcsfuse sidecar). The pods' service account needs access to it (Workload Identity).",
                    type="object", required=["bucket"],
                    properties={
                        "bucket": string_field("Bucket name, without gs://.", maxLength=222, pattern=storage.BUCKET.pattern),
                        "mountOptions": described(
                            "Cloud Storage FUSE mount options, e.g. implicit-dirs, only-dir=runs.", type="array",
                            maxItems=storage.MAX_MOUNT_OPTIONS, items={"type": "string", "minLength": 1, "maxLength": 256},
                        ),
                        "fileCache": described(
                            "Cloud Storage FUSE's file cache on the node: a file read once (e.g. a model's weights) is read "
                            "from the node afterwards (fileCacheCapacity, fileCacheForRangeRead), in the pod's "
                            f"{storage.CACHE_VOLUME} emptyDir the operator adds, sized above the capacity (the capacities' sum plus "
                            f"{storage.FILE_CACHE_MARGIN_PERCENT}%, at least {storage.FILE_CACHE_MARGIN_MIN}: an emptyDir over its sizeLimit "
                            "evicts the pod).",
                            type="object", required=["capacity"],
                            properties={
                                "capacity": quantity_field("Most the cache holds for this bucket, e.g. 200Gi."),
                                "medium": string_field("Of the cache volume: \"\" (the node's boot disk, default) or Memory "
                                                  "(the host's RAM, counted as the pod's memory).",
                                                  enum=list(storage.EMPTY_DIR_MEDIA)),
                                "parallelDownloads": described(
                                    "Fetch a file at many streams on its first read (file-cache:enable-parallel-downloads; "
                                    "default true).", type="boolean", default=True),
                            },
                        ),
                    },
                ),
                "pvc": described("An existing PersistentVolumeClaim in the same namespace.", type="object", required=["claimName"],
                          properties={"claimName": string_field("Its name.", minLength=1, maxLength=253)}),
                "emptyDir": described(
                    "Scratch space that lives as long as the pod.", type="object",
                    properties={
                        "sizeLimit": quantity_field("Most it may hold."),
                        "medium": string_field("\"\" (the node's disk, default) or Memory.", enum=list(storage.EMPTY_DIR_MEDIA)),
                    },
                ),
            },
            "x-kubernetes-validations": [{
                "rule": " + ".join(f"(has(self.{s}) ? 1 : 0)" for s in sources) + " == 1",
                "message": f"a volume must have exactly one of {', '.join(sources)}",
            }],
        },
    )


def _sidecar_schema() -> dict:
    return described(
        "Resources of GKE's Cloud Storage FUSE sidecar in each pod that mounts a gcs volume, as the pod annotations "
        "gke-gcsfuse/cpu-request, cpu-limit, memory-request, memory-limit, ephemeral-storage-request and "
        "ephemeral-storage-limit (\"0\" for a limit: none). The three limits are \"0\" unless set here (what Google's "
        "RayService TPU sample sets); without ephemeralStorage on the pod's role an ephemeralStorageLimit set here "
        "must hold the role's disk volumes. GKE's webhook makes a request not set equal to its limit set here.",
        type="object",
        properties={k: quantity_field(f"The {a} annotation.") for k, a in storage.SIDECAR_ANNOTATIONS.items()},
    )


def common_properties(kind: str) -> dict:
    """The blocks both kinds have (spec.COMMON_FIELDS)."""
    job = kind == JOB_KIND
    return {
        "tpu": tpu_schema(kind),
        "image": string_field(
            "Container image for the Ray head and workers: Ray (rayVersion) with PyTorch and "
            "torch_tpu installed." if job else
            "Container image for the Ray head and workers: Ray (rayVersion) with vLLM and its "
            "TPU platform plugin (see docs/tasks/serving.md).",
            minLength=1,
            maxLength=spec.MAX_STRING,
            pattern=common.IMAGE.pattern,
        ),
        "rayVersion": string_field(
            "Ray version in the image.",
            pattern=spec.RAY_VERSION.pattern,
            default=spec.DEFAULTS["rayVersion"],
        ),
        "runtimeEnv": described(
            ("Ray runtime environment of the job (pip, working_dir, env_vars, ...)." if job else
             "Ray runtime environment of the model's deployment (LLMConfig.runtime_env).")
            + f" At most {reader.MAX_DEPTH} levels deep and {reader.MAX_FREEFORM_BYTES} bytes as JSON"
            + (" (checked by the operator); no $ or ` in its strings (KubeRay passes it through bash)." if job else
               " (checked by the operator)."),
            type="object",
            properties={
                "env_vars": described("Environment variables of the Ray workers' processes.", type="object",
                               additionalProperties={"type": "string", "maxLength": reader.MAX_ENV_VALUE}),
            },
            **{"x-kubernetes-preserve-unknown-fields": True},
        ),
        "env": env_schema("Environment variables for the Ray head and every TPU worker."),
        "head": resources_schema(
            "head",
            {"nodeSelector": string_map_field("Extra node selector for the (CPU-only) Ray head pod.")},
        ),
        "worker": resources_schema("worker"),
        "tolerations": described(
            "Extra tolerations for all pods (the TPU taint is tolerated on workers already).",
            type="array",
            maxItems=reader.MAX_TOLERATIONS,
            items=_toleration_schema(),
        ),
        "serviceAccountName": string_field("Service account of the Ray pods.", maxLength=253),
        "nodeSelector": string_map_field(
            "Extra node selector for the TPU worker pods; the TPU labels come from spec.tpu."
        ),
        "securityContext": described(
            "The securityContext of every Ray container, in place of the operator's default, which meets the "
            "restricted Pod Security profile (runAsNonRoot, runAsUser 1000, runAsGroup 100, "
            "allowPrivilegeEscalation false, capabilities drop ALL, seccompProfile RuntimeDefault): each key "
            "given replaces the default's.",
            type="object",
            properties={
                "runAsNonRoot": {"type": "boolean"},
                "runAsUser": {"type": "integer", "format": "int64", "minimum": 0, "maximum": INT32_MAX},
                "runAsGroup": {"type": "integer", "format": "int64", "minimum": 0, "maximum": INT32_MAX},
                "allowPrivilegeEscalation": {"type": "boolean"},
                "privileged": {"type": "boolean"},
                "readOnlyRootFilesystem": {"type": "boolean"},
                "capabilities": {"type": "object", "properties": {
                    "add": {"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 64}},
                    "drop": {"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 64}},
                }},
                "seccompProfile": {"type": "object", "required": ["type"], "properties": {
                    "type": {"type": "string", "enum": list(common.SECCOMP_TYPES)},
                    "localhostProfile": {"type": "string", "maxLength": 253},
                }},
            },
            **{"x-kubernetes-validations": [{
                "rule": "!has(self.allowPrivilegeEscalation) || self.allowPrivilegeEscalation || !("
                        "(has(self.privileged) && self.privileged) || (has(self.capabilities) && has(self.capabilities.add) && "
                        f"self.capabilities.add.exists(c, c in {json.dumps(sorted(common.SYS_ADMIN))})))",
                "message": "allowPrivilegeEscalation must not be false with privileged or CAP_SYS_ADMIN",
                "fieldPath": ".allowPrivilegeEscalation",
            }]},
        ),
        "automountServiceAccountToken": described(
            "Mount the service account's token in the Ray pods. Default: true when serviceAccountName is "
            "set (Workload Identity: grant that account no Kubernetes RBAC), else false (Ray needs no API "
            "access; where KubeRay's autoscaler runs, its container alone gets one).",
            type="boolean",
        ),
        "queueName": string_field(
            f"Kueue LocalQueue: the label kueue.x-k8s.io/queue-name on the {'RayJob' if job else 'RayService'}.",
            maxLength=63,
        ),
        "priorityClassName": string_field(
            "Kueue WorkloadPriorityClass (only with queueName): the label kueue.x-k8s.io/priority-class on the "
            f"{'RayJob' if job else 'RayService'}; orders the queue and decides preemption.",
            maxLength=63,
        ),
        "volumes": _volumes_schema(),
        "gcsFuseSidecar": _sidecar_schema(),
    }


def env_schema(description: str, where: str = "spec.env") -> dict:
    """A list of Kubernetes EnvVars (spec.env, spec.groups[].env)."""
    return described(
        description,
        type="array",
        maxItems=reader.MAX_ENV,
        items={
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 256},
                "value": {"type": "string", "maxLength": reader.MAX_ENV_VALUE},
                "valueFrom": _env_source_schema(),
            },
            "x-kubernetes-validations": [{
                "rule": "!(has(self.value) && has(self.valueFrom))",
                "message": f"{where}[].value must not be set together with valueFrom",
            }],
        },
    )


def _env_source_schema() -> dict:
    """EnvVarSource, one source of common.ENV_SOURCE_FIELDS, each with the Pod API's required keys."""
    def ref(kind: str) -> dict:
        required, optional = common.ENV_SOURCE_FIELDS[kind]
        return {"type": "object", "required": list(required),
                "properties": {k: {"type": "boolean"} if k == "optional" else {"type": "string", "minLength": 1, "maxLength": 253}
                               for k in (*required, *optional)}}
    sources = list(common.ENV_SOURCE_FIELDS)
    return {
        "type": "object",
        "properties": {kind: ref(kind) for kind in sources},
        "x-kubernetes-validations": [{
            "rule": " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in sources) + " == 1",
            "message": f"spec.env[].valueFrom must have exactly one of {', '.join(sources)}",
        }],
    }


def _toleration_schema() -> dict:
    """A Kubernetes toleration, with the Pod API's rules (common.parse_tolerations)."""
    return {
        "type": "object",
        "properties": {
            "key": {"type": "string", "maxLength": 316},
            "operator": {"type": "string", "enum": list(common.TOLERATION_OPERATORS)},
            "value": {"type": "string", "maxLength": 63},
            "effect": {"type": "string", "enum": list(common.TAINT_EFFECTS)},
            "tolerationSeconds": {"type": "integer", "format": "int64"},
        },
        "x-kubernetes-validations": [
            {"rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
             "message": "spec.tolerations[].value must be empty when operator is Exists"},
            {"rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
             "message": "spec.tolerations[].operator must be Exists when key is empty"},
            {"rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "message": "spec.tolerations[].tolerationSeconds must only be set when effect is NoExecute"},
        ],
    }
