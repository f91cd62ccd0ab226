"""The new operator against the previous release's CRDs (issue 59): Helm never upgrades a chart's
crds/, so after a `helm upgrade` the cluster may hold 0.2.0's. The operator says so at startup (a
log line, a Warning Event on its Pod), `tputorch doctor` fails naming what to apply; the same
schema under an older release's name is no problem. Reads are fakes."""

import asyncio
import copy
import logging

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tputorch.api import crd
from tputorch.cli import doctor
from tputorch.cli.doctor.result import FAIL, OK
from tputorch.controller import crdcheck

from ..cli.test_doctor import NOW, healthy_facts
from ..previous import previous, release, show

POD = {"apiVersion": "v1", "kind": "Pod", "name": "tputorch-operator-7d9f-abcde", "namespace": "tputorch-system"}


def previous_crds() -> dict:
    """name -> the previous release's CRD, as it stands installed."""
    return {name: yaml.safe_load(show(f"crds/{crd.FILES[kind]}")) for name, kind in crd.NAMES.items()}


def current_crds() -> dict:
    return {name: crd.BUILDERS[kind]() for name, kind in crd.NAMES.items()}


def run_check(installed: dict, pod: dict | None = POD):
    """What crdcheck.check says with ``installed`` (name -> CRD, None, or an exception to raise)."""
    recorded = []

    async def read(name):
        got = installed[name]
        if isinstance(got, Exception):
            raise got
        return got
    said = asyncio.run(crdcheck.check(read, lambda regarding, events: recorded.append((regarding, events)), pod))
    return said, recorded


def test_this_releases_crds_name_it_and_the_release_script_reads_the_same_annotation():
    for definition in current_crds().values():
        assert definition["metadata"]["annotations"] == {crd.RELEASE_ANNOTATION: crd.RELEASE}
    assert release.CRD_RELEASE_ANNOTATION == crd.RELEASE_ANNOTATION


def test_the_operator_says_nothing_with_this_releases_crds(caplog):
    with caplog.at_level(logging.WARNING, logger="tputorch"):
        assert run_check(current_crds()) == ([], [])
    assert caplog.records == []


def test_the_operator_against_the_previous_releases_crds_logs_and_posts_what_to_apply(caplog):
    version, _ = previous()
    with caplog.at_level(logging.WARNING, logger="tputorch"):
        said, recorded = run_check(previous_crds())
    assert len(said) == 2  # both kinds' schemas changed since (a job's groups[].env; descriptions)
    for message, (regarding, (event,)) in zip(said, recorded):
        assert regarding == POD
        assert (event.type, event.reason, event.message) == ("Warning", crdcheck.REASON, message)
        assert f"from a release before {crd.FIRST_ANNOTATED}" in message, message
        assert f"not tputorch-operator {crd.RELEASE}'s" in message
        assert "differs at versions.v1alpha1.schema.properties" in message and ".description" not in message
        assert f"kubectl apply --server-side --force-conflicts -f tputorch-crds-{crd.RELEASE}.yaml" in message
        assert "tputorch crd | kubectl apply --server-side --force-conflicts -f -" in message
    assert [r.getMessage() for r in caplog.records] == said
    assert version != crd.RELEASE


def test_an_older_release_with_the_same_schema_is_not_outdated():
    older = copy.deepcopy(current_crds())
    for definition in older.values():
        definition["metadata"]["annotations"][crd.RELEASE_ANNOTATION] = "0.2.9"
        definition["metadata"]["managedFields"] = [{"manager": "helm"}]  # what the API server adds
    assert run_check(older) == ([], [])
    changed = older[crd.NAME]
    changed["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    said, _ = run_check(older)
    assert len(said) == 1 and said[0].startswith(f"the installed TPUTorchJob CRD ({crd.NAME}) is tputorch-operator 0.2.9's")
    assert "differs at versions.v1alpha1.additionalPrinterColumns" in said[0]
    described = copy.deepcopy(current_crds())
    described[crd.SERVICE_NAME]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "earlier words"
    (said,), _ = run_check(described)
    assert "differs at versions.v1alpha1.schema.description, in its descriptions only" in said


def test_a_crd_not_installed_is_said_and_one_that_cannot_be_read_is_logged_only(caplog):
    installed = {crd.NAME: None, crd.SERVICE_NAME: ApiException(status=403, reason="Forbidden")}
    with caplog.at_level(logging.WARNING, logger="tputorch"):
        said, recorded = run_check(installed)
    assert said == [f"the TPUTorchJob CRD ({crd.NAME}) is not installed. To fix: {crd.apply_commands()}"]
    assert [r[1][0].reason for r in recorded] == [crdcheck.REASON]
    assert any(f"could not read the CRD {crd.SERVICE_NAME}" in r.getMessage() and "Forbidden" in r.getMessage()
               for r in caplog.records)


def test_outside_a_pod_the_operator_only_logs(monkeypatch, caplog):
    monkeypatch.delenv("POD_NAME", raising=False)
    assert crdcheck.own_pod() is None
    with caplog.at_level(logging.WARNING, logger="tputorch"):
        said, recorded = run_check(previous_crds(), pod=crdcheck.own_pod())
    assert len(said) == 2 and recorded == [] and len(caplog.records) == 2
    monkeypatch.setenv("POD_NAME", POD["name"])
    monkeypatch.setenv("POD_NAMESPACE", POD["namespace"])
    assert crdcheck.own_pod() == POD


@pytest.mark.parametrize("which", ["previous", "current"])
def test_doctor_fails_on_the_previous_releases_crds_naming_what_to_apply(which):
    facts = healthy_facts()
    facts["crds"].update(previous_crds() if which == "previous" else current_crds())
    results = {r.check: r for r in doctor.run_checks(facts, NOW)}
    for name, kind in crd.NAMES.items():
        got = results[f"crd/{name}"]
        if which == "current":
            assert got.status == OK, got
            continue
        assert got.status == FAIL and got.message.startswith(f"the installed {kind} CRD ({name}) is from a release before")
        assert "--force-conflicts" in got.fix and "tputorch crd" in got.fix
