"""The docs' commands, offline: every shell command in README.md and docs/ (docs/reference/ aside) runs in a test or
says in the docs why it does not (tests/doccmds.py has the rules); the offline ones run here, as
one script per document in the order a reader runs them. The cluster ones run in
tests/cluster/test_docs_commands.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import doccmds  # noqa: E402
from tputorch import render  # noqa: E402
from tputorch.api import spec  # noqa: E402

ROOT = doccmds.ROOT
COMMANDS = doccmds.all_commands()
DOC_NAMES = sorted({c.doc for c in COMMANDS})


def shim_path(tmp: Path, helm: str | None) -> str:
    """A PATH whose `tputorch` (and `kubectl-tputorch`) is this checkout's, as `pip install .` makes
    it, and whose helm is the one the chart tests use."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("tputorch", "kubectl-tputorch"):
        (bin_dir / name).write_text(f'#!/bin/sh\nPYTHONPATH={ROOT / "operator"} exec {sys.executable} -m tputorch "$@"\n')
        (bin_dir / name).chmod(0o755)
    if helm:
        doccmds.helm_shim(bin_dir, helm)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def run_script(text: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    # stdin answers `read` prompts (a token typed in without shell history)
    return subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, input="hf_not_a_real_token\n" * 20,
                          capture_output=True, text=True, timeout=timeout)


def test_the_docs_have_shell_commands():
    # the harness finds what it should: the README's quick start is among them
    assert any(c.doc == "README.md" and c.text.startswith("tputorch submit") for c in COMMANDS)
    assert {"README.md", "docs/getting-started.md"} <= set(DOC_NAMES)


def test_every_fenced_block_says_what_it_holds():
    """An untagged block could hide commands from the check below: each block names its language
    (`sh` for commands, `text` for output or a synopsis)."""
    untagged = [f"{b.doc}:{b.line}" for path in doccmds.DOCS for b in doccmds.blocks(path) if not b.lang]
    assert not untagged, f"fenced blocks without a language tag: {untagged}"


def test_every_command_runs_in_a_test_or_is_marked_not_run_here():
    unhandled = [f"{c.where}: {c.text.splitlines()[0]}  ({c.why})" for c in COMMANDS
                 if c.kind == "unhandled" and c.marker is None]
    assert not unhandled, ("commands no test runs; make a rule in tests/doccmds.py run them or mark them "
                           "`# not run here: <why>` in the doc:\n" + "\n".join(unhandled))


def test_no_marker_on_a_command_that_runs_here():
    # (plain shell lines of a marked block, such as an assignment, may stay in it)
    wrong = [f"{c.where}: {c.text.splitlines()[0]}" for c in COMMANDS if c.marker is not None
             and c.kind not in ("unhandled", "shell") and not c.text.lstrip().startswith(tuple(doccmds.GKE_OUTPUTS))]
    assert not wrong, "marked `not run here` but a test can run them: drop the marker\n" + "\n".join(wrong)
    bare = [c.where for c in COMMANDS if c.marker == ""]
    assert not bare, f"`# not run here:` needs a reason: {bare}"


def test_commands_tested_elsewhere_are_run_there():
    """`# tested by FILE`: FILE exists and takes its commands from the docs (doccmds.tested_by), so
    what it runs is what the reader copies."""
    for c in COMMANDS:
        if c.tested_by:
            path = ROOT / c.tested_by
            assert path.is_file(), f"{c.where}: {c.tested_by} does not exist"
            assert f'doccmds.tested_by("{c.tested_by}")' in path.read_text(), \
                f"{c.where}: {c.tested_by} does not run the docs' commands (doccmds.tested_by)"


def test_rules_sort_commands_as_intended():
    """The rules on commands written for this test (not the docs): what runs where, and how."""
    def one(text):
        return doccmds.classify(doccmds.Command("x.md", 1, text))

    assert one("tputorch validate examples/v6e-4x4.yaml").kind == "offline"
    assert one("kubectl tputorch submit --dry-run --tpu v6e-2x2 --image i -- python a.py").kind == "offline"
    assert one("tputorch submit --tpu v6e-2x2 --image i -- python a.py").kind == "cluster"
    assert one("gcloud container clusters create c").kind == "unhandled"
    assert one("DIGEST=$(docker inspect x | cut -d@ -f2)").kind == "unhandled"
    assert one("export A=1 B=$A").kind == "shell"
    helm = one("helm upgrade --install t charts/tputorch-operator -n tputorch-system --reuse-values --set image.digest=$D")
    assert helm.run == ("helm template t charts/tputorch-operator -n tputorch-system --set image.digest=$D"
                        " | kubectl apply --dry-run=server -f -")
    assert one("kubectl delete crd tputorchjobs.tputorch.io").run.endswith("--dry-run=server")
    assert one("kubectl -n x delete ttj a").run == "kubectl -n x delete ttj a"
    assert one("kubectl apply -f examples/v6e-4x4.yaml").run == "kubectl apply -f examples/v6e-4x4.yaml"
    assert one("kubectl apply --server-side -f charts/tputorch-operator/crds/").run.endswith("--dry-run=server")
    assert one("kubectl get ttj -w").run == "retry 'kubectl get ttj'"
    assert one("kubectl create namespace team-a").namespaces == ["team-a"]
    assert one("kubectl port-forward svc/x 8000:8000 &").kind == "unhandled"
    curl = doccmds.commands(doccmds.Block("x.md", 1, "sh", [(2, "curl -d '{"), (3, '  "a": 1'), (4, "}'  # not run here: no endpoint")]))
    assert len(curl) == 1 and curl[0].marker == "no endpoint"
    heredoc = doccmds.commands(doccmds.Block("x.md", 1, "sh", [(2, "kubectl apply -f - <<'EOF'"), (3, "kind: ConfigMap"),
                                                               (4, "EOF"), (5, "kubectl get cm")]))
    assert [c.text.splitlines()[0] for c in heredoc] == ["kubectl apply -f - <<'EOF'", "kubectl get cm"]
    assert doccmds.classify(heredoc[0]).run.startswith("kubectl apply -f - <<'EOF'\nkind: ConfigMap")
    # a manifest of the checkout, edited on its way through a pipe: applied for real, as its kinds allow
    edited = 'sed "s|image: .*|image: $I|" examples/serve/qwen3-moe-v6e-4x4.yaml | kubectl apply -f -'
    assert (one(edited).kind, one(edited).run) == ("cluster", edited)
    assert one("cat examples/kueue/cluster-queue.yaml | kubectl apply -f -").kind == "unhandled"  # GKE-only kinds
    assert one("echo x | kubectl apply -f -").run.endswith("--dry-run=server")  # kinds unknown
    assert one("sed -i s/a/b/ examples/v6e-4x4.yaml").kind == "unhandled"  # would edit the checkout
    assert one("kubectl apply --server-side -f https://example.com/m.yaml").kind == "unhandled"  # the internet


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_offline_commands_of_the_doc_run(doc, tmp_path):
    cmds = [c for c in COMMANDS if c.doc == doc]
    if not any(c.kind == "offline" and c.marker is None for c in cmds):
        return  # nothing offline in this doc: its shell lines run with the cluster commands
    kubeconfig = tmp_path / "kubeconfig"  # submit/serve --dry-run read the context's namespace only
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "docs",
        "contexts": [{"name": "docs", "context": {"cluster": "none", "user": "none", "namespace": "team-a"}}],
        "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}], "users": [{"name": "none", "user": {}}]}))
    env = {**os.environ, "PATH": shim_path(tmp_path, doccmds.find_helm()), "KUBECONFIG": str(kubeconfig),
           "HELM_CACHE_HOME": str(tmp_path / "helm"), "HELM_CONFIG_HOME": str(tmp_path / "helm"),
           "HELM_DATA_HOME": str(tmp_path / "helm")}
    env.pop("PYTHONPATH", None)
    out = run_script(doccmds.script(cmds, {"shell", "offline"}), env)
    assert out.returncode == 0, f"a command of {doc} failed (the last +++ line):\n{out.stderr[-4000:]}"


EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_parses_and_renders(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    ours = [d for d in docs if d.get("kind") in ("TPUTorchJob", "TPUTorchService")]
    for doc in ours:
        child = render.render_any(spec.parse_any(doc))
        assert child["kind"] in ("RayJob", "RayService") and child["metadata"]["name"] == doc["metadata"]["name"]


def test_the_demo_creates_the_service_accounts_its_examples_run_as():
    # The API server refuses a pod whose ServiceAccount does not exist (GKE's too): `make demo`
    # applies these examples into a namespace of its own, so it must create what they name.
    demo = (ROOT / "hack" / "demo.sh").read_text()
    applied = set(re.findall(r'\$REPO/(examples/[\w/.-]+\.yaml)', demo))
    assert "examples/v6e-4x4.yaml" in applied
    named = {d["spec"]["serviceAccountName"] for p in applied for d in yaml.safe_load_all((ROOT / p).read_text())
             if d and (d.get("spec") or {}).get("serviceAccountName")}
    assert named == {"ray-tpu"}
    created = set(re.findall(r'kubectl create serviceaccount ([\w-]+) -n "\$NS"', demo))
    assert named <= created, f"hack/demo.sh applies examples running as {sorted(named - created)} without creating them"


def rbac_table(doc: str) -> set:
    """(API group, resource, verb) of every row of the doc's table of what the operator may do."""
    text = (ROOT / doc).read_text()
    table = text[text.index("| API group | resources | verbs | why |"):].split("\n\n", 1)[0]
    out = set()
    for row in table.splitlines()[2:]:
        groups, resources, verbs = (cell.strip() for cell in row.strip("|").split("|")[:3])
        for g in groups.split(","):
            for r in resources.split("(")[0].split(","):
                for v in verbs.split(","):
                    out.add(("" if g.strip() == "core" else g.strip(), r.strip(), v.strip()))
    return out


@pytest.mark.skipif(doccmds.find_helm() is None, reason="no helm binary (hack/build.sh helm, or set $HELM)")
def test_the_rbac_table_is_what_the_chart_grants(tmp_path):
    """tenancy-and-auth.md's table of the operator's permissions against the chart's rendered Roles and
    ClusterRoles (cluster-wide and namespaced; the users' aggregated roles are another table)."""
    granted = set()
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path), "HELM_CONFIG_HOME": str(tmp_path), "HELM_DATA_HOME": str(tmp_path)}
    for extra in ([], ["--set", "watchNamespaces={team-a}"]):
        out = subprocess.run([doccmds.find_helm(), *doccmds.helm_args(["template", "t", str(ROOT / "charts" / "tputorch-operator"),
                              "--namespace", "tputorch-system", *extra])], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        for d in yaml.safe_load_all(out.stdout):
            if d and d["kind"] in ("Role", "ClusterRole") and not d["metadata"]["name"].endswith(("-user-view", "-user-edit")):
                for rule in d["rules"]:
                    granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    documented = rbac_table("docs/concepts/tenancy-and-auth.md")
    assert documented == granted, (f"in the doc, not granted: {sorted(documented - granted)}; "
                                   f"granted, not in the doc: {sorted(granted - documented)}")


def test_the_example_images_pin_what_the_project_runs():
    """examples/Dockerfile: the Ray of spec's default rayVersion on Python 3.11, the torch CI trains
    the examples with (pyproject's `torch` extra), torch-tpu with a torch its wheel accepts (2.11 to
    2.15); examples/serve/Dockerfile and examples/rl/tpu/Dockerfile: the same Ray on Python 3.12
    (vllm-torchtpu 0.29.0 has no 3.11 wheel)."""
    import tomllib

    from tputorch.api import common

    ray = common.DEFAULTS["rayVersion"]
    train = (ROOT / "examples" / "Dockerfile").read_text()
    serve = (ROOT / "examples" / "serve" / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray)}-py311$", train, re.M), train
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray)}-py312$", serve, re.M), serve
    (ci_torch,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["torch"]
    pinned = re.search(r"\btorch==([\d.]+)", train).group(1)
    assert ci_torch == f"torch=={pinned}"
    assert (2, 11) <= tuple(int(x) for x in pinned.split(".")[:2]) <= (2, 15)
    # transformers: grpo.py's driver and trainer on this image (tpu-gpu.yaml, --engine vllm), at
    # least what vLLM 0.29.0 asks for (the serving venv's requirement)
    (need,) = re.findall(r"^transformers>=([\d.]+)$", (ROOT / "hack" / "vllm-cpu" / "requirements.txt").read_text(), re.M)
    have = re.search(r"\btransformers==([\d.]+)", train).group(1)
    assert tuple(map(int, have.split("."))) >= tuple(map(int, need.split("."))), (have, need)
    for pin in ("torch-tpu==0.2.0", "libtpu==0.0.50", "smart_open[gcs]==", "google-cloud-storage=="):
        assert pin in train, pin
    assert f'"ray[serve]=={ray}"' in serve and '"vllm-torchtpu==0.29.0"' in serve
    # the Run:ai streamer a gs:// model is streamed with on TPU: below 0.17, as vllm-torchtpu-core
    # 0.29.0 pins it (its EP weight filter's FileChunks call; issue 56); the CPU chain keeps the
    # 0.17 that vLLM's CPU build takes, which the serving image therefore does not share
    # (pinned exactly, as every skipped download is: tests/image/test_example_images.py)
    assert '"runai-model-streamer[gcs]==0.16.1"' in serve
    (streamer,) = re.findall(r"^runai-model-streamer\[gcs\]==([\d.]+)$", (ROOT / "hack" / "vllm-cpu" / "requirements.txt").read_text(), re.M)
    assert streamer.startswith("0.17."), streamer
    # the CUDA rollout image (examples/rl/Dockerfile): the training image's Ray and Python (Ray
    # refuses a node whose versions differ from the head's) and the same GCS clients
    rollout = (ROOT / "examples" / "rl" / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray)}-py311-gpu$", rollout, re.M), rollout
    gcs = [ln for ln in train.splitlines() if ln.startswith("RUN") and "smart_open" in ln]
    assert len(gcs) == 1 and gcs[0] in rollout.splitlines()
    assert "vllm==0.29.0" in rollout
    # the TPU RL image (examples/rl/tpu/Dockerfile), every group of tpu-tpu.yaml: the serving image's
    # Ray, Python and vllm-torchtpu (which brings torch-tpu and transformers; no torch pin of its own
    # beside it), the same GCS clients, and a tputorch that installs on that Python
    from packaging.specifiers import SpecifierSet

    tpu_rl = (ROOT / "examples" / "rl" / "tpu" / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(ray)}-py312$", tpu_rl, re.M), tpu_rl
    assert f"ray=={ray} vllm-torchtpu==0.29.0" in tpu_rl and "torch==" not in tpu_rl
    assert gcs[0] in tpu_rl.splitlines()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains("3.12") and SpecifierSet(requires).contains("3.11"), requires
    example = yaml.safe_load((ROOT / "examples" / "rl" / "tpu-tpu.yaml").read_text())["spec"]
    assert example["image"].endswith("/ray-vllm-torchtpu-rl:2.60.0") and not any("image" in g for g in example["groups"])


def entrypoints() -> list[tuple[str, list[str], dict]]:
    """Every `python examples/....py ARGS` a reader would start: in the docs' shell commands (after
    `--`, shell variables given a value) and in the examples' TPUTorchJobs (with their env)."""
    import shlex

    out = []
    for c in COMMANDS:
        if "python examples/" in c.text and c.marker is None:
            words = shlex.split(c.text.replace("\\\n", " ").replace("$", "X"))
            i = words.index("python")
            out.append((c.where, words[i + 1:], {}))
    for path in EXAMPLES:
        for d in yaml.safe_load_all(path.read_text()):
            if d and d.get("kind") == "TPUTorchJob" and d["spec"]["entrypoint"].startswith("python examples/"):
                env = {e["name"]: e["value"] for e in d["spec"].get("env", []) if "value" in e}
                if (d["spec"].get("checkpoint") or {}).get("storagePath"):
                    env["TPUTORCH_STORAGE_PATH"] = d["spec"]["checkpoint"]["storagePath"]
                out.append((str(path.relative_to(ROOT)), shlex.split(d["spec"]["entrypoint"])[1:], env))
    return out


def test_every_example_command_line_is_accepted_by_its_script(monkeypatch):
    """The quick start once exited at once (the script wanted --storage-path): each command line the
    docs and the examples start is parsed by the script's own parse_args, with the env it would have."""
    import importlib.util

    found = entrypoints()
    assert any(where.startswith("README.md:") for where, _, _ in found)
    for where, argv, env in found:
        script = ROOT / argv[0]
        module_spec = importlib.util.spec_from_file_location(f"docs_example_{script.stem}", script)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        for name in ("STORAGE_PATH", "TPUTORCH_STORAGE_PATH"):
            monkeypatch.delenv(name, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        try:
            module.parse_args(argv[1:])
        except SystemExit as exc:
            raise AssertionError(f"{where}: {' '.join(argv)} exits at once ({exc.code})") from exc


# Issue 58's reading budgets, in words as `len(text.split())` over the whole markdown file: prose,
# tables and code blocks alike (a command is read too).
WORD_BUDGETS = {"README.md": 1100, "docs/getting-started.md": 2000}


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("name", WORD_BUDGETS)
def test_the_entry_pages_stay_within_their_word_budget(name):
    count = words((ROOT / name).read_text())
    assert count <= WORD_BUDGETS[name], (f"{name}: {count} words (len(text.split()), code blocks included), "
                                         f"over its budget of {WORD_BUDGETS[name]}: move detail to a task or concept page")


def test_words_counts_code_blocks_too():
    # "#", "T", "Two", "words.", "```sh", "kubectl", "get", "ttj", "```": the fences count as words too
    assert words("# T\n\nTwo words.\n\n```sh\nkubectl get ttj\n```\n") == 9


# What a release changed and until when is CHANGELOG.md's; a page says what is, not which version.
RELEASE_WORDS = re.compile(r"\b(until )?this version\b", re.I)


def release_words(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if RELEASE_WORDS.search(line)]


def test_no_page_speaks_of_this_version():
    """Every page of the site (README.md and docs/, the generated reference included, which takes its
    words from the CLI's help and the CRDs' descriptions)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{p.relative_to(ROOT)}: {line}" for p in pages for line in release_words(p.read_text())]
    assert not found, "release history belongs in CHANGELOG.md:\n" + "\n".join(found)


def test_release_words_finds_both_phrasings():
    assert release_words("Fine.\nUntil this version, jobs...\nAs of This Version x\nthis versioning\n") == \
        ["Until this version, jobs...", "As of This Version x"]


def test_the_self_installed_kuberay_is_a_tested_version():
    """docs/tasks/install.md's Helm install of KubeRay names a version the suite runs, so the docs
    state one KubeRay (tputorch.tested_versions; reference/versions.md shows it)."""
    from tputorch import tested_versions

    text = (ROOT / "docs" / "tasks" / "install.md").read_text()
    (version,) = re.findall(r"helm install kuberay-operator kuberay/kuberay-operator --version (\S+)", text)
    assert version in tested_versions.KUBERAY


def test_getting_started_states_compatibility_mds_kuberay_minimum():
    """The gate of step 1 and compatibility.md's Minimum row name the same KubeRay versions (the
    runbook's reader meets the gate first; the row gives it feature by feature)."""
    compat = (ROOT / "docs" / "compatibility.md").read_text().split("\n## KubeRay\n", 1)[1].split("\n## ", 1)[0]
    (row,) = [ln for ln in compat.splitlines() if ln.startswith("| Minimum |")]
    gate = (ROOT / "docs" / "getting-started.md").read_text().split("**The one gate on this path: KubeRay.**", 1)[1]
    gate = gate.split("\n\n", 1)[0]
    minimum = re.findall(r"\*\*([0-9.]+)\*\*", row)
    assert minimum and re.findall(r"\b[0-9]+\.[0-9]+\.[0-9]+\b", gate) == minimum
