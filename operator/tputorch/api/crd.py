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
from .. import __version__, train

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

# On each CRD: the operator release whose CRDs these are. Helm never upgrades a chart's crds/, so a
# cluster may hold an earlier release's (outdated()): `tputorch doctor` and the operator say so.
RELEASE = __version__
RELEASE_ANNOTATION = f"{GROUP}/release"
FIRST_ANNOTATED = "0.3.0"  # CRDs before this release name none


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
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/name": "tputorch-operator"},
                     "annotations": {RELEASE_ANNOTATION: RELEASE}},
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
NAMES = {NAME: KIND, SERVICE_NAME: SERVICE_KIND}  # CRD name -> kind
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


# ---------------------------------------------------------------- the CRDs a cluster has

def apply_commands() -> str:
    """How to install this release's CRDs over a Helm release's (server-side: too large for a
    client-side apply's annotation; forcing the fields Helm's create owns)."""
    return (f"apply tputorch-operator {RELEASE}'s CRDs: `kubectl apply --server-side --force-conflicts -f "
            f"tputorch-crds-{RELEASE}.yaml` (the release's CRD bundle, `make release`'s dist/), or "
            f"`tputorch crd | kubectl apply --server-side --force-conflicts -f -` with the {RELEASE} CLI; "
            f"Helm never upgrades a chart's crds/")


def _versions(definition: dict) -> dict:
    """version name -> what of a CRD's version the operator and the cluster must agree on."""
    return {v.get("name"): {"schema": (v.get("schema") or {}).get("openAPIV3Schema"),
                            "served": v.get("served"), "storage": v.get("storage"),
                            "subresources": v.get("subresources") or {},
                            "additionalPrinterColumns": v.get("additionalPrinterColumns") or []}
            for v in (definition.get("spec") or {}).get("versions") or []}


def first_difference(a: object, b: object, path: str = "") -> str | None:
    """The first path where two JSON values differ, or None when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip(".")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})".lstrip(".")
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else (path.lstrip(".") or "(the whole value)")


def release_of(installed: dict) -> str:
    """The release an installed CRD says it is, in words."""
    found = ((installed.get("metadata") or {}).get("annotations") or {}).get(RELEASE_ANNOTATION)
    return f"tputorch-operator {found}'s" if found else f"from a release before {FIRST_ANNOTATED} (it names none)"


def _without_descriptions(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def outdated(installed: dict) -> str | None:
    """Why ``installed`` (one of our CRDs, as the API server returns it) is not this release's:
    the release it is, where its versions differ (a difference the API server acts on first, a
    description only when nothing else differs) and what that does; None when its versions
    (schema, served and storage, subresources, printer columns) are this release's, whatever
    release it names (a release that changed nothing of them)."""
    name = (installed.get("metadata") or {}).get("name")
    kind = NAMES[name]
    found, expected = _versions(installed), _versions(BUILDERS[kind]())
    diff = first_difference(_without_descriptions(found), _without_descriptions(expected))
    if diff is not None:
        effect = (f"so the API server prunes or refuses what only {RELEASE}'s schema has (a spec field added "
                  f"since is dropped without a word), or refuses what {RELEASE} allows")
    else:
        diff = first_difference(found, expected)
        if diff is None:
            return None
        effect = "in its descriptions only (`kubectl explain` shows the earlier ones; the API server checks the same)"
    return (f"the installed {kind} CRD ({name}) is {release_of(installed)}, not tputorch-operator {RELEASE}'s: "
            f"it differs at versions.{diff}, {effect}")
