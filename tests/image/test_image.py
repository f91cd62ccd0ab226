"""The image `make image` builds: what its config promises, what it holds, and its entrypoint run
from the unpacked archive as the image's user (the on-cluster part is tests/cluster/test_image.py)."""

from __future__ import annotations

import base64
import hashlib
import re
import ssl
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from imagetools import (DOCKER_ARCHIVE, OCI_ARCHIVE, REPO, image_bundle, image_info,  # noqa: F401 (fixtures)
                        layer_tar, read_oci_archive, run_in_image)

# The examples of our own kinds (examples/kueue/ also holds Kueue's objects, which validate refuses).
EXAMPLES = sorted(p for p in (REPO / "examples").rglob("*.yaml")
                  if all((d or {}).get("kind") in ("TPUTorchJob", "TPUTorchService")
                         for d in yaml.safe_load_all(p.read_text())))
SITE = "usr/local/lib/python3.11/site-packages"
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


@pytest.fixture(scope="module")
def oci(image_info):
    return read_oci_archive(OCI_ARCHIVE)


def test_config_user_entrypoint_and_default_command(oci, image_bundle):
    cfg = oci.config["config"]
    assert cfg["User"] == "65532:65532"
    assert cfg["Entrypoint"] == ["tputorch"]
    assert cfg["Cmd"] == ["run"]
    assert set(cfg["ExposedPorts"]) == {"8080/tcp", "9090/tcp"}
    # what a runtime derives from it (umoci's runtime config)
    assert image_bundle.process["user"]["uid"] == 65532 and image_bundle.process["user"]["gid"] == 65532
    assert image_bundle.process["args"] == ["tputorch", "run"]


def test_layers_are_the_base_plus_the_operator(oci, image_info):
    diff_ids = oci.config["rootfs"]["diff_ids"]
    base = image_info["base_diff_ids"]
    assert diff_ids[:len(base)] == base, "the image's first layers are not its base's"
    assert len(diff_ids) > len(base)
    assert len(oci.layers) == len(diff_ids)


def test_docker_archive_names_the_image(image_info):
    import tarfile
    with tarfile.open(DOCKER_ARCHIVE) as tar:
        manifest = yaml.safe_load(tar.extractfile("manifest.json").read())
    # what `docker load` then names it ("docker.io/library/x:t" is docker's spelling of "x:t")
    assert [m["RepoTags"] for m in manifest] in ([[image_info["name"]]], [[f"docker.io/library/{image_info['name']}"]])
    assert image_info["name"] == f"{image_info['repository']}:{image_info['tag']}"


def _installed(root: Path) -> dict[str, metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(root / SITE)])}


def test_no_build_tooling_left(image_bundle):
    root = image_bundle.root
    installed = _installed(root)
    assert not {"pip", "setuptools", "wheel"} & set(installed), sorted(installed)
    for path in ("usr/local/bin/pip", "usr/local/bin/pip3", f"{SITE}/pip", f"{SITE}/setuptools", "wheels", "src"):
        assert not (root / path).exists(), path


def test_only_the_operators_dependencies(image_bundle):
    """Every installed distribution is tputorch-operator or in the closure of its requirements."""
    installed = _installed(image_bundle.root)
    env = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    needed, todo = set(), [("tputorch-operator", frozenset())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        assert key in installed, f"{name} is required but not installed"
        needed.add(key)
        for line in installed[key].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
                if canonicalize_name(req.name) not in needed:
                    todo.append((req.name, frozenset(req.extras)))
    assert set(installed) == needed, f"not needed by the operator: {sorted(set(installed) - needed)}"
    assert {"kopf", "kubernetes", "pyyaml", "jinja2"} <= needed


def _certificates(layers: list[bytes]) -> dict[str, set[str]]:
    """sha256 of each PEM certificate found in any file of these layers -> the paths holding it."""
    found: dict[str, set[str]] = {}
    for blob in layers:
        with layer_tar(blob) as tar:
            for member in tar:
                if member.isfile():
                    for pem in PEM.findall(tar.extractfile(member).read()):
                        der = ssl.PEM_cert_to_DER_cert(pem.decode())
                        found.setdefault(hashlib.sha256(der).hexdigest(), set()).add(member.name)
    return found


def _packaged_files(root: Path) -> dict[str, str]:
    """path in the image -> sha256 (urlsafe base64, as RECORD has it) of every file a wheel installed."""
    files = {}
    for dist in metadata.distributions(path=[str(root / SITE)]):
        for f in dist.files or []:
            if f.hash:
                files[str(Path(SITE) / f).replace("/./", "/")] = f.hash.value
    return files


def test_no_certificate_from_the_build_host(oci, image_info, image_bundle):
    """The CA bundle given to the build as a secret is nowhere in the image (in no layer, not even
    deleted later); a certificate the base did not hold comes only from a wheel, unchanged."""
    n = len(image_info["base_diff_ids"])
    base = _certificates(oci.layers[:n])
    added = _certificates(oci.layers[n:])
    packaged = _packaged_files(image_bundle.root)
    for digest, paths in added.items():
        if digest in base:
            continue
        for path in paths:
            data = (image_bundle.root / path).read_bytes()
            record = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert packaged.get(path) == record, f"{path} holds a certificate the base did not, and no wheel installed it"
    if image_info["ca_bundle"]:
        host = {hashlib.sha256(ssl.PEM_cert_to_DER_cert(p.decode())).hexdigest()
                for p in PEM.findall(Path(image_info["ca_bundle"]).read_bytes())}
        host_only = host - set(base)
        leaked = {d: added[d] for d in host_only & set(added)}
        assert not leaked, f"the build host's certificates are in the image: {leaked}"


def test_help_runs_as_the_image_user_on_a_read_only_root(image_bundle):
    out = run_in_image(image_bundle, ["tputorch", "--help"])
    assert out.returncode == 0, out.stderr
    assert "run the operator" in out.stdout
    who = run_in_image(image_bundle, ["python", "-c", "import os; print(os.getuid(), os.getgid()); open('/x', 'w')"])
    assert who.stdout.split() == ["65532", "65532"], who.stdout + who.stderr
    assert "Read-only file system" in who.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(REPO / "examples")))
def test_validate_examples_in_the_image(image_bundle, example):
    inside = f"/tmp/examples/{example.name}"
    out = run_in_image(image_bundle, ["tputorch", "validate", inside], files={inside: example})
    assert out.returncode == 0, out.stderr
    source = subprocess.run([sys.executable, "-m", "tputorch", "validate", str(example)],
                            capture_output=True, text=True, cwd=REPO / "operator")
    assert out.stdout == source.stdout and ": valid" in out.stdout


def test_validate_refuses_a_bad_job_in_the_image(image_bundle, tmp_path):
    body = yaml.safe_load((REPO / "examples" / "v6e-4x4.yaml").read_text())
    body["spec"]["tpu"]["topology"] = "3x3"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(body))
    bad.chmod(0o644)
    out = run_in_image(image_bundle, ["tputorch", "validate", "/tmp/bad.yaml"], files={"/tmp/bad.yaml": bad})
    assert out.returncode == 1
    assert "topology" in out.stderr and "3x3" in out.stderr, out.stderr
