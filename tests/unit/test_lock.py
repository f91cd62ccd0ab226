"""The operator image's dependencies are locked with hashes: every dependency of pyproject.toml is
pinned in requirements.lock with at least one sha256, and the Dockerfile installs with --require-hashes."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _locked() -> dict[str, list[str]]:
    text = (ROOT / "requirements.lock").read_text()
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
    return pins


def test_every_dependency_is_pinned_with_hashes():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = _locked()
    for dep in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock: run make lock"
    assert pins and all(pins.values()), [n for n, h in pins.items() if not h]


def test_the_image_installs_the_lock_with_require_hashes_and_the_wheel_without_deps():
    docker = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes --only-binary=:all: -r /requirements.lock" in docker
    assert "pip install --no-deps /wheels/*.whl" in docker
