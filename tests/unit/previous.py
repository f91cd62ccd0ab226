"""The previous release (hack/releases.tsv's newest before this checkout's version) for the unit
tests that hold this version to it: its commit, its files. A clone without that commit fails
them, naming how to fetch it: the checks must run, a CI clone has the history."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

import tputorch

ROOT = Path(__file__).resolve().parents[2]


def _release():
    spec = importlib.util.spec_from_file_location("release", ROOT / "hack" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _release()


def previous() -> tuple[str, str]:
    """(version, commit) of the release before this checkout's version; the test fails when the
    commit is not in this clone."""
    row = release.previous_release(ROOT, tputorch.__version__)
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{row['commit']}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        pytest.fail(f"release {row['version']}'s commit {row['commit']} (hack/releases.tsv) is not in this clone, and "
                    f"this test reads it: fetch the history (`git fetch --unshallow`; in CI a checkout with "
                    f"fetch-depth 0)")
    return row["version"], row["commit"]


def show(path: str) -> str:
    """A file of the previous release."""
    _, commit = previous()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout
