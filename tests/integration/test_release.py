"""The release's one version (hack/release.py): the package, the chart, the image tag and CHANGELOG.md
agree, and `make release` refuses when one of them does not. The refusals are checked on a copy
of the files the version is written in; nothing is built (the image build is `make release`'s)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

import tputorch
from tputorch.api import crd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import doccmds  # noqa: E402  (finds helm as the chart tests do)

_spec = importlib.util.spec_from_file_location("release", ROOT / "hack" / "release.py")
release = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(release)

VERSION_FILES = ["operator/tputorch/__init__.py", "pyproject.toml", "CHANGELOG.md", "hack/releases.tsv",
                 "charts/tputorch-operator/Chart.yaml", "charts/tputorch-operator/values.yaml",
                 "crds/tputorch.io_tputorchjobs.yaml", "crds/tputorch.io_tputorchservices.yaml"]


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
    "crd release": ("crds/tputorch.io_tputorchservices.yaml", f"tputorch.io/release: {V}", "tputorch.io/release: 9.9.9",
                    "crds/tputorch.io_tputorchservices.yaml"),
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


LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
BLOB = b'{"schemaVersion":2}'


def oci_archive(path: Path, ref: str) -> None:
    """An OCI archive as buildah and skopeo write one: its index names the one image `ref`."""
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + "0" * 64, "size": len(BLOB),
             "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    with tarfile.open(path, "w") as t:
        for name, body in (("oci-layout", LAYOUT), ("index.json", json.dumps(index).encode()),
                           ("blobs/sha256/" + "0" * 64, BLOB)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))


def archive_files(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def test_the_image_archive_is_retagged_with_the_version(tmp_path):
    """The copy names its image by the version alone and keeps every other file byte for byte."""
    src, out = tmp_path / "in.oci.tar", tmp_path / "out.oci.tar"
    oci_archive(src, f"{V}-0123456789abcdef")
    release.retag_oci_archive(src, out, V)
    got = archive_files(out)
    assert json.loads(got["index.json"])["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": V}
    assert got["blobs/sha256/" + "0" * 64] == BLOB and got["oci-layout"] == LAYOUT


def _standin_name() -> str:
    """The stand-in base's name as hack/image.sh gives it (its BASE_STANDIN, a key filled in)."""
    (name,) = re.findall(r"^BASE_STANDIN=(\S+)\$BASE_KEY$", (ROOT / "hack" / "image.sh").read_text(), re.M)
    return name + "0123456789abcdef"


REAL_BASE = "docker.io/library/python:3.11.11-slim-bookworm@sha256:" + "a" * 64


@pytest.mark.parametrize("base", ["stand-in", "real"])
def test_make_release_writes_the_five_artifacts(tmp_path, monkeypatch, capsys, base):
    """`hack/release.py build` on a copy of the sources, hack/image.sh replaced by one that hands over
    a ready archive and image.json (building the image is make image's, tested by tests/image): the
    chart, the image, the CRD bundle, the wheel and the sdist, each named by the version, and a note
    that says plainly when the image stands on the stand-in base."""
    helm = doccmds.find_helm()
    assert helm, "no helm binary: make test builds it (hack/build.sh helm), or set $HELM"
    monkeypatch.setenv("HELM", helm)
    root = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", *VERSION_FILES, "hack/release.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    for folder in ("operator", "charts", "crds"):
        shutil.copytree(ROOT / folder, root / folder, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    built = tmp_path / "built"
    built.mkdir()
    oci_archive(built / "tputorch-operator.oci.tar", f"{V}-0123456789abcdef")
    base_ref = _standin_name() if base == "stand-in" else REAL_BASE
    (built / "image.json").write_text(json.dumps({"base": base_ref, "builder": "buildah"}))
    image_sh = root / "hack" / "image.sh"
    image_sh.write_text(f"#!/bin/sh\nset -e\n[ \"$1\" = build ]\nmkdir -p dist\ncp {built}/* dist/\n")
    image_sh.chmod(0o755)

    assert release.build(root) == 0
    err = capsys.readouterr().err
    dist = root / "dist"
    artifacts = {f"tputorch-operator-{V}.tgz", f"tputorch-operator-{V}.oci.tar", f"tputorch-crds-{V}.yaml",
                 f"tputorch_operator-{V}-py3-none-any.whl", f"tputorch_operator-{V}.tar.gz"}
    assert {p.name for p in dist.iterdir()} == artifacts | {f"RELEASE-{V}.md", "tputorch-operator.oci.tar", "image.json"}
    with tarfile.open(dist / f"tputorch-operator-{V}.tgz") as t:
        chart = yaml.safe_load(t.extractfile("tputorch-operator/Chart.yaml"))
    assert (chart["version"], chart["appVersion"]) == (V, V)
    index = json.loads(archive_files(dist / f"tputorch-operator-{V}.oci.tar")["index.json"])
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == V
    note = (dist / f"RELEASE-{V}.md").read_text()
    for name in artifacts:
        assert f"| {name} | {hashlib.sha256((dist / name).read_bytes()).hexdigest()} |" in note
    if base == "stand-in":
        assert f"STAND-IN BASE: {base_ref}" in note and "Not an image to publish" in note
        assert f"STAND-IN BASE: {base_ref}" in err
    else:
        assert f"base image: {REAL_BASE}" in note and "STAND-IN" not in note + err


def test_the_standin_base_is_told_apart():
    assert release.standin_used({"base": _standin_name()})
    assert not release.standin_used({"base": "docker.io/library/python:3.11.11-slim-bookworm@sha256:" + "a" * 64})
