"""The Prometheus series the real serving chain exports (Ray's, Serve's and vLLM's, from every Ray
node's metrics port), recorded as a list that tests/unit/test_dashboard.py checks the chart's
dashboard against without a Ray head. tests/cluster/test_real_serving.py scrapes the chain while it
serves and fails when a recorded series is missing; RECORD_METRICS=1 there writes the list anew.
Also the series the chart's dashboard and alerting rules read (both tests check them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import yaml

RECORDED = Path(__file__).resolve().parent / "recorded" / "real-serving-metric-series.txt"
CHART = Path(__file__).resolve().parents[2] / "charts" / "tputorch-operator"
DASHBOARD = CHART / "dashboards" / "tputorch.json"
RULES = CHART / "alerts" / "tputorch-rules.yaml"
# vLLM's engine series as Ray Serve LLM records them through Ray's metrics: vLLM's Ray wrapper
# replaces the ':' of "vllm:..." by '_', and Ray prefixes what it exports for its users with "ray_".
VLLM_PREFIXES = ("ray_vllm_",)
TTFT = "time_to_first_token"
# What is recorded: vLLM's engine series, Serve's and Ray's per-node ones (what the dashboard and the
# alerts read), not Ray's internals (GCS, object store, gRPC), which say nothing of the model.
RECORDED_PREFIXES = ("ray_vllm_", "ray_serve_", "ray_node_")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{|\s)")


def series_names(expositions: Iterable[str]) -> set[str]:
    """The sample names (a histogram's _bucket, _sum and _count each) in Prometheus text expositions."""
    names = set()
    for text in expositions:
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m:
                names.add(m.group(1))
    return names


def recorded() -> set[str]:
    return {line for line in RECORDED.read_text().splitlines() if line and not line.startswith("#")}


def record(names: set[str]) -> None:
    RECORDED.parent.mkdir(exist_ok=True)
    RECORDED.write_text(HEADER + "".join(f"{n}\n" for n in sorted(names) if n.startswith(RECORDED_PREFIXES)))


HEADER = ("# Series names in the scrapes of the Ray nodes' metrics ports while Ray Serve LLM serves the tiny model\n"
          "# (Ray 2.60, vLLM 0.29 on CPU) under a load of 8 concurrent completions, recorded by\n"
          "# tests/cluster/test_real_serving.py on the real serving chain (RECORD_METRICS=1), which checks them there.\n")


# PromQL words that look like series names: aggregation modifiers, set operators, keywords.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
                "bool", "inf", "nan", "le"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*")


def series_of(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not its functions, labels or keywords)."""
    text = _RANGES.sub(" ", _GROUPING.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr))))
    words = {m.group() for m in _WORD.finditer(text) if not text[m.end():].lstrip().startswith("(")}  # not a function
    return words - PROMQL_WORDS


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard's panels."""
    return [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def chart_series() -> set[str]:
    """Every series a panel of the chart's dashboard or one of its alerting rules reads."""
    exprs = [expr for _, expr in dashboard_queries(dashboard())] + [r["expr"] for r in rules()]
    return {s for expr in exprs for s in series_of(expr)}
