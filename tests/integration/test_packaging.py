"""The wheel the Dockerfile builds works on its own: build it, install it into a fresh venv, run it.

No Docker engine here, so this runs the Dockerfile's two steps by hand (`pip wheel --no-deps .`,
then `pip install` of the wheel, dependencies from PyPI) and checks the console script and the
packaged Jinja2 templates from outside the source tree. Slow (a venv + dependency install,
typically 30-90 s); bounded by timeouts. Skips when PyPI cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "v6e-4x4.yaml"


def _run(cmd, cwd, timeout, env=None):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv with only the built wheel (and its dependencies) installed; returns its bin dir."""
    tmp = tmp_path_factory.mktemp("pkg")
    # Build from a copy of what the Dockerfile copies, so the shared work tree gets no build/ dirs.
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    if (ROOT / "README.md").exists():
        shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "operator", src / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    wheels = tmp / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, "."], src, 300)
    if built.returncode != 0 and re.search(r"(?i)connection|resolve|network|index", built.stderr):
        pytest.skip(f"cannot fetch build requirements: {built.stderr[-500:]}")
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("tputorch_operator-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    inst = _run([bin_dir / "python", "-m", "pip", "install", "--disable-pip-version-check", wheel], tmp, 600)
    if inst.returncode != 0 and re.search(r"(?i)connection|resolve|network|No matching distribution", inst.stderr):
        pytest.skip(f"cannot install dependencies from the package index: {inst.stderr[-500:]}")
    assert inst.returncode == 0, inst.stderr[-3000:]
    # As the Dockerfile's final stage: no pip, setuptools or wheel at run time.
    rm = _run([bin_dir / "python", "-m", "pip", "uninstall", "-y", "setuptools", "wheel", "pip"], tmp, 120)
    assert rm.returncode == 0, rm.stderr[-3000:]
    return bin_dir, wheel


def _isolated_env(bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_wheel_contents(installed):
    import zipfile

    _, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tputorch/render/templates/rayjob.json.j2" in names
    assert "tputorch/cli/main.py" in names
    assert not any(n.startswith(("tests/", "operator/", "hack/")) for n in names), sorted(names)


def test_run_help_from_installed_wheel(installed, tmp_path):
    bin_dir, _ = installed
    out = _run([bin_dir / "tputorch", "run", "--help"], tmp_path, 60, env=_isolated_env(bin_dir))
    assert out.returncode == 0, out.stderr
    for flag in ("--namespace", "--liveness", "--metrics-port", "--leader-elect", "--log-format"):
        assert flag in out.stdout


def test_crd_from_installed_wheel_matches_repo(installed, tmp_path):
    bin_dir, _ = installed
    out = _run([bin_dir / "tputorch", "crd"], tmp_path, 60, env=_isolated_env(bin_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "---\n".join((ROOT / "crds" / name).read_text() for name in
                                     ("tputorch.io_tputorchjobs.yaml", "tputorch.io_tputorchservices.yaml"))


def test_installed_package_is_not_the_source_tree(installed, tmp_path):
    bin_dir, _ = installed
    out = _run([bin_dir / "python", "-c", "import tputorch, sys; print(tputorch.__file__)"], tmp_path, 60,
               env=_isolated_env(bin_dir))
    assert out.returncode == 0, out.stderr
    assert "site-packages" in out.stdout and str(ROOT) not in out.stdout


def test_operator_modules_import_without_build_tools(installed, tmp_path):
    """`tputorch run` imports kopf, kubernetes and aiohttp lazily; import them as the pod would."""
    bin_dir, _ = installed
    code = ("import importlib.util as u, tputorch.controller.handlers, tputorch.controller.metrics; "
            "assert u.find_spec('setuptools') is None and u.find_spec('pip') is None; print('ok')")
    out = _run([bin_dir / "python", "-c", code], tmp_path, 120, env=_isolated_env(bin_dir))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_render_uses_packaged_templates(installed, tmp_path):
    bin_dir, _ = installed
    out = _run([bin_dir / "tputorch", "render", EXAMPLE], tmp_path, 60, env=_isolated_env(bin_dir))
    assert out.returncode == 0, out.stderr
    rayjob = yaml.safe_load(out.stdout)
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["numOfHosts"] == 4


def test_kubectl_plugin_runs_without_the_cli_extra(installed, tmp_path):
    """The wheel alone (as in the operator image: no `cli` extra, so no rich) installs the
    kubectl plugin, and the user commands work without rich."""
    bin_dir, _ = installed
    env = {**_isolated_env(bin_dir), "KUBECONFIG": str(tmp_path / "none")}
    code = "import importlib.util as u; print(u.find_spec('rich') is None)"
    assert _run([bin_dir / "python", "-c", code], tmp_path, 60, env=env).stdout.strip() == "True"
    out = _run([bin_dir / "kubectl-tputorch", "submit", "--tpu", "v6e-4x4", "--image", "i", "--name", "p",
                "--dry-run", "--", "python", "t.py"], tmp_path, 60, env=env)
    assert out.returncode == 0, out.stderr
    job, rayjob = yaml.safe_load_all(out.stdout)
    assert job["kind"] == "TPUTorchJob" and rayjob["kind"] == "RayJob"


def test_the_readmes_cli_install_from_a_checkout(tmp_path):
    """The README's install of the user commands, run as written in a fresh venv from a copy of
    the checkout: `tputorch` and `kubectl tputorch` work, with rich, and without Ray or PyTorch."""
    sys.path.insert(0, str(ROOT / "tests"))
    import doccmds

    cmds = doccmds.tested_by("tests/integration/test_packaging.py")
    assert cmds, "the README names no command tested here"
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "operator", src / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    env = _isolated_env(env_dir / "bin")
    # the wheels `make install` keeps (every dependency and the build backend), when there: the same
    # files PyPI serves, without the index's round trips
    wheels = Path(os.environ.get("TPUTORCH_CACHE", Path.home() / ".cache" / "tputorch")) / "wheels"
    if any(wheels.glob("setuptools-*.whl")) and any(wheels.glob("rich-*.whl")):
        env.update(PIP_FIND_LINKS=str(wheels), PIP_NO_INDEX="1")
    for c in cmds:
        out = _run(["bash", "-c", c.text], src, 600, env=env)
        if out.returncode != 0 and env.get("PIP_NO_INDEX") and "No matching distribution" in out.stderr:
            # the wheelhouse predates a new dependency: the index as the reader has it
            out = _run(["bash", "-c", c.text], src, 600, env={k: v for k, v in env.items() if k != "PIP_NO_INDEX"})
        if out.returncode != 0 and re.search(r"(?i)connection|resolve|network|No matching distribution", out.stderr):
            pytest.skip(f"cannot install dependencies from the package index: {out.stderr[-500:]}")
        assert out.returncode == 0, f"{c.where}: {c.text}\n{out.stderr[-3000:]}"
    code = ("import importlib.util as u; print([m for m in ('rich', 'kubernetes', 'ray', 'torch') "
            "if u.find_spec(m) is not None])")
    found = _run([env_dir / "bin" / "python", "-c", code], tmp_path, 60, env=env)
    assert found.stdout.strip() == "['rich', 'kubernetes']", found.stderr
    kubeconfig = {**env, "KUBECONFIG": str(tmp_path / "none")}
    for cli in ("tputorch", "kubectl-tputorch"):
        out = _run([env_dir / "bin" / cli, "submit", "--tpu", "v6e-4x4", "--image", "i", "--name", "p", "--dry-run",
                    "--", "python", "t.py"], tmp_path, 60, env=kubeconfig)
        assert out.returncode == 0 and "kind: RayJob" in out.stdout, out.stderr
