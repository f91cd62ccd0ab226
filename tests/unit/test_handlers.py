"""The decisions inside the kopf handlers that need no API server: the parse cache and the
promise behind NoDiffBase (no kopf change handlers). The handlers' I/O is tested on the local
cluster (tests/cluster)."""

import copy

import kopf
import pytest

from tputorch import handlers, spec

from .jobs import body


@pytest.fixture(autouse=True)
def empty_cache():
    handlers.STATE.parsed.clear()
    yield
    handlers.STATE.parsed.clear()


def test_no_change_handlers_since_kopf_keeps_no_diff_base():
    # NoDiffBase builds empty essences: an on.create/on.update/on.resume handler would never see a
    # change. Registering one means putting kopf's AnnotationsDiffBaseStorage back (handlers.configure).
    registry = kopf.get_default_registry()
    assert list(registry._changing.get_all_handlers()) == []
    assert list(registry._spawning.get_all_handlers()) == []
    assert [h.id for h in registry._watching.get_all_handlers()] != []  # the registry was read at all
    assert handlers.NoDiffBase().build(body=kopf.Body(body())) == {}


def test_a_status_write_does_not_parse_again():
    job = body()
    first = handlers._parse(job, "ml")
    echoed = copy.deepcopy(job)
    echoed["status"] = {"phase": "Pending"}
    echoed["metadata"]["resourceVersion"] = "42"
    assert handlers._parse(echoed, "ml") is first


def test_a_new_generation_or_new_labels_parse_again():
    job = body()
    first = handlers._parse(job, "ml")
    changed = body(entrypoint="python other.py")
    changed["metadata"]["generation"] = 2
    assert handlers._parse(changed, "ml").entrypoint == "python other.py"
    relabelled = copy.deepcopy(changed)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert handlers._parse(relabelled, "ml").labels == {"team": "ml"}
    assert first.entrypoint == "python train.py"


def test_an_invalid_spec_stays_invalid_until_it_changes():
    bad = body(tpu={"topology": "3x3"})
    for _ in range(2):
        with pytest.raises(spec.InvalidSpec, match="spec.tpu.topology"):
            handlers._parse(bad, "ml")
    fixed = body()
    fixed["metadata"]["generation"] = 2
    assert handlers._parse(fixed, "ml").slice.topology == "4x4"


def test_the_namespace_is_the_objects_own_whatever_the_body_says():
    job = body(namespace="elsewhere")
    assert handlers._parse(job, "ml").namespace == "ml"


def test_forgetting_a_job_drops_its_cached_spec():
    job = body()
    handlers._parse(job, "ml")
    handlers._forget(job["metadata"]["uid"], "ml", "demo")
    assert handlers.STATE.parsed == {}
