"""Every image the docs tell a reader to build besides the operator's (test_image.py has that one):
each `docker build` of the docs is built by `hack/image.sh example` with buildah on the stand-in of
Ray's image (no registry here), with the real build context and its .dockerignore. Every step runs
but the RUNs marked `# not run by make test:`, which only download packages. Then the image is
unpacked and run as its user, as a runtime would start it: what the docs say is in it is there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from imagetools import REPO, require_root, run_in_image, unpack

sys.path.insert(0, str(REPO / "hack"))
import standin_dockerfile  # noqa: E402

DIST = REPO / "dist"
# Every page a reader follows (task pages live under docs/tasks/); the generated reference builds nothing.
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.relative_to(REPO / "docs").parts)]


def docs_builds() -> dict[str, tuple[str, str]]:
    """(Dockerfile, context) of every `docker build` in the docs, by the image variable it tags."""
    found = {}
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            if line.startswith("docker build "):
                words = shlex.split(line)
                tag = words[words.index("-t") + 1].split(":")[0].lstrip("$")
                context = words[-1]
                dockerfile = words[words.index("-f") + 1] if "-f" in words else f"{context}/Dockerfile"
                found[tag] = (os.path.normpath(dockerfile), os.path.normpath(context))
    return found


BUILDS = docs_builds()
EXAMPLES = {tag: b for tag, b in BUILDS.items() if b[0] != "Dockerfile"}  # the operator's: test_image.py


def test_the_docs_build_every_example_image():
    assert BUILDS.get("IMAGE") == ("Dockerfile", "."), BUILDS
    dockerfiles = {str(p.relative_to(REPO)) for p in (REPO / "examples").rglob("Dockerfile")}
    assert {d for d, _ in EXAMPLES.values()} == dockerfiles, "a Dockerfile under examples/ no doc builds, or the reverse"


def _build(dockerfile: str, context: str) -> dict:
    name = "tputorch-" + Path(dockerfile).parent.as_posix().replace("/", "-")
    proc = subprocess.run([str(REPO / "hack" / "image.sh"), "example", dockerfile, context, name], cwd=REPO,
                          capture_output=True, text=True, timeout=1800, env={**os.environ, "BUILDER": "buildah"})
    assert proc.returncode == 0, f"{dockerfile} does not build from {context}:\n{proc.stderr[-5000:]}"
    info = json.loads((DIST / f"{name}.json").read_text())
    info["archive"] = DIST / f"{name}.oci.tar"
    return info


def _copies_examples(dockerfile: str) -> bool:
    return "examples" in standin_dockerfile.copy_sources((REPO / dockerfile).read_text())


def _gcs_pins(dockerfile: str) -> dict[str, str]:
    """The versions the Dockerfile's GCS-client RUN pins ({} when it has none)."""
    line = next((ln for ln in (REPO / dockerfile).read_text().splitlines() if ln.startswith("RUN") and "smart_open" in ln), "")
    return dict(re.findall(r"([A-Za-z][\w\-]*)(?:\[\w+\])?==([\d.]+)", line))


ALL = sorted(d for d, _ in EXAMPLES.values())
WITH_EXAMPLES = [d for d in ALL if _copies_examples(d)]
WITH_GCS = [d for d in ALL if _gcs_pins(d)]
_built: dict = {}
_unpacked: dict = {}


def built(dockerfile: str) -> dict:
    """The example image's build record, built once per session."""
    require_root()
    if dockerfile not in _built:
        _built[dockerfile] = _build(dockerfile, dict(EXAMPLES.values())[dockerfile])
    return _built[dockerfile]


def unpacked(dockerfile: str, tmp_path_factory):
    """The example image unpacked, only for the tests that look inside it (an unpack takes ~25 s
    here), once per build key: the key (the image's tag) hashes everything the build reads (the
    stand-in Dockerfile, the whole context, the stand-in of Ray's image), so Dockerfiles whose
    stand-in builds are the same (examples/Dockerfile, examples/rl/Dockerfile and
    examples/rl/tpu/Dockerfile differ only in their skipped downloads and base tags) give the same
    files, and one unpack shows them all."""
    info = built(dockerfile)
    if info["tag"] not in _unpacked:
        _unpacked[info["tag"]] = unpack(info["archive"], info["tag"], tmp_path_factory.mktemp("example"))
    return _unpacked[info["tag"]]


def test_what_the_image_tests_cover():
    """The subsets below are not empty (a test over none of the images would pass for nothing)."""
    assert set(WITH_EXAMPLES) == {"examples/Dockerfile", "examples/rl/Dockerfile", "examples/rl/tpu/Dockerfile"}
    assert set(WITH_GCS) == {"examples/Dockerfile", "examples/rl/Dockerfile", "examples/rl/tpu/Dockerfile"}


@pytest.mark.parametrize("dockerfile", ALL)
def test_only_downloads_are_skipped(dockerfile):
    """It builds; a marked step installs named packages from an index and nothing else: no local
    path, no command after the install."""
    info = built(dockerfile)
    assert info["bases"] and all(b.startswith("rayproject/ray:") for b in info["bases"])
    for step in info["skipped"]:
        for command in re.split(r"&&", step.removeprefix("RUN ").replace("\\\n", " ")):
            words = shlex.split(command)
            assert words[:3] == ["pip", "install", "--no-cache-dir"], f"{dockerfile}: {command!r} is not a download"
            packages = [w for w in words[3:] if not w.startswith("-") and not w.startswith("https://")]
            assert packages and all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", p) for p in packages), command


@pytest.mark.parametrize("dockerfile", WITH_EXAMPLES)
def test_the_examples_are_in_the_image_as_the_ray_user_s(dockerfile, tmp_path_factory):
    bundle = unpacked(dockerfile, tmp_path_factory)
    context = dict(EXAMPLES.values())[dockerfile]
    assert bundle.process["user"]["uid"] == 1000 and bundle.process["cwd"] == "/home/ray"
    want = standin_dockerfile.files_under(REPO / context, "examples")
    assert want
    for path in want:
        inside = bundle.root / "home/ray" / path.relative_to(REPO / context)
        assert inside.is_file() and inside.read_bytes() == path.read_bytes(), inside
        assert (inside.stat().st_uid, inside.stat().st_gid) == (1000, 100), f"{inside}: not ray:users"


@pytest.mark.parametrize("dockerfile", WITH_EXAMPLES)
def test_the_example_entrypoints_start_from_the_working_directory(dockerfile, tmp_path_factory):
    """What the TPUTorchJob examples start (`python examples/....py`, from the head's working
    directory, no runtimeEnv.working_dir): the script and its tputorch import are found. torch is one
    of the skipped downloads and Ray is not in the stand-in, so the argument parsing (which imports
    neither) is what runs."""
    bundle = unpacked(dockerfile, tmp_path_factory)
    out = run_in_image(bundle, ["python", "-c", "from tputorch import train; print(train.scaling_config.__name__)"])
    assert out.returncode == 0 and out.stdout.strip() == "scaling_config", out.stderr
    out = run_in_image(bundle, ["python", "examples/ddp/train_ddp.py", "--help"])
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]
    # grpo.py's main() imports ray first (not in the stand-in): its argument parsing, by module
    out = run_in_image(bundle, ["python", "-c", "import sys; sys.path.insert(0, 'examples/rl'); import grpo\n"
                                "print(grpo.parse_args(['--steps', '3', '--model', 'Qwen/Qwen3-0.6B']).steps)"])
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr[-2000:]


@pytest.mark.parametrize("dockerfile", WITH_GCS)
def test_the_gcs_clients_a_gs_working_dir_needs(dockerfile, tmp_path_factory):
    """Every node fetches a gs:// runtimeEnv.working_dir: smart_open[gcs] and google-cloud-storage
    at the pinned versions, importable by the image's Python (their RUN is not skipped)."""
    bundle = unpacked(dockerfile, tmp_path_factory)
    pins = _gcs_pins(dockerfile)
    out = run_in_image(bundle, ["python", "-c", "import smart_open, google.cloud.storage\n"
                                "from importlib.metadata import version\n"
                                "print(version('smart_open'), version('google-cloud-storage'))"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [pins["smart_open"], pins["google-cloud-storage"]]
