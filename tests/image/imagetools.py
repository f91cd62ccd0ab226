"""The operator image as built by `make image`: its archive read, unpacked and run as a runtime would.

Unpacking uses umoci (Debian's package; `hack/image.sh tools` installs it): the OCI project's own
tool applies the layers in order with whiteouts and opaque directories, and writes the runtime
config (process args, env, uid/gid) derived from the image config, so the tests run exactly what
a container runtime would start. The process then runs in a chroot of that rootfs as the image's
user, in its own mount and PID namespaces, with the root filesystem read-only and a tmpfs on /tmp
as the chart's Deployment has them. The network is the host's: the API server is on 127.0.0.1.

Fixtures (session): image_info (dist/image.json after `hack/image.sh build`, which reuses the
cache), image_bundle (the unpacked bundle). Test modules import them by name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"
OCI_ARCHIVE = DIST / "tputorch-operator.oci.tar"
DOCKER_ARCHIVE = DIST / "tputorch-operator.docker.tar"


def build_image() -> dict:
    """`hack/image.sh build` (a cache hit takes seconds) and the image.json it writes."""
    proc = subprocess.run([str(REPO / "hack" / "image.sh"), "build"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"hack/image.sh build failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return json.loads((DIST / "image.json").read_text())


# --- the OCI archive, read without unpacking ------------------------------------------------


@dataclass
class OciImage:
    manifest: dict
    config: dict
    layers: list[bytes]  # the layer blobs (tar, maybe gzip'd), in order


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    algo, hexd = digest.split(":", 1)
    data = tar.extractfile(f"blobs/{algo}/{hexd}").read()
    assert hashlib.new(algo, data).hexdigest() == hexd, f"blob {digest} does not match its digest"
    return data


def read_oci_archive(path: Path) -> OciImage:
    with tarfile.open(path) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        assert len(index["manifests"]) == 1, index
        manifest = json.loads(_blob(tar, index["manifests"][0]["digest"]))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        layers = [_blob(tar, layer["digest"]) for layer in manifest["layers"]]
    return OciImage(manifest, config, layers)


def layer_tar(blob: bytes) -> tarfile.TarFile:
    raw = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    return tarfile.open(fileobj=io.BytesIO(raw))


# --- unpack and run -------------------------------------------------------------------------


@dataclass
class Bundle:
    root: Path      # the rootfs
    process: dict   # the runtime config's process: args, env, user, cwd


def unpack(archive: Path, tag: str, dest: Path) -> Bundle:
    layout, bundle = dest / "layout", dest / "bundle"
    layout.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True,
                   capture_output=True, timeout=300)
    shutil.rmtree(layout)
    config = json.loads((bundle / "config.json").read_text())
    return Bundle(bundle / "rootfs", config["process"])


def _refuse_symlinks(root: Path, inside: str) -> None:
    """mkdir/touch on the host side of a path in the image must not follow the image's symlinks
    (e.g. /var/run -> /run, absolute: it would lead out of the rootfs)."""
    path = root
    for part in Path(inside).parts[1:]:
        path = path / part
        assert not path.is_symlink(), f"{inside}: {path} is a symlink in the image; mount at its target instead"


def chroot_command(bundle: Bundle, args: list[str], files: dict[str, Path] | None = None,
                   env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs args in the image as its user. files: in-image path -> host file,
    bind-mounted read-only (the parent directory must exist in the image or be under /tmp)."""
    root = shlex.quote(str(bundle.root))
    user = bundle.process["user"]
    script = [
        "set -e",
        f"mount --bind {root} {root}",
        f"mount -t proc proc {root}/proc",
        f"mount -t tmpfs -o size=64m,mode=1777 tmpfs {root}/tmp",
        f"mount -t tmpfs -o mode=755 tmpfs {root}/dev",
    ]
    for dev in ("null", "zero", "random", "urandom"):
        script += [f"touch {root}/dev/{dev}", f"mount --bind /dev/{dev} {root}/dev/{dev}"]
    for inside, host in (files or {}).items():
        _refuse_symlinks(bundle.root, inside)
        target = f"{root}{shlex.quote(inside)}"
        script += [f"mkdir -p $(dirname {target})", f"touch {target}",
                   f"mount --bind {shlex.quote(str(host))} {target}", f"mount -o remount,bind,ro {target}"]
    script.append(f"mount -o remount,bind,ro {root}")  # readOnlyRootFilesystem, as in the chart
    environment = [*bundle.process.get("env", []), *(f"{k}={v}" for k, v in (env or {}).items())]
    # chroot starts in /: the image's WORKDIR through env's --chdir (coreutils in the image)
    cwd = bundle.process.get("cwd", "/")
    script.append(" ".join(["exec", "chroot", f"--userspec={user['uid']}:{user['gid']}", root,
                            "env", "-i", *([f"--chdir={shlex.quote(cwd)}"] if cwd != "/" else []),
                            *map(shlex.quote, environment), *map(shlex.quote, args)]))
    return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
            "sh", "-c", "\n".join(script)]


def run_in_image(bundle: Bundle, args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(chroot_command(bundle, args, **kw), capture_output=True, text=True, timeout=timeout)


def popen_in_image(bundle: Bundle, args: list[str], log: Path, **kw) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(chroot_command(bundle, args, **kw), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# --- fixtures -------------------------------------------------------------------------------


# Each test module that imports a fixture gets its own definition of it; these keep one build
# check and one unpack per session all the same.
_session: dict = {}


def require_root() -> None:
    """The image tests unpack an image's layers (umoci, keeping owners) and run commands in it with
    chroot: both need root. CI runs as root here; elsewhere they skip, and CI counts a skip as a failure."""
    if os.geteuid() != 0:
        pytest.skip("the image tests unpack and chroot as root")


@pytest.fixture(scope="session")
def image_info() -> dict:
    require_root()
    if "info" not in _session:
        _session["info"] = build_image()
    return _session["info"]


@pytest.fixture(scope="session")
def image_bundle(image_info, tmp_path_factory) -> Bundle:
    if "bundle" not in _session:
        _session["bundle"] = unpack(OCI_ARCHIVE, image_info["tag"], tmp_path_factory.mktemp("image"))
    return _session["bundle"]
