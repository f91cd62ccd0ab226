"""The CRDs agree with the parser and with crds/ (a drift fails here). What the API server does with
the CEL rules is tested against a real one in tests/cluster/test_crd_rules.py."""

import pathlib
import re

import pytest
import yaml

from tputorch.api import crd, phases, spec, topology
from tputorch.api.schema import common_properties

ROOT = pathlib.Path(__file__).resolve().parents[3]
KINDS = [crd.KIND, crd.SERVICE_KIND]


def definition(kind):
    return crd.BUILDERS[kind]()


def schema(kind=crd.KIND):
    return definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def spec_props(kind=crd.KIND):
    return schema(kind)["properties"]["spec"]["properties"]


def rules(obj):
    return obj.get("x-kubernetes-validations") or []


@pytest.mark.parametrize("kind", KINDS)
def test_committed_crds_match_generated(kind):
    assert (ROOT / "crds" / crd.FILES[kind]).read_text() == crd.crd_yaml(kind)


def test_crd_yaml_without_kind_holds_both():
    docs = list(yaml.safe_load_all(crd.crd_yaml()))
    assert docs == crd.crd() == [crd.job_crd(), crd.service_crd()]


@pytest.mark.parametrize("kind,name,plural,short", [
    (crd.KIND, "tputorchjobs.tputorch.io", "tputorchjobs", ["ttj"]),
    (crd.SERVICE_KIND, "tputorchservices.tputorch.io", "tputorchservices", ["ttsvc"]),
])
def test_names_and_scope(kind, name, plural, short):
    c = definition(kind)
    assert c["metadata"]["name"] == name
    names = c["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (kind, plural, short)
    assert (crd.SERVICE_PLURAL if kind == crd.SERVICE_KIND else crd.PLURAL) == plural
    assert c["spec"]["scope"] == "Namespaced"
    assert c["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_schema_fields_are_the_fields_the_parser_knows():
    job, svc = spec_props(crd.KIND), spec_props(crd.SERVICE_KIND)
    assert set(job) == spec.SPEC_FIELDS
    assert set(svc) == spec.SERVICE_SPEC_FIELDS
    assert set(job["tpu"]["properties"]) == spec.TPU_FIELDS
    assert set(svc["tpu"]["properties"]) == spec.SERVICE_TPU_FIELDS
    for props in (job, svc):
        assert set(props["head"]["properties"]) == spec.HEAD_FIELDS
        assert set(props["worker"]["properties"]) == spec.RESOURCE_FIELDS
    assert set(svc["model"]["properties"]) == spec.MODEL_FIELDS
    assert set(svc["model"]["properties"]["hfTokenSecret"]["properties"]) == spec.SECRET_REF_FIELDS
    assert set(svc["engine"]["properties"]) == spec.ENGINE_FIELDS
    assert set(svc["replicas"]["properties"]) == spec.REPLICA_FIELDS


def test_shared_blocks_are_the_same_schema_in_both_kinds():
    job, svc = spec_props(crd.KIND), spec_props(crd.SERVICE_KIND)
    for key in ("env", "head", "worker", "tolerations", "nodeSelector", "rayVersion", "serviceAccountName"):
        assert job[key] == svc[key], key


@pytest.mark.parametrize("kind,fields", [(crd.KIND, phases.STATUS_FIELDS), (crd.SERVICE_KIND, phases.SERVICE_STATUS_FIELDS)])
def test_every_status_field_is_declared(kind, fields):
    # Undeclared status fields would be pruned silently by the API server.
    assert set(schema(kind)["properties"]["status"]["properties"]) == set(fields)


def test_defaults_come_from_the_parser():
    props = spec_props()
    assert props["rayVersion"]["default"] == spec.DEFAULTS["rayVersion"]
    assert props["tpu"]["properties"]["chipsPerWorker"]["default"] == spec.DEFAULTS["tpu.chipsPerWorker"]
    assert props["worker"]["properties"]["memory"]["default"] == spec.DEFAULTS["worker.memory"]
    assert props["shutdownAfterJobFinishes"]["default"] is True
    svc = spec_props(crd.SERVICE_KIND)
    assert svc["engine"]["properties"]["pipelineParallelSize"]["default"] == spec.SERVICE_DEFAULTS["engine.pipelineParallelSize"] == 1
    assert svc["replicas"]["properties"]["min"]["default"] == spec.SERVICE_DEFAULTS["replicas.min"] == 1
    assert "default" not in svc["replicas"]["properties"]["max"]  # the parser defaults it to min


@pytest.mark.parametrize("kind", KINDS)
def test_accelerator_enum_and_cel_topology_table_match_the_topology_module(kind):
    tpu = spec_props(kind)["tpu"]
    assert set(tpu["properties"]["accelerator"]["enum"]) == set(topology.ACCELERATOR_ALIASES)
    rule = next(r for r in rules(tpu) if r.get("fieldPath") == ".topology")
    table = yaml.safe_load(rule["rule"].split(" in ", 1)[1].rsplit("[", 1)[0])
    for alias, name in topology.ACCELERATOR_ALIASES.items():
        assert table[alias] == list(topology.GENERATIONS[name].topologies)


@pytest.mark.parametrize("kind", KINDS)
def test_tpu_block_is_immutable_and_single_slice(kind):
    tpu = spec_props(kind)["tpu"]
    first = rules(tpu)[0]
    assert first["rule"] == "self == oldSelf" and f"delete the {kind}" in first["message"]
    assert tpu["properties"]["slices"]["x-kubernetes-validations"][0]["rule"] == "self == 1"


def transition_rules(obj):
    return [r for r in rules(obj) if "oldSelf" in r["rule"]]


def test_every_job_field_but_suspend_is_immutable_including_adding_or_removing_it():
    spec_schema = schema()["properties"]["spec"]
    guarded = {}
    for r in transition_rules(spec_schema):
        (field,) = set(re.findall(r"self\.(\w+)", r["rule"]))
        guarded[field] = r
        # has() on both sides: adding or removing an optional field is a change too.
        assert f"has(self.{field}) == has(oldSelf.{field})" in r["rule"]
        assert f"spec.{field} is immutable: delete the TPUTorchJob and create it again" in r["message"]
    assert set(guarded) == spec.SPEC_FIELDS - {"suspend", "tpu"}  # tpu: its own rule, above


def test_service_only_tpu_and_the_serve_service_are_immutable():
    spec_schema = schema(crd.SERVICE_KIND)["properties"]["spec"]

    def walk(obj, path):
        if isinstance(obj, dict):
            for r in transition_rules(obj):
                yield path, r
            for k, v in obj.items():
                yield from walk(v, f"{path}.{k}")
        elif isinstance(obj, list):
            for v in obj:
                yield from walk(v, path)

    rules = list(walk(spec_schema, "spec"))
    assert [p for p, _ in rules] == ["spec", "spec.properties.tpu", "spec.properties.exposure"]
    # the spec's: a queued service stays fixed or autoscaled (Kueue's elastic-job annotation is immutable)
    assert rules[0][1]["rule"].startswith("!has(self.queueName) || !has(oldSelf.queueName) || ")
    assert "(max == min) and a range (max > min)" in rules[0][1]["message"]
    # exposure's: only its serveService (KubeRay never carries an edit of it to the Service)
    assert "self.serveService == oldSelf.serveService" in rules[2][1]["rule"]
    assert "spec.exposure.serveService is immutable" in rules[2][1]["message"]


def _cel_autoscaled(spec: dict) -> bool:
    """The queued-autoscaling rule's notion of a range, evaluated in Python on a spec as the API
    server has it (CRD defaults applied or not)."""
    replicas = spec.get("replicas")
    return replicas is not None and "max" in replicas and replicas["max"] > replicas.get("min", 1)


@pytest.mark.parametrize("replicas,autoscaled", [({}, False), ({"min": 2}, False), ({"min": 2, "max": 2}, False),
                                                 ({"max": 2}, True), ({"min": 1, "max": 3}, True)])
def test_the_queued_autoscaling_rule_agrees_with_the_parser(replicas, autoscaled):
    """The CEL rule's range is the parser's ServiceSpec.autoscaling (what renders the annotation)."""
    from tputorch.api import spec as api_spec
    from ..services import service_body

    svc = api_spec.parse_service(service_body(replicas=replicas))
    assert svc.autoscaling is autoscaled is _cel_autoscaled({"replicas": replicas})
    (rule,) = [r for r in rules(schema(crd.SERVICE_KIND)["properties"]["spec"]) if "oldSelf.queueName" in r["rule"]]
    expected = ("(has(self.replicas) && has(self.replicas.max) && self.replicas.max > "
                "(has(self.replicas.min) ? self.replicas.min : 1))")
    assert expected in rule["rule"] and expected.replace("self.", "oldSelf.") in rule["rule"]


@pytest.mark.parametrize("kind", KINDS)
def test_conditions_are_metav1_conditions(kind):
    conditions = schema(kind)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["maxItems"] >= len(phases.SERVICE_CONDITION_TYPES)
    item = conditions["items"]
    assert set(item["required"]) == {"type", "status", "reason", "message", "lastTransitionTime"}
    reason = re.compile(item["properties"]["reason"]["pattern"])
    reasons = ["Valid", "Created", "Unschedulable", "AllHostsReady", "NonZeroServeEndpoints", "InitializingTimeout",
               "KubeRayNotInstalled", "RayJobNameTaken", "ValidationFailed", "DeployFailed", "WaitingForKubeRay"]
    assert all(reason.match(r) for r in reasons)
    assert item["properties"]["message"]["maxLength"] == phases.MAX_CONDITION_MESSAGE


@pytest.mark.parametrize("kind,child", [(crd.KIND, "RayJob"), (crd.SERVICE_KIND, "RayService")])
def test_name_rules_at_the_root(kind, child):
    size, dns = rules(schema(kind))
    assert size["rule"] == "self.metadata.name.size() <= 47" and child in size["message"]
    pattern = re.search(r"matches\('(.*)'\)", dns["rule"]).group(1)
    assert pattern == spec.DNS1035.pattern
    assert "DNS-1035" in dns["message"]


def test_engine_args_carry_no_cel_rule_the_api_server_would_refuse():
    # CEL cannot type a map of arbitrary values: the API server refuses such a CRD (seen on the
    # local cluster); the operator refuses the reserved keys instead (test_spec_service).
    args = spec_props(crd.SERVICE_KIND)["engine"]["properties"]["args"]
    assert "x-kubernetes-validations" not in args
    assert args["additionalProperties"] == {"x-kubernetes-preserve-unknown-fields": True}


def test_tp_times_pp_rules_cover_every_slice_with_its_chip_count():
    engine_rules = [r for r in rules(schema(crd.SERVICE_KIND)["properties"]["spec"]) if r.get("fieldPath") == ".engine"]
    covered = {}
    for rule in engine_rules:
        chips = int(re.search(r"must equal (\d+),", rule["message"]).group(1))
        listed = yaml.safe_load(re.search(r"in (\[[^]]*\])", rule["rule"]).group(1))
        assert f"== {chips}" in rule["rule"]
        for t in listed:
            assert t not in covered
            covered[t] = chips
    every = {t for g in topology.GENERATIONS.values() for t in g.topologies}
    assert set(covered) == every
    assert all(covered[t] == topology.chip_count(t) for t in every)
    assert covered["4x4"] == 16 and covered["2x2x2"] == 8


def test_printer_columns():
    cols = {c["name"]: c["jsonPath"] for c in definition(crd.KIND)["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols == {
        "Accelerator": ".spec.tpu.accelerator",
        "Topology": ".spec.tpu.topology",
        "Workers": ".status.workers",
        "Phase": ".status.phase",
        "Queue": ".spec.queueName",
        "Priority": ".spec.priorityClassName",
        "Hosts": ".status.hostsReady",
        "Attempt": ".status.attempts",
        "Step": ".status.progress.step",
        "Loss": ".status.progress.metrics.loss",
        "Reward": ".status.progress.metrics.reward_mean",  # what examples/rl/grpo.py reports (issue 38)
        "Weights": ".status.progress.metrics.weight_version",
        "Age": ".metadata.creationTimestamp",
    }
    cols = [(c["name"], c["jsonPath"]) for c in definition(crd.SERVICE_KIND)["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert cols == [
        ("Accelerator", ".spec.tpu.accelerator"),
        ("Topology", ".spec.tpu.topology"),
        ("Model", ".status.model"),
        ("Ready", ".status.replicasReady"),
        ("Phase", ".status.phase"),
        ("Queue", ".spec.queueName"),
        ("Endpoint", ".status.endpoint"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_the_shared_block_is_declared_once_for_both_kinds():
    """Both kinds' schemas take the common block from one function, the parser's COMMON_FIELDS, and
    both spec classes inherit its attributes from one dataclass."""
    import dataclasses

    from tputorch.api import common

    assert set(common_properties(crd.KIND)) == common.COMMON_FIELDS
    assert set(common_properties(crd.SERVICE_KIND)) == common.COMMON_FIELDS
    shared = {f.name for f in dataclasses.fields(common.CommonSpec)}
    for cls in (spec.JobSpec, spec.ServiceSpec):
        assert issubclass(cls, common.CommonSpec)
        assert not set(cls.__annotations__) & shared, f"{cls.__name__} redeclares shared fields"
