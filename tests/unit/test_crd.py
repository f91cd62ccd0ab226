"""The CRD agrees with the parser and with crds/ (a drift fails here)."""

import pathlib

import yaml

from tputorch import crd, spec, status, topology

ROOT = pathlib.Path(__file__).resolve().parents[2]


def schema():
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_generated():
    assert (ROOT / "crds" / "tputorch.io_tputorchjobs.yaml").read_text() == crd.crd_yaml()


def test_names_and_scope():
    c = crd.crd()
    assert c["metadata"]["name"] == "tputorchjobs.tputorch.io"
    names = c["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("TPUTorchJob", "tputorchjobs", ["ttj"])
    assert c["spec"]["scope"] == "Namespaced"
    assert c["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_schema_fields_are_the_fields_the_parser_knows():
    props = schema()["properties"]["spec"]["properties"]
    assert set(props) == spec.SPEC_FIELDS
    assert set(props["tpu"]["properties"]) == spec.TPU_FIELDS
    assert set(props["head"]["properties"]) == spec.HEAD_FIELDS
    assert set(props["worker"]["properties"]) == spec.RESOURCE_FIELDS


def test_every_status_field_is_declared():
    # Undeclared status fields would be pruned silently by the API server.
    assert set(schema()["properties"]["status"]["properties"]) == set(status.STATUS_FIELDS)


def test_defaults_come_from_the_parser():
    props = schema()["properties"]["spec"]["properties"]
    assert props["rayVersion"]["default"] == spec.DEFAULTS["rayVersion"]
    assert props["tpu"]["properties"]["chipsPerWorker"]["default"] == spec.DEFAULTS["tpu.chipsPerWorker"]
    assert props["worker"]["properties"]["memory"]["default"] == spec.DEFAULTS["worker.memory"]
    assert props["shutdownAfterJobFinishes"]["default"] is True


def test_accelerator_enum_and_cel_topology_table_match_the_topology_module():
    tpu = schema()["properties"]["spec"]["properties"]["tpu"]
    assert set(tpu["properties"]["accelerator"]["enum"]) == set(topology.ACCELERATOR_ALIASES)
    rule = next(r for r in tpu["x-kubernetes-validations"] if r.get("fieldPath") == ".topology")
    table = yaml.safe_load(rule["rule"].split(" in ", 1)[1].rsplit("[", 1)[0])
    for alias, name in topology.ACCELERATOR_ALIASES.items():
        assert table[alias] == list(topology.GENERATIONS[name].topologies)


def test_tpu_block_is_immutable_and_single_slice():
    tpu = schema()["properties"]["spec"]["properties"]["tpu"]
    assert {"rule": "self == oldSelf", "message": tpu["x-kubernetes-validations"][0]["message"]} == tpu["x-kubernetes-validations"][0]
    assert tpu["properties"]["slices"]["x-kubernetes-validations"][0]["rule"] == "self == 1"


def test_printer_columns():
    cols = {c["name"]: c["jsonPath"] for c in crd.crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols == {
        "Accelerator": ".spec.tpu.accelerator",
        "Topology": ".spec.tpu.topology",
        "Workers": ".status.workers",
        "Phase": ".status.phase",
        "Hosts": ".status.hostsReady",
        "Age": ".metadata.creationTimestamp",
    }
