"""The release's one version (hack/release.py): the package, the chart, the image tag and CHANGELOG.md
agree, and `make release` refuses when one of them does not. The refusals are checked on a copy
of the files the version is written in; nothing is built (the image build is `make release`'s)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

import tputorch
from tputorch.api import crd

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("release", ROOT / "hack" / "release.py")
release = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(release)

VERSION_FILES = ["operator/tputorch/__init__.py", "pyproject.toml", "CHANGELOG.md", "hack/releases.tsv",
                 "charts/tputorch-operator/Chart.yaml", "charts/tputorch-operator/values.yaml"]


def test_the_versions_agree():
    assert release.check(ROOT) == []
    assert set(release.versions(ROOT).values()) == {tputorch.__version__, "tputorch.__version__"}


def test_the_changelog_has_this_version_with_its_sections():
    text = (ROOT / "CHANGELOG.md").read_text()
    (newest, _), *older = release.changelog_entries(ROOT)
    assert newest == tputorch.__version__
    for version, _ in [(newest, None), *older]:
        entry = text.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
        assert "### Upgrade" in entry and "### Tested with" in entry, version


def test_every_release_is_a_commit_in_the_changelog():
    rows = release.releases(ROOT)
    assert rows[0] == {"version": "0.2.0", "commit": "3c96148d1946f479cc733084e8a1147678c1b8a6", "date": "2026-12-07"}
    assert all(re.fullmatch(r"[0-9a-f]{40}", r["commit"]) for r in rows)
    assert tputorch.__version__ not in {r["version"] for r in rows} or \
        dict(release.changelog_entries(ROOT))[tputorch.__version__] != "Unreleased"


@pytest.fixture
def copy(tmp_path):
    for name in VERSION_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert release.check(tmp_path) == []
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


V = tputorch.__version__
DISAGREEMENTS = {
    "package": ("operator/tputorch/__init__.py", f'__version__ = "{V}"', '__version__ = "9.9.9"', "CHANGELOG.md newest entry"),
    "chart version": ("charts/tputorch-operator/Chart.yaml", f"\nversion: {V}", "\nversion: 9.9.9", "chart version"),
    "chart appVersion": ("charts/tputorch-operator/Chart.yaml", f'appVersion: "{V}"', 'appVersion: "9.9.9"', "chart appVersion"),
    "image tag": ("charts/tputorch-operator/values.yaml", 'tag: ""', 'tag: "9.9.9"', "image tag"),
    "changelog": ("CHANGELOG.md", f"## [{V}]", "## [9.9.9]", "CHANGELOG.md newest entry"),
    "static pyproject version": ("pyproject.toml", 'dynamic = ["version"]', 'version = "9.9.9"', "pyproject.toml"),
    "release date": ("hack/releases.tsv", "\t2026-12-07", "\t2026-12-08", "released 2026-12-08"),
}


@pytest.mark.parametrize("case", DISAGREEMENTS, ids=list(DISAGREEMENTS))
def test_a_disagreement_is_refused(copy, case, capsys):
    path, old, new, named = DISAGREEMENTS[case]
    _edit(copy / path, old, new)
    problems = release.check(copy)
    assert any(named in p for p in problems), problems
    # the build stops at the check: it returns 1 before building anything
    assert release.build(copy) == 1
    err = capsys.readouterr().err
    assert "refused" in err and named in err
    assert not (copy / "dist").exists()


def test_a_release_without_a_changelog_entry_is_refused(copy):
    _edit(copy / "hack" / "releases.tsv", "0.2.0\t", "0.1.9\t")
    assert any("0.1.9" in p and "no entry" in p for p in release.check(copy))


def test_the_crd_bundle_holds_every_crd(tmp_path):
    release.crd_bundle(ROOT, tmp_path / "crds.yaml")
    bundle = [d for d in yaml.safe_load_all((tmp_path / "crds.yaml").read_text()) if d]
    by_name = lambda c: c["metadata"]["name"]  # noqa: E731
    assert sorted(bundle, key=by_name) == sorted(crd.crd(), key=by_name)


def test_the_image_archive_is_retagged_with_the_version(tmp_path):
    """An OCI archive as buildah/skopeo write it; the copy names its image by the version alone and
    keeps every other file byte for byte."""
    blob = b'{"schemaVersion":2}'
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + "0" * 64, "size": len(blob),
             "annotations": {"org.opencontainers.image.ref.name": f"{V}-0123456789abcdef"}}]}
    src, out = tmp_path / "in.oci.tar", tmp_path / "out.oci.tar"
    with tarfile.open(src, "w") as t:
        for name, body in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", json.dumps(index).encode()),
                           ("blobs/sha256/" + "0" * 64, blob)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    release.retag_oci_archive(src, out, V)
    with tarfile.open(out) as t:
        got = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    assert json.loads(got["index.json"])["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": V}
    assert got["blobs/sha256/" + "0" * 64] == blob and got["oci-layout"] == b'{"imageLayoutVersion":"1.0.0"}'


def test_the_standin_base_is_told_apart():
    """By the name hack/image.sh gives the stand-in base (its BASE_STANDIN, the key filled in)."""
    (name,) = re.findall(r"^BASE_STANDIN=(\S+)\$BASE_KEY$", (ROOT / "hack" / "image.sh").read_text(), re.M)
    assert release.standin_used({"base": name + "0123456789abcdef"})
    assert not release.standin_used({"base": "docker.io/library/python:3.11.11-slim-bookworm@sha256:" + "a" * 64})
