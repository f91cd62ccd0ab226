"""Inputs the CRD admits but Kubernetes would refuse later (at pod creation): the parser names them."""

import pytest

from tputorch.api import spec

from ..jobs import body


@pytest.mark.parametrize("overrides,fragment", [
    ({"nodeSelector": {"bad key/!": "x"}}, "spec.nodeSelector"),
    ({"nodeSelector": {"pool": "not a label value!"}}, "spec.nodeSelector.pool"),
    ({"env": [{"name": "X", "valueFrom": {"nonsense": {}}}]}, "spec.env[0].valueFrom"),
    ({"env": [{"name": "X", "valueFrom": {"fieldRef": {}, "secretKeyRef": {}}}]}, "spec.env[0].valueFrom"),
])
def test_refused_with_the_field_named(overrides, fragment):
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse(body(**overrides))
    assert fragment in str(err.value)


def test_valid_selectors_and_sources_pass():
    job = spec.parse(body(nodeSelector={"cloud.google.com/gke-nodepool": "pool-1"},
                          env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]))
    assert job.node_selector["cloud.google.com/gke-nodepool"] == "pool-1"
