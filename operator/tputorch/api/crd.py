"""The TPUTorchJob and TPUTorchService CustomResourceDefinitions, built from the same tables
spec.py validates with; the pieces both kinds have (tpu block, common blocks, conditions, name
rule) are written once.

crds/ and the Helm chart hold what ``tputorch crd`` prints; a test fails when they drift.
The CEL rules here are the admission-time subset of spec.py's rules.
"""

from __future__ import annotations

import json

import yaml

from . import common, groups, job as job_spec, network, phases, spec, storage, topology
from .quantity import QUANTITY
from .. import train

GROUP = "tputorch.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

KIND = "TPUTorchJob"
PLURAL = "tputorchjobs"
SINGULAR = "tputorchjob"
SHORT_NAMES = ["ttj"]
NAME = f"{PLURAL}.{GROUP}"

SERVICE_KIND = "TPUTorchService"
SERVICE_PLURAL = "tputorchservices"
SERVICE_SINGULAR = "tputorchservice"
SERVICE_SHORT_NAMES = ["ttsvc"]
SERVICE_NAME = f"{SERVICE_PLURAL}.{GROUP}"

PHASES = list(phases.JOB_PHASES)
SERVICE_PHASES = list(phases.SERVICE_PHASES)
MAX_CONDITIONS = 16

INT32_MAX = 2**31 - 1


def _s(description: str, **schema) -> dict:
    return {"description": description, **schema}


def _string(description: str, **schema) -> dict:
    return _s(description, type="string", **schema)


def _int(description: str, **schema) -> dict:
    # The API server does not enforce format: int32; without a maximum a huge number reaches the
    # child and KubeRay (Go, int32 fields) could not decode it.
    schema.setdefault("maximum", INT32_MAX)
    return _s(description, type="integer", format="int32", **schema)


def bounded(schema: dict) -> dict:
    """``schema`` with the generic bound (common.MAX_*) on every string, list and map that has none
    of its own: a field added later is bounded without anyone remembering to. Applied to the spec."""
    if not isinstance(schema, dict):
        return schema
    out = {k: ({n: bounded(v) for n, v in val.items()} if k == "properties" else
               bounded(val) if k in ("items", "additionalProperties") else val)
           for k, val in schema.items()}
    kind = out.get("type")
    if kind == "string" and "enum" not in out:
        out.setdefault("maxLength", common.MAX_STRING)
    elif kind == "array":
        out.setdefault("maxItems", common.MAX_ITEMS)
    elif kind == "object" and ("additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")):
        out.setdefault("maxProperties", common.MAX_PROPERTIES)
    return out


def _string_map(description: str) -> dict:
    return _s(description, type="object", additionalProperties={"type": "string"})


def _topology_rule() -> dict:
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


def _tpu_schema(kind: str) -> dict:
    accelerators = sorted(topology.ACCELERATOR_ALIASES)
    job = kind == KIND
    properties = {
        "accelerator": _string(
            "TPU generation: v4, v5e, v5p, v6e or tpu7x (GKE's node-label forms such as "
            "tpu-v6e-slice are accepted too).",
            enum=accelerators,
            # CEL's cost estimate ignores enum: without a length bound the topology rule's
            # messageExpression is refused by the API server (cost budget exceeded).
            maxLength=max(map(len, accelerators)),
        ),
        "topology": _string(
            "Slice topology as GKE names it (node label cloud.google.com/gke-tpu-topology), "
            "e.g. 2x2, 4x4 for v5e/v6e and 2x2x1, 2x2x2 for v4/v5p/tpu7x. "
            "`tputorch topologies` lists every supported slice.",
            pattern=r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}(x[1-9][0-9]{0,2})?$",
            maxLength=12,
        ),
        "slices": _int(
            "Number of slices. Must be 1: PyTorch training on TPU through Ray is supported on a "
            "single slice only." if job else
            "Slices per model replica. Must be 1: scale with spec.replicas, one slice each.",
            default=spec.DEFAULTS["tpu.slices"],
            **{"x-kubernetes-validations": [{"rule": "self == 1", "message": spec.SINGLE_SLICE_REASON if job else spec.SERVICE_SINGLE_SLICE_REASON}]},
        ),
    }
    if job:
        properties["chipsPerWorker"] = _int(
            "TPU chips per Ray Train worker (one process each). 1 (default) gives one TPU "
            "device per worker, as Ray recommends for PyTorch; must divide the chips per host.",
            enum=list(topology.VALID_CHIPS_PER_WORKER),
            default=spec.DEFAULTS["tpu.chipsPerWorker"],
        )
    properties.update({
        "chipsPerHost": _int(
            "Chips per TPU VM, only needed where a topology has two layouts: v5e/v6e 2x4 is one "
            "8-chip VM by default, or two 4-chip VMs with chipsPerHost 4"
            + ("." if job else " (not for a service: Ray Serve LLM reserves 2x4 as one 8-chip host)."),
            enum=sorted({c for g in topology.GENERATIONS.values() for t in g.topologies for c in topology.host_layouts(g, t)}),
        ),
        "spot": _s(
            "Run on Spot TPU capacity (node label cloud.google.com/gke-spot=true).",
            type="boolean",
            default=spec.DEFAULTS["tpu.spot"],
        ),
        "reservation": _string(
            "Name of a TPU reservation to run in (node label cloud.google.com/reservation-name).",
            maxLength=63,
        ),
    })
    return _s(
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
                _topology_rule(),
                {
                    "rule": "!(has(self.reservation) && self.spot)",
                    "message": "spec.tpu.reservation must not be set together with spec.tpu.spot",
                },
            ]
        },
    )


def _resources_schema(role: str, extra: dict | None = None) -> dict:
    return _s(
        f"CPU, memory and ephemeral storage of each {role} pod (requests = limits; see ephemeralStorage).",
        type="object",
        properties={
            "cpu": common.resource_schema("cpu", f"CPU of each {role} pod.", spec.DEFAULTS[f"{role}.cpu"]),
            "memory": common.resource_schema("memory", f"Memory of each {role} pod.", spec.DEFAULTS[f"{role}.memory"]),
            "ephemeralStorage": _s(
                f"Local ephemeral storage of each {role} pod (requests = limits): its writable layer, logs "
                "and the emptyDir volumes it mounts on the node's disk (gcs.fileCache capacities and "
                "emptyDir sizeLimits without medium Memory); must be at least their sum plus "
                f"{storage.DISK_HEADROOM}. Not set: a request of that sum plus {storage.DISK_HEADROOM} and no limit "
                "(nor on the pod's Cloud Storage FUSE sidecar, unless gcsFuseSidecar.ephemeralStorageLimit is set), "
                "or nothing when the pod has none.",
                **{"x-kubernetes-int-or-string": True}, pattern=QUANTITY.pattern,
            ),
            **(extra or {}),
        },
        default={},
    )


def _quantity_string(description: str) -> dict:
    return _s(description, **{"x-kubernetes-int-or-string": True}, pattern=QUANTITY.pattern)


def _volumes_schema() -> dict:
    """spec.volumes (api/storage.py): the admission-time subset of its rules."""
    sources = storage.SOURCES
    return _s(
        "Volumes mounted into the Ray containers: a Cloud Storage bucket through GKE's Cloud Storage FUSE "
        "CSI driver (gcs), a PersistentVolumeClaim (pvc) or scratch space (emptyDir); exactly one each.",
        type="array",
        maxItems=storage.MAX_VOLUMES,
        items={
            "type": "object",
            "required": ["name", "mountPath"],
            "properties": {
                "name": _string("Volume name (DNS-1123 label), unique.", maxLength=63, pattern=storage.DNS1123_LABEL.pattern),
                "mountPath": _string("Absolute path where the containers see it.", minLength=1, maxLength=1024,
                                     **{"x-kubernetes-validations": [{
                                         "rule": f"!self.matches('{storage.RESERVED_MOUNT_PATTERN}')",
                                         "message": "must not be " + ", ".join(storage.RESERVED_MOUNT_PATHS) + " or under them"}]}),
                "readOnly": _s("Mount read-only.", type="boolean"),
                "mountOn": _s(
                    "Containers that mount it: head, worker (default both).", type="array", maxItems=2,
                    items={"type": "string", "enum": list(storage.ROLES)},
                ),
                "gcs": _s(
                    "A Cloud Storage bucket (the pods get the gke-gcsfuse/volumes annotation; GKE's webhook adds the "
                    "gcsfuse sidecar). The pods' service account needs access to it (Workload Identity).",
                    type="object", required=["bucket"],
                    properties={
                        "bucket": _string("Bucket name, without gs://.", maxLength=222, pattern=storage.BUCKET.pattern),
                        "mountOptions": _s(
                            "Cloud Storage FUSE mount options, e.g. implicit-dirs, only-dir=runs.", type="array",
                            maxItems=storage.MAX_MOUNT_OPTIONS, items={"type": "string", "minLength": 1, "maxLength": 256},
                        ),
                        "fileCache": _s(
                            "Cloud Storage FUSE's file cache on the node: a file read once (e.g. a model's weights) is read "
                            "from the node afterwards (fileCacheCapacity, fileCacheForRangeRead), in the pod's "
                            f"{storage.CACHE_VOLUME} emptyDir the operator adds, sized to the capacity.",
                            type="object", required=["capacity"],
                            properties={
                                "capacity": _quantity_string("Most the cache holds for this bucket, e.g. 200Gi."),
                                "medium": _string("Of the cache volume: \"\" (the node's boot disk, default) or Memory "
                                                  "(the host's RAM, counted as the pod's memory).",
                                                  enum=list(storage.EMPTY_DIR_MEDIA)),
                                "parallelDownloads": _s(
                                    "Fetch a file at many streams on its first read (file-cache:enable-parallel-downloads; "
                                    "default true).", type="boolean", default=True),
                            },
                        ),
                    },
                ),
                "pvc": _s("An existing PersistentVolumeClaim in the same namespace.", type="object", required=["claimName"],
                          properties={"claimName": _string("Its name.", minLength=1, maxLength=253)}),
                "emptyDir": _s(
                    "Scratch space that lives as long as the pod.", type="object",
                    properties={
                        "sizeLimit": _quantity_string("Most it may hold."),
                        "medium": _string("\"\" (the node's disk, default) or Memory.", enum=list(storage.EMPTY_DIR_MEDIA)),
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
    return _s(
        "Resources of GKE's Cloud Storage FUSE sidecar in each pod that mounts a gcs volume, as the pod annotations "
        "gke-gcsfuse/cpu-request, cpu-limit, memory-request, memory-limit, ephemeral-storage-request and "
        "ephemeral-storage-limit (\"0\" for a limit: none). Without ephemeralStorage on the pod's role its "
        "ephemeral-storage-limit is \"0\" unless set here, and one set here must hold the role's disk volumes.",
        type="object",
        properties={k: _quantity_string(f"The {a} annotation.") for k, a in storage.SIDECAR_ANNOTATIONS.items()},
    )


def _common_properties(kind: str) -> dict:
    """The blocks both kinds have (spec.COMMON_FIELDS)."""
    job = kind == KIND
    return {
        "tpu": _tpu_schema(kind),
        "image": _string(
            "Container image for the Ray head and workers: Ray (rayVersion) with PyTorch and "
            "torch_tpu installed." if job else
            "Container image for the Ray head and workers: Ray (rayVersion) with vLLM and its "
            "TPU platform plugin (see docs/serving.md).",
            minLength=1,
            maxLength=spec.MAX_STRING,
            pattern=common.IMAGE.pattern,
        ),
        "rayVersion": _string(
            "Ray version in the image.",
            pattern=spec.RAY_VERSION.pattern,
            default=spec.DEFAULTS["rayVersion"],
        ),
        "runtimeEnv": _s(
            ("Ray runtime environment of the job (pip, working_dir, env_vars, ...)." if job else
             "Ray runtime environment of the model's deployment (LLMConfig.runtime_env).")
            + f" At most {common.MAX_DEPTH} levels deep and {common.MAX_FREEFORM_BYTES} bytes as JSON"
            + (" (checked by the operator); no $ or ` in its strings (KubeRay passes it through bash)." if job else
               " (checked by the operator)."),
            type="object",
            properties={
                "env_vars": _s("Environment variables of the Ray workers' processes.", type="object",
                               additionalProperties={"type": "string", "maxLength": common.MAX_ENV_VALUE}),
            },
            **{"x-kubernetes-preserve-unknown-fields": True},
        ),
        "env": _s(
            "Environment variables for the Ray head and every TPU worker.",
            type="array",
            maxItems=common.MAX_ENV,
            items={
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 256},
                    "value": {"type": "string", "maxLength": common.MAX_ENV_VALUE},
                    "valueFrom": _env_source_schema(),
                },
                "x-kubernetes-validations": [{
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "spec.env[].value must not be set together with valueFrom",
                }],
            },
        ),
        "head": _resources_schema(
            "head",
            {"nodeSelector": _string_map("Extra node selector for the (CPU-only) Ray head pod.")},
        ),
        "worker": _resources_schema("worker"),
        "tolerations": _s(
            "Extra tolerations for all pods (the TPU taint is tolerated on workers already).",
            type="array",
            maxItems=common.MAX_TOLERATIONS,
            items=_toleration_schema(),
        ),
        "serviceAccountName": _string("Service account of the Ray pods.", maxLength=253),
        "nodeSelector": _string_map(
            "Extra node selector for the TPU worker pods; the TPU labels come from spec.tpu."
        ),
        "securityContext": _s(
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
        "automountServiceAccountToken": _s(
            "Mount the service account's token in the Ray pods. Default: true when serviceAccountName is "
            "set (Workload Identity: grant that account no Kubernetes RBAC), else false (Ray needs no API "
            "access; where KubeRay's autoscaler runs, its container alone gets one).",
            type="boolean",
        ),
        "queueName": _string(
            f"Kueue LocalQueue: the label kueue.x-k8s.io/queue-name on the {'RayJob' if job else 'RayService'}.",
            maxLength=63,
        ),
        "priorityClassName": _string(
            "Kueue WorkloadPriorityClass (only with queueName): the label kueue.x-k8s.io/priority-class on the "
            f"{'RayJob' if job else 'RayService'}; orders the queue and decides preemption.",
            maxLength=63,
        ),
        "volumes": _volumes_schema(),
        "gcsFuseSidecar": _sidecar_schema(),
    }


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


def _immutable(field: str, kind: str) -> dict:
    """A transition rule on spec that refuses a change of ``field``, including adding or removing
    it (a rule on the field itself would only run when both old and new have it)."""
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"spec.{field} is immutable: delete the {kind} and create it again to change it "
                   f"(only spec.suspend may change on a {kind})",
    }


# Fields of a TPUTorchJob that may change after creation: the only one that reaches the RayJob.
JOB_MUTABLE = {"suspend"}


def _job_spec_schema() -> dict:
    properties = {
        **_common_properties(KIND),
        "groups": groups.schema(_topology_rule()),
        "entrypoint": _string(
            "Command the Ray job runs on the head, e.g. `python train.py`.",
            minLength=1,
            maxLength=spec.MAX_ENTRYPOINT,
        ),
        "suspend": _s(
            "Create the RayJob suspended (no pods) or suspend a running one.",
            type="boolean",
            default=spec.DEFAULTS["suspend"],
        ),
        "activeDeadlineSeconds": _int("Seconds the job may run before it is failed.", minimum=1),
        "backoffLimit": _int(
            "Retries of a failed job; each retry provisions a whole new slice.",
            minimum=0,
            maximum=100,
            default=spec.DEFAULTS["backoffLimit"],
        ),
        "ttlSecondsAfterFinished": _int(
            "Seconds to keep the Ray cluster after the job finishes.", minimum=0
        ),
        "shutdownAfterJobFinishes": _s(
            "Delete the Ray cluster (and free the slice) when the job finishes.",
            type="boolean",
            default=spec.DEFAULTS["shutdownAfterJobFinishes"],
        ),
        "checkpoint": _s(
            "Where Ray Train keeps the run's checkpoints. The script gets it as TPUTORCH_STORAGE_PATH, with "
            "TPUTORCH_RUN_NAME, a name that stays the same across every attempt of this object; "
            "tputorch.train.run_config() makes both a RunConfig, so ray.train.get_checkpoint() resumes.",
            type="object",
            required=["storagePath"],
            properties={
                "storagePath": _string(
                    "gs://bucket/path on GKE, any fsspec/pyarrow URI, or an absolute path on a volume every host mounts.",
                    minLength=1, maxLength=job_spec.MAX_STORAGE_PATH, pattern=job_spec.STORAGE_PATH.pattern,
                ),
                "workerRetries": _int(
                    "Ray Train's FailureConfig(max_failures) inside one attempt (-1: no limit).",
                    minimum=-1, maximum=job_spec.MAX_RETRIES, default=job_spec.WORKER_RETRIES_DEFAULT,
                ),
            },
        ),
        "retries": _s(
            "New attempts (each a fresh Ray cluster on a whole slice, resuming from the last checkpoint) "
            "after an attempt ends, per kind of failure.",
            type="object",
            default={},
            properties={
                "infrastructure": _int(
                    "After a host or the head of the slice is lost (preemption, node shutdown or deletion, eviction).",
                    minimum=0, maximum=job_spec.MAX_RETRIES, default=job_spec.RETRY_DEFAULTS["infrastructure"],
                ),
                "application": _int(
                    "After the script failed with every host healthy.",
                    minimum=0, maximum=job_spec.MAX_RETRIES, default=job_spec.RETRY_DEFAULTS["application"],
                ),
            },
        ),
    }
    # spec.tpu has its own self == oldSelf rule (with the slice in its message).
    immutable = [_immutable(f, KIND) for f in sorted(set(properties) - JOB_MUTABLE - {"tpu"})]
    return _s(
        "What to train and on which TPU slice. Only suspend may change after creation.",
        type="object",
        required=["tpu", "image", "entrypoint"],
        properties=properties,
        **{
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.ttlSecondsAfterFinished) || self.shutdownAfterJobFinishes",
                    "message": "spec.ttlSecondsAfterFinished must not be set unless spec.shutdownAfterJobFinishes is true",
                },
                {
                    "rule": "!self.suspend || self.shutdownAfterJobFinishes",
                    "message": "spec.suspend must not be true unless spec.shutdownAfterJobFinishes is true",
                },
                *immutable,
            ]
        },
    )


def _exposure_schema() -> dict:
    peer = _s(
        "A client: pods by namespace and/or labels (namespace omitted: the service's own), or an address range.",
        type="object",
        properties={
            "namespace": _string("The clients' namespace.", maxLength=63, pattern=network.NAMESPACE_NAME.pattern),
            "podLabels": _string_map("Labels the clients' pods carry (omitted: every pod of the namespace)."),
            "cidr": _string("An address range (CIDR block), for clients outside the pod network.", maxLength=43),
        },
        **{"x-kubernetes-validations": [
            # namespace is a CEL keyword: escaped as __namespace__
            {"rule": "has(self.cidr) != (has(self.__namespace__) || has(self.podLabels))",
             "message": "a client sets cidr, or namespace and/or podLabels (not both)"},
            {"rule": "!has(self.cidr) || isCIDR(self.cidr)", "message": "cidr must be a CIDR block, e.g. 10.0.0.0/8"},
        ]},
    )
    return _s(
        "Who may call the Serve port (the NetworkPolicy of the service's pods; the Serve port checks no token). "
        "Anywhere: any source; InNamespace: pods of the service's namespace; Listed: the clients in from.",
        type="object",
        default={},
        properties={
            "clients": _string("Anywhere, InNamespace or Listed.", enum=list(network.EXPOSURES), default="Anywhere"),
            "from": _s("The clients admitted when clients is Listed.", type="array", items=peer,
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
    return _s(
        "The Service KubeRay makes in front of the Serve port (<name>-serve-svc, the RayService's serveService): "
        "the same Service is retargeted at every cluster switch, so its address survives upgrades. Immutable.",
        type="object",
        properties={
            "type": _string("ClusterIP (the default) or LoadBalancer.", enum=list(network.SERVE_SERVICE_TYPES),
                            default="ClusterIP"),
            "annotations": _s("Annotations of the Service, e.g. networking.gke.io/load-balancer-type: Internal.",
                              type="object", maxProperties=network.MAX_ANNOTATIONS,
                              additionalProperties={"type": "string", "maxLength": network.MAX_ANNOTATION_VALUE}),
            "loadBalancerSourceRanges": _s(
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


def _service_spec_schema() -> dict:
    pp = "(has(self.engine.pipelineParallelSize) ? self.engine.pipelineParallelSize : 1)"
    return _s(
        "The model to serve, its engine and on which TPU slice; each replica is one slice.",
        type="object",
        required=["tpu", "image", "model"],
        properties={
            **_common_properties(SERVICE_KIND),
            "model": _s(
                "The model: where its weights are and the name clients ask for.",
                type="object",
                required=["source"],
                properties={
                    "source": _string(
                        "Hugging Face repo id (e.g. Qwen/Qwen3-30B-A3B), gs://<bucket>/<folder> or a path on the hosts. "
                        "Ray Serve LLM downloads a gs:// model to every host's HF_HOME before vLLM starts, unless "
                        "engine.args sets load_format: runai_streamer (vLLM's Run:ai streamer reads it into memory; the "
                        "image needs runai-model-streamer[gcs]).",
                        minLength=1,
                        maxLength=spec.MAX_STRING,
                    ),
                    "name": _string(
                        "What clients send as \"model\" (the OpenAI model id); default: metadata.name.",
                        minLength=1,
                        maxLength=253,
                    ),
                    "cacheVolume": _string(
                        "Name of a spec.volumes entry (gcs or pvc, writable, mounted on the workers) for the Hugging Face "
                        "cache (HF_HOME, <mountPath>/huggingface) and vLLM's compile cache (VLLM_CACHE_ROOT, "
                        "<mountPath>/vllm/<generation>-<topology>: one directory per slice shape). A streamed gs:// "
                        "model writes no weights there: the compile cache is what it keeps.",
                        minLength=1, maxLength=63),
                    "hfTokenSecret": _s(
                        "Secret holding a Hugging Face token: HF_TOKEN on the head and every worker.",
                        type="object",
                        required=["name", "key"],
                        properties={
                            "name": _string("Secret name (same namespace).", minLength=1, maxLength=253),
                            "key": _string("Key in the Secret.", minLength=1, maxLength=253),
                        },
                    ),
                },
            ),
            "engine": _s(
                "vLLM engine settings (LLMConfig.engine_kwargs).",
                type="object",
                default={},
                properties={
                    "tensorParallelSize": _int(
                        "Chips each layer is split over; default: the slice's chips / pipelineParallelSize. "
                        "tensorParallelSize x pipelineParallelSize must equal the slice's chips.",
                        minimum=1,
                    ),
                    "pipelineParallelSize": _int(
                        "Pipeline stages.", minimum=1, default=spec.SERVICE_DEFAULTS["engine.pipelineParallelSize"]
                    ),
                    "enableExpertParallel": _s(
                        "Expert parallelism for mixture-of-experts models.",
                        type="boolean",
                        default=spec.SERVICE_DEFAULTS["engine.enableExpertParallel"],
                    ),
                    "maxModelLen": _int("Longest context (prompt + output tokens).", minimum=1),
                    # No CEL rule here: CEL cannot type a map of arbitrary values (the API server
                    # refuses the CRD); the operator refuses the reserved keys (ValidationFailed).
                    "args": _s(
                        "Other vLLM engine arguments, passed on as they are (not the fields above, "
                        "model, served_model_name or distributed_executor_backend: the operator refuses them).",
                        type="object",
                        maxProperties=common.MAX_PROPERTIES,
                        additionalProperties={"x-kubernetes-preserve-unknown-fields": True},
                    ),
                },
            ),
            "replicas": _s(
                "Model replicas, one whole slice each; KubeRay's autoscaler scales between min and max.",
                type="object",
                default={},
                properties={
                    "min": _int("Fewest replicas; 0 scales to zero (no slice while idle, single-host slices only).",
                                minimum=0, maximum=common.MAX_REPLICAS, default=spec.SERVICE_DEFAULTS["replicas.min"]),
                    "max": _int("Most replicas; default: min (required when min is 0).", minimum=1, maximum=common.MAX_REPLICAS),
                },
                **{"x-kubernetes-validations": [{
                    "rule": "!has(self.max) || self.min <= self.max",
                    "message": "spec.replicas.max must be at least spec.replicas.min",
                }, {
                    "rule": "!has(self.min) || self.min > 0 || has(self.max)",
                    "message": "spec.replicas.max is required when spec.replicas.min is 0 (scale to zero)",
                }]},
            ),
            "serve": _s(
                "Ray Serve options of the model's deployment (LLMConfig.deployment_config) and how long it may take to start.",
                type="object",
                default={},
                properties={
                    "targetOngoingRequests": _int(
                        "Requests per replica the autoscaler aims at (Ray Serve LLM's default, 1e9, never scales).",
                        minimum=1, maximum=1_000_000, default=spec.SERVICE_DEFAULTS["serve.targetOngoingRequests"]),
                    "maxOngoingRequests": _int(
                        "Most requests a replica holds at once; keep it at or above vLLM's max_num_seqs.",
                        minimum=1, maximum=1_000_000, default=spec.SERVICE_DEFAULTS["serve.maxOngoingRequests"]),
                    "healthCheckPeriodSeconds": _int(
                        "Seconds between Serve's health checks of a replica.",
                        minimum=1, maximum=86400, default=spec.SERVICE_DEFAULTS["serve.healthCheckPeriodSeconds"]),
                    "healthCheckTimeoutSeconds": _int(
                        "Seconds a health check may take (weights and the XLA compile take minutes).",
                        minimum=1, maximum=86400, default=spec.SERVICE_DEFAULTS["serve.healthCheckTimeoutSeconds"]),
                    "initializingTimeoutSeconds": _int(
                        "KubeRay fails the service and releases its slices if it is not ready this long after "
                        "creation (ray.io/initializing-timeout); 0: never.",
                        minimum=0, maximum=7 * 86400, default=spec.SERVICE_DEFAULTS["serve.initializingTimeoutSeconds"]),
                    "clusterDeletionDelaySeconds": _int(
                        "Seconds KubeRay keeps the old RayCluster after an upgrade switched to a new one "
                        "(rayClusterDeletionDelaySeconds; unset: KubeRay's 60): a stream still running on it is cut then.",
                        minimum=0, maximum=spec.MAX_CLUSTER_DELETION_DELAY_S),
                    "gracefulShutdownTimeoutSeconds": _int(
                        "Seconds Serve gives a replica it stops (scale-down, redeploy) to finish its in-flight requests "
                        "(graceful_shutdown_timeout_s; unset: Serve's 20).",
                        minimum=1, maximum=spec.MAX_GRACEFUL_SHUTDOWN_S),
                    "scaleToZeroDelaySeconds": _int(
                        "With replicas.min 0: seconds an idle model keeps its last replica before Serve stops it and the "
                        "slice can be given back (downscale_to_zero_delay_s; unset: Serve's downscale_delay_s, 600).",
                        minimum=0, maximum=spec.MAX_SCALE_TO_ZERO_DELAY_S),
                    "downscaleDelaySeconds": _int(
                        "With replicas.max above replicas.min: seconds the load must stay low before Serve stops a "
                        "replica above the minimum; its slice is then idle and Ray's autoscaler gives it back after the "
                        "cluster's idle timeout (downscale_delay_s; unset: Serve's 600).",
                        minimum=0, maximum=spec.MAX_DOWNSCALE_DELAY_S),
                    "routing": _string(
                        "How Serve picks a replica for a request. PowerOfTwo: Serve's own (the less loaded of two). "
                        "PrefixAware: Ray Serve LLM's PrefixCacheAffinityRouter, the replica that served the longest "
                        "prefix of the prompt while load is even (vLLM's prefix cache hits); for more than one replica.",
                        enum=list(spec.SERVE_ROUTINGS), default=spec.SERVICE_DEFAULTS["serve.routing"]),
                    "ingressReplicas": _int(
                        "Replicas of Ray Serve LLM's OpenAiIngress, which takes every request's HTTP and streams the "
                        "tokens back (Ray's default: one); CPU actors on the slice's hosts.",
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
            "lora": _s(
                "LoRA adapters loaded on demand (Ray Serve LLM's lora_config): each folder under path is one adapter, "
                "asked for as model \"<spec.model.name>:<folder>\"; a replica downloads it on its first request.",
                type="object",
                required=["path"],
                properties={
                    "path": _string(
                        "gs://<bucket>[/<folder>] holding one subfolder per adapter (PEFT's adapter_config.json and "
                        "weights), read with the pods' ServiceAccount (Workload Identity).",
                        pattern="^" + spec.LORA_PATH.pattern + "$", maxLength=spec.MAX_STRING),
                    "maxAdaptersPerReplica": _int(
                        "Adapters a replica keeps loaded (the least recently used is dropped for a new one); also "
                        "vLLM's max_loras, the adapters one batch may mix.",
                        minimum=1, maximum=spec.MAX_LORA_ADAPTERS, default=spec.SERVICE_DEFAULTS["lora.maxAdaptersPerReplica"]),
                    "maxRank": _int(
                        "The largest LoRA rank of any adapter (vLLM's max_lora_rank).",
                        enum=list(spec.LORA_RANKS), default=spec.SERVICE_DEFAULTS["lora.maxRank"]),
                },
            ),
            "upgradeStrategy": _string(
                "KubeRay's RayService upgrade strategy. NewCluster: an edit of the cluster (image, env, resources, "
                "engine placement) starts a second RayCluster, i.e. a second set of slices, and switches over once it "
                "serves. None: such edits are not rolled out until the service is re-created (model and Serve edits "
                "still are, in place, on the same slices).",
                enum=list(spec.UPGRADE_STRATEGIES), default=spec.SERVICE_DEFAULTS["upgradeStrategy"]),
        },
        # One rule per chip count, so that each message names the product its slices need (a
        # messageExpression computing it is refused by the API server's CEL cost estimate).
        **{"x-kubernetes-validations": [_parallel_rule(n, ts, pp) for n, ts in sorted(_topologies_by_chips().items())]},
    )


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


def _conditions_schema(types: tuple[str, ...]) -> dict:
    """metav1.Condition, as the Kubernetes API conventions define it."""
    return _s(
        ", ".join(types) + ".",
        type="array",
        maxItems=MAX_CONDITIONS,
        items={
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {"type": "string", "maxLength": 316,
                         "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                           "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "message": {"type": "string", "maxLength": phases.MAX_CONDITION_MESSAGE},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
            },
        },
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _common_status() -> dict:
    return {
        "message": _string("Human-readable summary of the current state."),
        "observedGeneration": _s("Generation of the spec this status describes.", type="integer", format="int64"),
        "hosts": _int("TPU hosts (pods) wanted."),
        "readyHosts": _int("TPU host pods that are ready."),
        "rayClusterName": _string("Name of the RayCluster KubeRay created."),
        "queue": _string("Kueue LocalQueue (spec.queueName)."),
        "priorityClass": _string("Kueue WorkloadPriorityClass (spec.priorityClassName)."),
        "clusterQueue": _string("Kueue ClusterQueue that admitted the workload."),
        "workload": _string("Name of the Kueue Workload made for the child."),
    }


def _job_status_schema() -> dict:
    return _s(
        "Observed state, derived from the RayJob, its RayCluster and pods.",
        type="object",
        properties={
            **_common_status(),
            "phase": _string(", ".join(PHASES) + ".", enum=PHASES),
            "attempts": _int("The current attempt (1 + the retries so far); each is a fresh RayJob."),
            "attemptHistory": _s(
                "Attempts that ended: when, and why (result Infrastructure, Application, Final or Succeeded).",
                type="array",
                items={
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer", "format": "int32"},
                        "result": {"type": "string"},
                        "reason": {"type": "string"},
                        "message": {"type": "string", "maxLength": 1024},
                        "endTime": {"type": "string", "format": "date-time"},
                    },
                },
            ),
            "conditions": _conditions_schema(phases.CONDITION_TYPES),
            "rayJobName": _string("Name of the RayJob."),
            "dashboardURL": _string("Ray dashboard address (inside the cluster)."),
            "jobId": _string("Ray job submission id."),
            "jobStatus": _string("Ray job status from KubeRay (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED)."),
            "jobDeploymentStatus": _string("KubeRay's RayJob deployment status."),
            "workers": _int("Ray Train workers: chips / chipsPerWorker."),
            "hostsReady": _string("readyHosts/hosts, for display."),
            "startTime": _string("When the Ray job started.", format="date-time"),
            "completionTime": _string("When the Ray job finished.", format="date-time"),
            "progress": _s(
                "What the training script last reported through tputorch.train.report(), read from the "
                "Ray job driver's log while the job runs (at most every 30 s).",
                type="object",
                properties={
                    "step": _s("The last reported step.", type="integer", format="int64", minimum=0),
                    "epoch": _s("The last reported epoch.", type="integer", format="int64", minimum=0),
                    "metrics": _s("The numeric metrics of that report (e.g. loss).", type="object",
                                  maxProperties=train.MAX_PROGRESS_METRICS,
                                  additionalProperties={"type": "number"}),
                    "reportedAt": _string("When the operator first read this report.", format="date-time"),
                },
            ),
            "lastCheckpoint": _string("Where Ray Train persisted the latest checkpoint the script reported.",
                                      maxLength=train.MAX_CHECKPOINT_PATH),
        },
    )


def _service_status_schema() -> dict:
    return _s(
        "Observed state, derived from the RayService and its pods.",
        type="object",
        properties={
            **_common_status(),
            "phase": _string(", ".join(SERVICE_PHASES[:-1]) + " or " + SERVICE_PHASES[-1] + ".", enum=SERVICE_PHASES),
            "conditions": _conditions_schema(phases.SERVICE_CONDITION_TYPES),
            "replicas": _int("Model replicas (slices) wanted now."),
            "readyReplicas": _int("Replicas whose every TPU host runs (a host without a Serve replica is NotReady by design)."),
            "replicasReady": _string("readyReplicas/replicas, for display."),
            "model": _string("The model name clients send."),
            "endpoint": _string("OpenAI-compatible base URL inside the cluster."),
            "rayServiceName": _string("Name of the RayService."),
            "serviceStatus": _string("KubeRay's serviceStatus (Running when ready)."),
            "applicationStatus": _string("The Serve application's status (DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY...)."),
            "applicationMessage": _string("The Serve application's message."),
            "appliedConfig": _s(
                "What the operator has seen the serving RayCluster apply (hashes; the SpecApplied condition).",
                type="object",
                properties={
                    "rayClusterName": _string("The RayCluster these hashes were recorded for."),
                    "serveConfig": _string("Hash of the Serve config seen reloaded."),
                    "cluster": _string("Hash of the cluster spec as KubeRay 1.6 hashes it (no replicas, tolerations)."),
                    "tolerations": _string("Hash of the pod specs' tolerations and scheduling gates."),
                },
            ),
        },
    )


def _name_rules(kind: str, child: str, max_len: int) -> list[dict]:
    return [
        {
            "rule": f"self.metadata.name.size() <= {max_len}",
            "message": f"metadata.name must be at most {max_len} characters: the {child} takes this name",
        },
        {
            "rule": f"self.metadata.name.matches('{spec.DNS1035.pattern}')",
            "message": f"metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with "
                       f"a letter, ending with a letter or digit): the {child} of a {kind} takes this name",
        },
    ]


JOB_PRINTER_COLUMNS = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.tpu.accelerator"},
    {"name": "Topology", "type": "string", "jsonPath": ".spec.tpu.topology"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workers"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName", "priority": 1, "description": "Kueue LocalQueue"},
    {"name": "Priority", "type": "string", "jsonPath": ".spec.priorityClassName", "priority": 1,
     "description": "Kueue WorkloadPriorityClass"},
    {"name": "Hosts", "type": "string", "jsonPath": ".status.hostsReady", "description": "Ready TPU hosts / hosts in the slice"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempts", "description": "Current attempt (1 + retries)"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "description": "Last step the script reported"},
    {"name": "Loss", "type": "number", "jsonPath": f".status.progress.metrics.{train.LOSS_METRIC}", "priority": 1,
     "description": "Loss the script last reported"},
    {"name": "Reward", "type": "number", "jsonPath": f".status.progress.metrics.{train.REWARD_METRIC}", "priority": 1,
     "description": "Mean reward the RL script last reported"},
    {"name": "Weights", "type": "integer", "jsonPath": f".status.progress.metrics.{train.WEIGHT_VERSION_METRIC}",
     "priority": 1, "description": "Oldest policy weight version a rollout engine ran the last step with (RL)"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
PRINTER_COLUMNS = JOB_PRINTER_COLUMNS
SERVICE_PRINTER_COLUMNS = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.tpu.accelerator"},
    {"name": "Topology", "type": "string", "jsonPath": ".spec.tpu.topology"},
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.replicasReady", "description": "Ready replicas (slices) / replicas"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName", "priority": 1, "description": "Kueue LocalQueue"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "description": "OpenAI base URL inside the cluster"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _definition(kind: str, plural: str, singular: str, short_names: list[str], description: str,
                columns: list[dict], spec_schema: dict, status_schema: dict, child: str, name_max: int) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/name": "tputorch-operator"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["all", "tputorch"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": description,
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": bounded(spec_schema),
                                "status": status_schema,
                            },
                            "x-kubernetes-validations": _name_rules(kind, child, name_max),
                        }
                    },
                }
            ],
        },
    }


def job_crd() -> dict:
    return _definition(
        KIND, PLURAL, SINGULAR, SHORT_NAMES,
        "Distributed PyTorch training on one GKE TPU slice, run by Ray through KubeRay.",
        JOB_PRINTER_COLUMNS, _job_spec_schema(), _job_status_schema(), "RayJob", spec.RAYJOB_NAME_MAX,
    )


def service_crd() -> dict:
    return _definition(
        SERVICE_KIND, SERVICE_PLURAL, SERVICE_SINGULAR, SERVICE_SHORT_NAMES,
        "An LLM served with vLLM through Ray Serve LLM (OpenAI API) on GKE TPU slices, run by KubeRay.",
        SERVICE_PRINTER_COLUMNS, _service_spec_schema(), _service_status_schema(), "RayService", spec.RAYSERVICE_NAME_MAX,
    )


BUILDERS = {KIND: job_crd, SERVICE_KIND: service_crd}
FILES = {KIND: f"{GROUP}_{PLURAL}.yaml", SERVICE_KIND: f"{GROUP}_{SERVICE_PLURAL}.yaml"}


def crd() -> list[dict]:
    """Both CRDs, the job's first."""
    return [build() for build in BUILDERS.values()]


def crd_yaml(kind: str | None = None) -> str:
    """One CRD (by kind) or both, as the YAML that crds/ holds."""
    kinds = [kind] if kind else list(BUILDERS)
    return "---\n".join(
        "# Generated by `tputorch crd` from operator/tputorch/api/crd.py; do not edit.\n"
        + yaml.safe_dump(BUILDERS[k](), sort_keys=False, width=100)
        for k in kinds
    )
