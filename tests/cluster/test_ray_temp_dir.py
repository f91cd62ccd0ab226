"""The real Ray head's temp dir keeps Ray's Unix socket paths within the kernel's limit.

make test gives each half a temp root of its own (hack/test.sh); under one, the head's dashboard
sockets once ran one byte over and every real-Ray test errored at setup (CI, stop 48)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import ray.dashboard.utils as dashboard_utils
from ray.dashboard.subprocesses.module import SubprocessModule

from ray_backend import RAY_SOCKET_TAIL, UNIX_SOCKET_PATH_MAX, ray_temp_dir

# What Ray 2.60 makes under a head's temp dir, with the longest session name (7-digit pid).
SESSION = "session_2026-12-05_19-45-13_160239_4194304"


def longest_socket_path(temp_dir: str) -> str:
    module = max((m.__name__ for m in dashboard_utils.get_all_modules(SubprocessModule)), key=len)
    return os.path.join(temp_dir, SESSION, "sockets", "dash_" + module)


def test_the_tail_budget_covers_every_dashboard_module_of_this_ray():
    assert len(longest_socket_path("")) <= RAY_SOCKET_TAIL


@pytest.mark.parametrize("below, stays", [
    ("", True),                    # a short temp root (/tmp/ttrXXXXXXXX): the head's dir goes under it
    ("cluster", False),            # as deep as make test's half roots: the sockets would not fit
    ("cluster/" + "d" * 40, False),
])
def test_the_head_dir_is_under_the_temp_root_when_its_sockets_fit_else_under_tmp(monkeypatch, below, stays):
    base = Path(tempfile.mkdtemp(prefix="ttr", dir="/tmp"))
    root = base / below
    root.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    made = ray_temp_dir()
    try:
        assert Path(made).parent == (root if stays else Path("/tmp"))
        assert len(longest_socket_path(made).encode()) <= UNIX_SOCKET_PATH_MAX
        assert os.listdir(made) == []
    finally:  # the head's dir too when it went to /tmp, outside `base`
        shutil.rmtree(made, ignore_errors=True)
        for d in sorted(base.rglob("*"), reverse=True):
            d.rmdir()
        base.rmdir()
