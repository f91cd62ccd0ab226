"""The TPUTorchJob and TPUTorchService CustomResourceDefinitions: their names, printer columns and
name rules, assembled from the schemas of schema.py (the OpenAPI pieces and the blocks both kinds
have), job_schema.py and service_schema.py (each kind's own spec) and status_schema.py, which are
built from the same tables spec.py validates with.

crds/ and the Helm chart hold what ``tputorch crd`` prints; a test fails when they drift.
The CEL rules are the admission-time subset of spec.py's rules.
"""

from __future__ import annotations

import yaml

from . import spec
from .job_schema import job_spec_schema
from .schema import bounded
from .service_schema import service_spec_schema
from .status_schema import job_status_schema, service_status_schema
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
        JOB_PRINTER_COLUMNS, job_spec_schema(), job_status_schema(), "RayJob", spec.RAYJOB_NAME_MAX,
    )


def service_crd() -> dict:
    return _definition(
        SERVICE_KIND, SERVICE_PLURAL, SERVICE_SINGULAR, SERVICE_SHORT_NAMES,
        "An LLM served with vLLM through Ray Serve LLM (OpenAI API) on GKE TPU slices, run by KubeRay.",
        SERVICE_PRINTER_COLUMNS, service_spec_schema(), service_status_schema(), "RayService", spec.RAYSERVICE_NAME_MAX,
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
