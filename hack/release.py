#!/usr/bin/env python3
"""`make release`: the release's five artifacts in dist/, or a refusal when its versions disagree.

    hack/release.py check    the versions agree (exit 0) or say where they do not (exit 1)
    hack/release.py build    check, then write into dist/:
        tputorch-operator-<v>.tgz            the chart (`helm package`)
        tputorch-operator-<v>.oci.tar        the operator image as an OCI archive, tagged <v>
        tputorch-crds-<v>.yaml               the CRDs, one file for `kubectl apply --server-side -f`
        tputorch_operator-<v>-py3-none-any.whl, tputorch_operator-<v>.tar.gz   the CLI's wheel and sdist
        RELEASE-<v>.md                       what was built from what (the base image), and the files' sha256

The version is tputorch.__version__ (operator/tputorch/__init__.py); the chart's version and
appVersion, the image tag the chart pulls (values.yaml image.tag, empty for appVersion) and
CHANGELOG.md's newest entry must all be that version, so what a platform team pins in one place
is what it gets in the others.

Environment: BASE_IMAGE, the image the operator's stands on (the Dockerfile's PYTHON_IMAGE), passed
to hack/image.sh. Without a docker daemon and without BASE_IMAGE, hack/image.sh builds on the local
stand-in of python:3.11-slim-bookworm (hack/base-image.sh): an image to test with, not to publish,
and the output and RELEASE-<v>.md say so. HELM: the helm binary (default: hack/build.sh's).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAME = "tputorch-operator"
CHART = Path("charts") / NAME
# An entry's heading: "## [0.3.0] - 2026-12-07", or "- Unreleased" until the lead dates and tags it.
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}|Unreleased))?\s*$", re.M)
# hack/base-image.sh's stand-in, as hack/image.sh names it (BASE_STANDIN)
STANDIN_PREFIX = "localhost/tputorch-base:"
CRD_RELEASE_ANNOTATION = "tputorch.io/release"  # api/crd.py's RELEASE_ANNOTATION (this script imports no tputorch)


class Refused(Exception):
    """The release cannot be built as asked; the message says why."""


def package_version(root: Path) -> str:
    text = (root / "operator" / "tputorch" / "__init__.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if not found:
        raise Refused("operator/tputorch/__init__.py sets no __version__")
    return found.group(1)


def changelog_entries(root: Path) -> list[tuple[str, str | None]]:
    """(version, date or 'Unreleased' or None) of every CHANGELOG.md entry, newest first ([Unreleased] left out)."""
    path = root / "CHANGELOG.md"
    if not path.exists():
        return []
    return [(m["version"], m["date"]) for m in HEADING.finditer(path.read_text()) if m["version"] != "Unreleased"]


def releases(root: Path) -> list[dict]:
    """hack/releases.tsv's rows (version, commit, date), oldest first."""
    lines = [ln for ln in (root / "hack" / "releases.tsv").read_text().splitlines() if ln and not ln.startswith("#")]
    header, *rows = (ln.split("\t") for ln in lines)
    return [dict(zip(header, row)) for row in rows]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def previous_release(root: Path, version: str) -> dict:
    """hack/releases.tsv's newest release older than ``version`` (what an upgrade to it starts from)."""
    older = [r for r in releases(root) if version_key(r["version"]) < version_key(version)]
    if not older:
        raise Refused(f"hack/releases.tsv lists no release before {version}")
    return older[-1]


# In an entry's "### Upgrade": a child's field, in backquotes, whose rendering the release changes
# from the previous one's, e.g. `RayService rayClusterConfig.workerGroupSpecs[].template.spec.volumes`
# (list items as [], a path covering every field under it). tests/unit/render/test_upgrade_diff.py
# holds the list to what the two releases render: every field of KubeRay's cluster hash (a
# RayService's rayClusterConfig, a RayJob's rayClusterSpec) and of a RayService's serveConfigV2
# that changes is listed, and each listed path changes.
UPGRADE_FIELD = re.compile(r"`((?:RayService|RayJob) [A-Za-z][^`\s]*)`")


def upgrade_fields(root: Path, version: str) -> list[str]:
    """The child fields CHANGELOG.md's entry for ``version`` lists under "### Upgrade"."""
    text = (root / "CHANGELOG.md").read_text()
    heading = next((m for m in HEADING.finditer(text) if m["version"] == version), None)
    if heading is None:
        raise Refused(f"CHANGELOG.md has no entry for {version}")
    entry = text[heading.end():]
    following = HEADING.search(entry)
    entry = entry[:following.start()] if following else entry
    upgrade = re.search(r"^### Upgrade\s*$(?P<body>.*?)(?=^### |\Z)", entry, re.M | re.S)
    return UPGRADE_FIELD.findall(upgrade["body"]) if upgrade else []


def versions(root: Path) -> dict[str, str | None]:
    """Where the release's version is written -> what it says there."""
    chart = yaml.safe_load((root / CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((root / CHART / "values.yaml").read_text())
    entries = changelog_entries(root)
    pyproject = (root / "pyproject.toml").read_text()
    static = re.search(r'^version = "([^"]+)"$', pyproject, re.M)
    return {
        "package (operator/tputorch/__init__.py)": package_version(root),
        # a static version in pyproject.toml would be a second place; it must read the package's
        "pyproject.toml": static.group(1) if static else (
            "tputorch.__version__" if re.search(r'^version = \{ *attr = "tputorch.__version__" *\}', pyproject, re.M)
            else None),
        "chart version": str(chart.get("version")),
        "chart appVersion": str(chart.get("appVersion")),
        "image tag (values.yaml image.tag, empty: appVersion)": str((values.get("image") or {}).get("tag") or chart.get("appVersion")),
        "CHANGELOG.md newest entry": entries[0][0] if entries else None,
        **{f"crds/{path.name} ({CRD_RELEASE_ANNOTATION})": str(((yaml.safe_load(path.read_text()).get("metadata") or {})
                                                               .get("annotations") or {}).get(CRD_RELEASE_ANNOTATION))
           for path in sorted((root / "crds").glob("tputorch.io_*.yaml"))},
    }


def check(root: Path) -> list[str]:
    """What disagrees with the package's version (empty: the release may be built)."""
    version = package_version(root)
    problems = []
    for where, found in versions(root).items():
        if where == "pyproject.toml":
            if found != "tputorch.__version__":
                problems.append(f"pyproject.toml: version must be dynamic, read from tputorch.__version__ "
                                f"([tool.setuptools.dynamic] version = {{ attr = \"tputorch.__version__\" }}); found {found!r}")
        elif found != version:
            problems.append(f"{where}: {found!r}, not the package's {version!r}")
    entries = changelog_entries(root)
    listed = dict(entries)
    for row in releases(root):
        if row["version"] not in listed:
            problems.append(f"hack/releases.tsv lists {row['version']} (commit {row['commit'][:12]}), CHANGELOG.md has no entry for it")
        elif listed[row["version"]] != row["date"]:
            problems.append(f"{row['version']}: released {row['date']} in hack/releases.tsv, {listed[row['version']]} in CHANGELOG.md")
    if len({v for v, _ in entries}) != len(entries):
        problems.append("CHANGELOG.md has two entries of one version")
    return problems


def say(text: str) -> None:
    print(f"[release] {text}", file=sys.stderr, flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def helm_binary(root: Path) -> str:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    run([root / "hack" / "build.sh", "helm"])   # built once into the cache, reused after
    bin_dir = run([root / "hack" / "build.sh", "dir"], capture_output=True, text=True).stdout.strip()
    return str(Path(bin_dir) / "helm")


def package_chart(root: Path, dist: Path, helm: str | None = None) -> Path:
    """`helm package` of the chart into ``dist``: the release's chart, as the cluster test installs it."""
    version = package_version(root)
    run([helm or helm_binary(root), "package", root / CHART, "--destination", dist], stdout=subprocess.DEVNULL)
    packaged = dist / f"{NAME}-{version}.tgz"
    if not packaged.is_file():
        raise Refused(f"helm package wrote no {packaged.name}: the chart's version is not {version}")
    return packaged


def crd_bundle(root: Path, out: Path) -> None:
    """crds/*.yaml as one multi-document file, in the order `tputorch crd` prints them."""
    docs = [p.read_text() for p in sorted((root / "crds").glob("*.yaml"))]
    out.write_text("---\n".join(d if d.endswith("\n") else d + "\n" for d in docs))


def python_dists(root: Path, dist: Path, version: str) -> list[Path]:
    """The sdist from a copy of what the package is made of, then the wheel from the sdist (so a file
    the sdist lacks breaks the wheel here, not on a user's machine). setuptools' own PEP 517 hooks: no
    `build` package, no index."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(root / name, src)
        shutil.copytree(root / "operator", src / "operator",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        hook = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
        sdist = run([sys.executable, "-c", hook, "build_sdist", dist], cwd=src, capture_output=True, text=True)
        sdist_path = dist / sdist.stdout.strip().splitlines()[-1]
        with tarfile.open(sdist_path) as t:
            t.extractall(Path(tmp) / "sdist", filter="data")
        (unpacked,) = (Path(tmp) / "sdist").iterdir()
        wheel = run([sys.executable, "-c", hook, "build_wheel", dist], cwd=unpacked, capture_output=True, text=True)
        wheel_path = dist / wheel.stdout.strip().splitlines()[-1]
    for p in (sdist_path, wheel_path):
        if f"-{version}" not in p.name:
            raise Refused(f"{p.name}: built without the version {version}")
    return [wheel_path, sdist_path]


def retag_oci_archive(src: Path, out: Path, tag: str) -> None:
    """A copy of an OCI archive whose one image is named by `tag` (index.json's ref.name annotation):
    hack/image.sh tags its cached builds <version>-<cache key>, a release is pulled as <version>."""
    with tarfile.open(src) as t_in, tarfile.open(out, "w") as t_out:
        for member in t_in.getmembers():
            data = t_in.extractfile(member) if member.isfile() else None
            if member.name.lstrip("./") == "index.json":
                index = json.load(data)
                (manifest,) = index["manifests"]
                manifest.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = tag
                body = json.dumps(index, separators=(",", ":")).encode()
                member.size = len(body)
                data = io.BytesIO(body)
            t_out.addfile(member, data)


def image(root: Path, dist: Path, version: str) -> tuple[Path, dict]:
    run([root / "hack" / "image.sh", "build"], cwd=root)
    info = json.loads((root / "dist" / "image.json").read_text())
    out = dist / f"{NAME}-{version}.oci.tar"
    retag_oci_archive(root / "dist" / f"{NAME}.oci.tar", out, version)
    return out, info


def source(root: Path) -> str:
    """The commit the release was built from, and whether the tree differed from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        return "a tree that is no git checkout"
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes" if dirty else "")


def standin_used(info: dict) -> bool:
    return info["base"].startswith(STANDIN_PREFIX)


def build(root: Path) -> int:
    problems = check(root)
    if problems:
        say("refused: the release's versions disagree:")
        for p in problems:
            say(f"  {p}")
        return 1
    version = package_version(root)
    date = dict(changelog_entries(root))[version]
    dist = root / "dist"
    dist.mkdir(exist_ok=True)
    for old in dist.glob(f"*{version}*"):
        old.unlink()
    artifacts = []
    say(f"{NAME} {version}: the chart")
    artifacts.append(package_chart(root, dist))
    crds = dist / f"tputorch-crds-{version}.yaml"
    crd_bundle(root, crds)
    artifacts.append(crds)
    say("the wheel and the sdist")
    artifacts += python_dists(root, dist, version)
    say(f"the image (BASE_IMAGE={os.environ.get('BASE_IMAGE') or 'unset'})")
    oci, info = image(root, dist, version)
    artifacts.append(oci)
    standin = standin_used(info)
    base_line = (f"STAND-IN BASE: {info['base']} (hack/base-image.sh, built here). Not an image to publish: "
                 "its digest is of a local Debian stand-in, not of the official Python image; rebuild with "
                 "BASE_IMAGE=<the real base>@sha256:<digest>" if standin else f"base image: {info['base']}")
    lines = [f"# {NAME} {version}", "", f"CHANGELOG.md: {version} ({date}). Built from {source(root)}.", "", base_line, f"image builder: {info['builder']}", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| {a.name} | {sha256(a)} |" for a in artifacts]
    note = dist / f"RELEASE-{version}.md"
    note.write_text("\n".join(lines) + "\n")
    for a in artifacts:
        say(f"  {a.relative_to(root)}")
    say(f"  {note.relative_to(root)}")
    if date == "Unreleased":
        say(f"CHANGELOG.md's {version} is not dated yet (Unreleased): date it and add it to hack/releases.tsv when tagging")
    if standin:
        say(base_line)
    return 0


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else "build"
    try:
        if what == "check":
            problems = check(ROOT)
            for p in problems:
                say(p)
            if not problems:
                say(f"versions agree: {package_version(ROOT)}")
            return 1 if problems else 0
        if what == "build":
            return build(ROOT)
    except Refused as e:
        say(f"refused: {e}")
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
