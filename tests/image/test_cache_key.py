"""hack/image.sh's cache key: a new image exactly when the Dockerfile, pyproject.toml, operator/
(or the build script and base) change; docs, tests and Python caches leave it as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path):
    """A copy of what the key reads, plus files it must ignore."""
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "requirements.lock", "README.md", "hack/image.sh",
                 "hack/base-image.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "operator", tmp_path / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (tmp_path / "tests").mkdir()
    return tmp_path


def key(tree: Path, **env) -> str:
    out = subprocess.run([str(tree / "hack" / "image.sh"), "key"], capture_output=True, text=True, timeout=60,
                         env={**{k: v for k, v in os.environ.items() if k != "BASE_IMAGE"}, "BUILDER": "buildah", **env})
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) == 16
    return out.stdout.strip()


def test_key_ignores_docs_tests_and_caches(tree):
    before = key(tree)
    (tree / "README.md").write_text("changed")
    (tree / "tests" / "test_x.py").write_text("x = 1\n")
    (tree / "operator" / "tputorch" / "__pycache__").mkdir()
    (tree / "operator" / "tputorch" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    assert key(tree) == before


@pytest.mark.parametrize("path", ["Dockerfile", "pyproject.toml", "requirements.lock", "operator/tputorch/cli/main.py", "hack/image.sh",
                                  "hack/base-image.sh", "operator/tputorch/new_module.py"])
def test_key_changes_with_what_goes_into_the_image(tree, path):
    before = key(tree)
    target = tree / path
    with open(target, "a") as f:
        f.write("\n# changed\n")
    assert key(tree) != before


def test_key_changes_with_the_base_image(tree):
    assert key(tree) != key(tree, BASE_IMAGE="docker.io/library/python:3.11.11-slim-bookworm")
