"""Inputs the CRD used to admit but that broke later (at pod creation, in KubeRay's bash, in the
operator's own decoder): the parser refuses each, naming the field, the value and what is allowed."""

import pytest

from tputorch.api import common, crd, reader, spec
from tputorch.api.schema import bounded

from ..jobs import body
from ..services import service_body


def deep(levels: int) -> dict:
    value: object = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


def errors_of(b) -> list[str]:
    parse = spec.parse_service if b["kind"] == "TPUTorchService" else spec.parse
    with pytest.raises(spec.InvalidSpec) as err:
        parse(b)
    return [str(e) for e in err.value.errors]


CASES = [
    ({"nodeSelector": {"bad key/!": "x"}}, "spec.nodeSelector"),
    ({"nodeSelector": {"pool": "not a label value!"}}, "spec.nodeSelector.pool"),
    ({"nodeSelector": {f"k{i}": "v" for i in range(reader.MAX_PROPERTIES + 1)}}, "spec.nodeSelector: must have at most 64"),
    ({"env": [{"name": "X", "valueFrom": {"nonsense": {}}}]}, "spec.env[0].valueFrom"),
    ({"env": [{"name": "X", "valueFrom": {"fieldRef": {}, "secretKeyRef": {}}}]}, "spec.env[0].valueFrom"),
    ({"env": [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
     "spec.env[0].value: '1' must not be set together with valueFrom"),
    ({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}, "spec.env[0].valueFrom.secretKeyRef.key: is required"),
    ({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"key": "k"}}}]}, "spec.env[0].valueFrom.configMapKeyRef.name: is required"),
    ({"env": [{"name": "X", "valueFrom": {"fieldRef": {"path": "x"}}}]}, "spec.env[0].valueFrom.fieldRef.path: "),
    ({"env": [{"name": "X", "valueFrom": {"resourceFieldRef": {}}}]}, "spec.env[0].valueFrom.resourceFieldRef.resource: is required"),
    ({"env": [{"name": "X", "value": "v" * (1024 * 1024)}]}, "spec.env[0].value: 'vvv"),
    ({"env": [{"name": f"V{i}", "value": "1"} for i in range(reader.MAX_ENV + 1)]}, "spec.env: "),
    ({"env": [{"name": "X", "valueFrom": deep(1000)}]}, "spec.env[0].valueFrom"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.tolerations[0].value: 'v' must be empty when operator is Exists"),
    ({"tolerations": [{"operator": "Equal", "value": "v"}]}, "spec.tolerations[0].operator: 'Equal' must be Exists when key is empty"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]}, "spec.tolerations[0].tolerationSeconds: 5 must only be set when effect is NoExecute"),
    ({"tolerations": [{"key": "bad key!", "operator": "Exists"}]}, "spec.tolerations[0].key: 'bad key!' must be a label name"),
    ({"tolerations": [{"key": "k", "operatr": "Exists"}]}, "spec.tolerations[0].operatr: 'Exists' is not a known field"),
    ({"tolerations": [deep(1000)]}, "spec.tolerations[0].a"),
    ({"tolerations": [{"key": "k", "operator": "Exists"}] * (reader.MAX_TOLERATIONS + 1)}, "spec.tolerations: "),
    ({"worker": {"memory": "0"}}, "spec.worker.memory: '0' must be greater than zero"),
    ({"head": {"cpu": "0.0m"}}, "spec.head.cpu: '0.0m' must be greater than zero"),
    ({"worker": {"memory": 0}}, "spec.worker.memory: 0 must be greater than zero"),
    ({"runtimeEnv": deep(1000)}, "spec.runtimeEnv: must be nested at most 32 levels deep"),
    ({"runtimeEnv": deep(33)}, "spec.runtimeEnv: must be nested at most 32 levels deep"),
    ({"runtimeEnv": {"pip": ["p" * 100] * 400}}, "spec.runtimeEnv: must be at most 32768 bytes as JSON"),
    ({"runtimeEnv": {"env_vars": {"A": "x" * (reader.MAX_ENV_VALUE + 1)}}}, "spec.runtimeEnv"),
    ({"securityContext": {"privileged": True, "allowPrivilegeEscalation": False}},
     "spec.securityContext.allowPrivilegeEscalation: False must not be false with privileged"),
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": True}}, "spec.securityContext.runAsNonRoot: True must not be true with runAsUser 0"),
    ({"securityContext": {"seccompProfile": {"type": "Localhost"}}}, "spec.securityContext.seccompProfile.localhostProfile: must be set exactly when type is Localhost"),
    ({"securityContext": {"hostPID": True}}, "spec.securityContext.hostPID: True is not a known field"),
    ({"securityContext": {"capabilities": {"add": ["net admin"]}}}, "spec.securityContext.capabilities.add[0]: 'net admin' must be a capability name"),
    ({"automountServiceAccountToken": "yes"}, "spec.automountServiceAccountToken: 'yes' must be a boolean"),
]


@pytest.mark.parametrize("overrides,fragment", CASES)
@pytest.mark.parametrize("kind", ["job", "service"])
def test_refused_with_the_field_named(kind, overrides, fragment):
    b = body() if kind == "job" else service_body()
    b["spec"].update(overrides)  # not through body(), which deep-copies (recursion on 1,000 levels)
    problems = errors_of(b)
    assert any(fragment in p for p in problems), problems


JOB_ONLY = [
    ({"runtimeEnv": {"env_vars": {"A": "$(cat /etc/passwd)"}}}, "spec.runtimeEnv.env_vars.A: '$(cat /etc/passwd)' must not contain $ or `"),
    ({"runtimeEnv": {"working_dir": "gs://b/`id`"}}, "spec.runtimeEnv.working_dir: 'gs://b/`id`' must not contain $ or `"),
    ({"entrypoint": "é" * 40_000}, "spec.entrypoint: "),
]


@pytest.mark.parametrize("overrides,fragment", JOB_ONLY)
def test_job_only_rules(overrides, fragment):
    problems = errors_of(body(**overrides))
    assert any(fragment in p for p in problems), problems


def test_engine_args_are_bounded_like_runtime_env():
    b = service_body()
    b["spec"]["engine"] = {"args": deep(1000)}
    assert any("spec.engine.args: must be nested at most 32" in p for p in errors_of(b))
    # a service's runtimeEnv goes to Serve's config, not through bash: $ stays allowed
    spec.parse_service(service_body(runtimeEnv={"env_vars": {"A": "$HOME"}}))


def test_valid_selectors_sources_and_tolerations_pass():
    job = spec.parse(body(nodeSelector={"cloud.google.com/gke-nodepool": "pool-1"},
                          env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}}},
                               {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                               {"name": "BIG", "value": "x" * reader.MAX_ENV_VALUE}],
                          tolerations=[{"operator": "Exists"}, {"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", "tolerationSeconds": 30}],
                          runtimeEnv=deep(reader.MAX_DEPTH - 1), worker={"memory": "500Mi"}))
    assert job.node_selector["cloud.google.com/gke-nodepool"] == "pool-1"


def test_security_context_defaults_meet_restricted_and_keys_replace_them():
    job = spec.parse(body())
    assert job.security_context == common.DEFAULT_SECURITY_CONTEXT and job.automount_service_account_token is False
    root = spec.parse(body(securityContext={"runAsUser": 0}, automountServiceAccountToken=True))
    assert root.security_context["runAsUser"] == 0 and "runAsNonRoot" not in root.security_context
    assert root.automount_service_account_token is True
    privileged = spec.parse(body(securityContext={"privileged": True}))
    assert privileged.security_context["privileged"] is True and "allowPrivilegeEscalation" not in privileged.security_context


def test_every_string_list_and_map_of_the_spec_schemas_is_bounded():
    """bounded (api/schema.py) gives a bound to each field without one: a field added later is bounded too."""
    unbounded = []

    def walk(schema, path):
        kind = schema.get("type")
        if kind == "string" and "enum" not in schema and "maxLength" not in schema:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in schema:
            unbounded.append(path)
        if kind == "object" and ("additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")) \
                and "maxProperties" not in schema:
            unbounded.append(path)
        for name, sub in (schema.get("properties") or {}).items():
            walk(sub, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                walk(schema[key], f"{path}[{key}]")

    for definition in crd.crd():
        walk(definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")
    assert unbounded == []
    assert bounded({"type": "object", "properties": {"new": {"type": "string"}}})["properties"]["new"]["maxLength"] == reader.MAX_STRING
