"""The docs site (mkdocs.yml: README.md and docs/, Material theme) builds with `mkdocs build --strict`:
every link of every page, the README's included, resolves to a page, an anchor of it, or a file of
the repository (hack/mkdocs_hooks.py). A few seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice on every build, not a finding
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strict_with_every_link_resolved(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-6000:]
    site = tmp_path / "site"
    # the README is the home page, the generated reference is in, and a linked repository file is copied
    assert "tputorch" in (site / "index.html").read_text()
    assert (site / "reference" / "cli" / "index.html").is_file()
    assert (site / "_repo" / "examples" / "v6e-4x4.yaml").read_text() == (ROOT / "examples" / "v6e-4x4.yaml").read_text()
    # copies are reached through links, not the navigation
    assert "_repo/" not in "".join(re.findall(r'<a href="[^"]*" class="md-nav__link">', (site / "index.html").read_text()))
    # a pipe that GitHub's tables need escaped in a code span reads as a pipe here
    helm = (site / "reference" / "helm-values" / "index.html").read_text()
    assert "(ms|s|m|h)" in helm and "ms\\|s" not in helm


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """The check above can fail: the same configuration over a README and a page with a link to a
    missing file, one to a missing page and one to a missing anchor."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Here\n\nBack [home](../README.md#top).\n")
    (tmp_path / "README.md").write_text("# Top\n\n[a](docs/a.md#here) [gone](examples/gone.yaml) "
                                        "[nothing](docs/b.md) [anchor](docs/a.md#there)\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["hooks"] = [str(ROOT / h) for h in config["hooks"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    for missing in ("examples/gone.yaml", "docs/b.md", "#there"):
        assert any(missing in w for w in warnings), (missing, done.stderr)
    assert not any("#here" in w or "#top" in w for w in warnings), done.stderr
