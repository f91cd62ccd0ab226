"""The TPUTorchJob CustomResourceDefinition, built from the same tables spec.py validates with.

crds/ and the Helm chart hold what ``tputorch crd`` prints; a test fails when they drift.
The CEL rules here are the admission-time subset of spec.py's rules.
"""

from __future__ import annotations

import json

from . import spec, topology

GROUP = "tputorch.io"
VERSION = "v1alpha1"
KIND = "TPUTorchJob"
PLURAL = "tputorchjobs"
SINGULAR = "tputorchjob"
SHORT_NAMES = ["ttj"]
NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"

PHASES = ["Pending", "Running", "Succeeded", "Failed", "Suspended"]


def _s(description: str, **schema) -> dict:
    return {"description": description, **schema}


def _string(description: str, **schema) -> dict:
    return _s(description, type="string", **schema)


INT32_MAX = 2**31 - 1


def _int(description: str, **schema) -> dict:
    # The API server does not enforce format: int32; without a maximum a huge number reaches the
    # RayJob and KubeRay (Go, int32 fields) could not decode it.
    schema.setdefault("maximum", INT32_MAX)
    return _s(description, type="integer", format="int32", **schema)


def _quantity(description: str, default: str) -> dict:
    return _s(
        description,
        **{"x-kubernetes-int-or-string": True},
        pattern=spec.QUANTITY.pattern,
        default=default,
    )


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


def _tpu_schema() -> dict:
    accelerators = sorted(topology.ACCELERATOR_ALIASES)
    return _s(
        "The TPU slice to train on: one GKE TPU node pool. Immutable after creation.",
        type="object",
        required=["accelerator", "topology"],
        properties={
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
                "single slice only.",
                default=spec.DEFAULTS["tpu.slices"],
                **{"x-kubernetes-validations": [{"rule": "self == 1", "message": spec.SINGLE_SLICE_REASON}]},
            ),
            "chipsPerWorker": _int(
                "TPU chips per Ray Train worker (one process each). 1 (default) gives one TPU "
                "device per worker, as Ray recommends for PyTorch; must divide the chips per host.",
                enum=list(topology.VALID_CHIPS_PER_WORKER),
                default=spec.DEFAULTS["tpu.chipsPerWorker"],
            ),
            "chipsPerHost": _int(
                "Chips per TPU VM, only needed where a topology has two layouts: v5e/v6e 2x4 is one "
                "8-chip VM by default, or two 4-chip VMs with chipsPerHost 4.",
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
        },
        **{
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "spec.tpu is immutable: delete the TPUTorchJob and create it again to change the slice",
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
        f"CPU and memory of each {role} pod (requests = limits).",
        type="object",
        properties={
            "cpu": _quantity(f"CPU of each {role} pod.", spec.DEFAULTS[f"{role}.cpu"]),
            "memory": _quantity(f"Memory of each {role} pod.", spec.DEFAULTS[f"{role}.memory"]),
            **(extra or {}),
        },
        default={},
    )


def _spec_schema() -> dict:
    return _s(
        "What to train and on which TPU slice.",
        type="object",
        required=["tpu", "image", "entrypoint"],
        properties={
            "tpu": _tpu_schema(),
            "image": _string(
                "Container image for the Ray head and workers: Ray (rayVersion) with PyTorch and "
                "torch_tpu installed.",
                minLength=1,
                maxLength=spec.MAX_STRING,
            ),
            "rayVersion": _string(
                "Ray version in the image.",
                pattern=spec.RAY_VERSION.pattern,
                default=spec.DEFAULTS["rayVersion"],
            ),
            "entrypoint": _string(
                "Command the Ray job runs on the head, e.g. `python train.py`.",
                minLength=1,
                maxLength=spec.MAX_ENTRYPOINT,
            ),
            "runtimeEnv": _s(
                "Ray runtime environment of the job (pip, working_dir, env_vars, ...).",
                type="object",
                **{"x-kubernetes-preserve-unknown-fields": True},
            ),
            "env": _s(
                "Environment variables for the Ray head and every TPU worker.",
                type="array",
                maxItems=256,
                items={
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 256},
                        "value": {"type": "string"},
                        "valueFrom": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
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
                items={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            ),
            "serviceAccountName": _string("Service account of the Ray pods.", maxLength=253),
            "nodeSelector": _string_map(
                "Extra node selector for the TPU worker pods; the TPU labels come from spec.tpu."
            ),
            "suspend": _s(
                "Create the RayJob suspended (no pods) or suspend a running one.",
                type="boolean",
                default=spec.DEFAULTS["suspend"],
            ),
            "queueName": _string("Kueue LocalQueue to submit the RayJob to.", maxLength=63),
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
        },
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
            ]
        },
    )


CONDITION_SCHEMA = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "observedGeneration": {"type": "integer", "format": "int64"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
    },
}


def _status_schema() -> dict:
    return _s(
        "Observed state, derived from the RayJob, its RayCluster and pods.",
        type="object",
        properties={
            "phase": _string("Pending, Running, Succeeded, Failed or Suspended.", enum=PHASES),
            "message": _string("Human-readable summary of the current state."),
            "observedGeneration": _s("Generation of the spec this status describes.", type="integer", format="int64"),
            "conditions": _s(
                "Validated, RayJobCreated, SliceReady, Succeeded, Failed.",
                type="array",
                items=CONDITION_SCHEMA,
                **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
            ),
            "rayJobName": _string("Name of the RayJob."),
            "rayClusterName": _string("Name of the RayCluster the RayJob created."),
            "dashboardURL": _string("Ray dashboard address (inside the cluster)."),
            "jobId": _string("Ray job submission id."),
            "jobStatus": _string("Ray job status from KubeRay (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED)."),
            "jobDeploymentStatus": _string("KubeRay's RayJob deployment status."),
            "workers": _int("Ray Train workers: chips / chipsPerWorker."),
            "hosts": _int("TPU hosts (pods) in the slice."),
            "readyHosts": _int("TPU host pods that are ready."),
            "hostsReady": _string("readyHosts/hosts, for display."),
            "startTime": _string("When the Ray job started.", format="date-time"),
            "completionTime": _string("When the Ray job finished.", format="date-time"),
        },
    )


PRINTER_COLUMNS = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.tpu.accelerator"},
    {"name": "Topology", "type": "string", "jsonPath": ".spec.tpu.topology"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workers"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Hosts", "type": "string", "jsonPath": ".status.hostsReady", "description": "Ready TPU hosts / hosts in the slice"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": "tputorch-operator"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["all", "tputorch"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "Distributed PyTorch training on one GKE TPU slice, run by Ray through KubeRay.",
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": _spec_schema(),
                                "status": _status_schema(),
                            },
                            "x-kubernetes-validations": [
                                {
                                    "rule": f"self.metadata.name.size() <= {spec.RAYJOB_NAME_MAX}",
                                    "message": f"metadata.name must be at most {spec.RAYJOB_NAME_MAX} characters: the RayJob takes this name",
                                },
                            ],
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml

    return "# Generated by `tputorch crd` from operator/tputorch/crd.py; do not edit.\n" + yaml.safe_dump(
        crd(), sort_keys=False, width=100
    )
