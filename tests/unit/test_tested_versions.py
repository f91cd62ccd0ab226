"""One list of the KubeRay and Kueue versions the suite runs (tputorch.tested_versions): the local
cluster builds them (hack/build.sh), and docs/compatibility.md and CHANGELOG.md's newest "Tested
with" state exactly them."""

import re
from pathlib import Path

import pytest

import tputorch
from tputorch import tested_versions

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = {"KubeRay": ("KUBERAY_VERSION", tested_versions.KUBERAY),
              "Kueue": ("KUEUE_VERSION", tested_versions.KUEUE)}


@pytest.mark.parametrize("name", COMPONENTS)
def test_the_local_cluster_builds_the_tested_versions(name):
    var, tested = COMPONENTS[name]
    build = (ROOT / "hack" / "build.sh").read_text()
    (default,) = re.findall(rf"^{var}=\$\{{{var}:-v([0-9.]+)\}}", build, re.M)
    assert default in tested
    scripts = build + (ROOT / "hack" / "test.sh").read_text() + (ROOT / "Makefile").read_text()
    assert all(f"v{v}" in scripts for v in tested), f"{name} {tested}: each tested version is one the suite builds"


@pytest.mark.parametrize("name", COMPONENTS)
def test_compatibility_md_states_the_tested_versions(name):
    text = (ROOT / "docs" / "compatibility.md").read_text()
    section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
    (row,) = [ln for ln in section.splitlines() if ln.startswith("| Tested |")]
    assert tuple(re.findall(r"\*\*([0-9.]+)\*\*", row)) == COMPONENTS[name][1]


@pytest.mark.parametrize("name", COMPONENTS)
def test_the_changelog_states_the_tested_versions(name):
    text = (ROOT / "CHANGELOG.md").read_text()
    entry = text.split(f"## [{tputorch.__version__}]", 1)[1].split("\n## [", 1)[0]
    tested = entry.split("### Tested with\n", 1)[1]
    (line,) = [ln for ln in tested.splitlines() if ln.startswith(f"- {name} ")]
    assert line == f"- {name} {tested_versions.shown(COMPONENTS[name][1])}"


def test_shown():
    assert tested_versions.shown(("1.6.2",)) == "1.6.2"
    assert tested_versions.shown(("1.6.2", "1.7.0")) == "1.6.2 and 1.7.0"
    assert tested_versions.shown(("a", "b", "c")) == "a, b and c"
