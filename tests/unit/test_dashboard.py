"""The chart's Grafana dashboard and alerting rules: the dashboard against Grafana's own schema of the
dashboard JSON model (the types Grafana publishes as @grafana/schema, checked by the TypeScript
compiler: hack/grafana-schema/install.sh), its layout and data source, and every series a panel or a rule names exists: the operator's from its own registry, Ray's, Serve's and
vLLM's from the recorded scrape of the real serving chain (tests/serving/metric_series.py, which
tests/cluster/test_real_serving.py checks against a live scrape)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tputorch.controller import kinds
from tputorch.controller.metrics import WALL_CLOCK, Metrics

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "serving"))

import metric_series  # noqa: E402

GRID_WIDTH = 24
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "table", "bargauge", "text"}
series_of, dashboard = metric_series.series_of, metric_series.dashboard


def operator_series() -> set[str]:
    """The sample names the operator's registry exposes, every kind's phase gauge and every labelled
    series given one sample."""
    m = Metrics()
    m.sources.phases = lambda: {k.phase_metric: dict.fromkeys(k.phases, 0) for k in kinds.KINDS}
    m.sources.informers = lambda: {"pods": (1, 0)}
    m.sources.listed = lambda: {"pods": True}
    m.sources.goodput = lambda: {("a", "q"): {"productive": 1.0, WALL_CLOCK: 1.0}}
    m.reconciled("ok", 0.1, "TPUTorchJob")
    m.event_dropped("spam")
    m.api_call("patch", "200")
    m.queue_wait.observe(0.1)
    return {s.name for family in text_string_to_metric_families(m.exposition()) for s in family.samples}


def targets(dash: dict) -> list[tuple[str, str]]:
    return metric_series.dashboard_queries(dash)


def test_series_of_reads_promql_as_meant():
    assert series_of('histogram_quantile(0.95, sum by (le, kind) (rate(a_bucket{x=~"b|c"}[5m])))') == {"a_bucket"}
    assert series_of("sum(tputorch_services{phase=\"Failed\"}) > 0 or on(x) ray_vllm_x") == {"tputorch_services", "ray_vllm_x"}


def grafana_schema_errors(dashboards: dict[str, str], tmp: Path) -> dict[str, list[str]]:
    """What the TypeScript compiler finds wrong in each dashboard JSON (by name) checked against
    Grafana's `Dashboard` type as an object literal: a wrong type, a missing required field, and a
    field Grafana's schema does not have (TypeScript's excess property check) are errors."""
    schema = Path(subprocess.run([ROOT / "hack" / "grafana-schema" / "install.sh"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    types = schema / "node_modules" / "@grafana" / "schema" / "dist" / "types" / "raw" / "dashboard" / "x" / "types.gen"
    for name, text in dashboards.items():
        (tmp / f"{name}.ts").write_text(f'import type {{ Dashboard }} from "{types}";\n'
                                        f"export const dashboard = {text.strip()} satisfies Dashboard;\n")
    tsc = subprocess.run([schema / "node_modules" / ".bin" / "tsc", "--noEmit", "--strict", "--pretty", "false",
                          "--module", "esnext", "--moduleResolution", "bundler", *(tmp / f"{n}.ts" for n in dashboards)],
                         capture_output=True, text=True, timeout=600)
    errors = {name: [line for line in tsc.stdout.splitlines() if f"{name}.ts(" in line and "error TS" in line]
              for name in dashboards}
    assert any(errors.values()) or tsc.returncode == 0, tsc.stdout + tsc.stderr
    return errors


def test_the_dashboard_passes_grafanas_own_schema(tmp_path):
    # The check can fail: a misspelt field, a number as a string, a variable's empty `current`.
    wrong = dashboard()
    wrong["panels"][1]["gridPoss"] = wrong["panels"][1]["gridPos"]
    wrong["panels"][2]["gridPos"]["h"] = "8"
    wrong["templating"]["list"][0]["current"] = {}
    errors = grafana_schema_errors({"chart": metric_series.DASHBOARD.read_text(), "wrong": json.dumps(wrong, indent=1)},
                                   tmp_path)
    assert errors["chart"] == []
    assert len(errors["wrong"]) == 3, errors["wrong"]
    for found in ("'\"gridPoss\"' does not exist in type", "Type 'string' is not assignable to type 'number'",
                  "missing the following properties from type 'VariableOption': text, value"):
        assert any(found in e for e in errors["wrong"]), (found, errors["wrong"])


def test_the_dashboard_is_a_dashboard_grafana_loads():
    """The fields of Grafana's dashboard JSON model a dashboard needs to load and lay out: title, uid,
    schemaVersion, time, the templated Prometheus data source every query uses, panels with unique ids,
    a known type, a grid position inside the 24-column grid, and queries with unique refIds."""
    dash = dashboard()
    assert isinstance(dash["title"], str) and dash["title"]
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dash["uid"]), dash["uid"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert set(dash["time"]) == {"from", "to"}
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    occupied = set()
    for p in dash["panels"]:
        assert p["type"] in PANEL_TYPES, p
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "hwxy") and g["w"] >= 1 and g["h"] >= 1, p
        assert g["x"] + g["w"] <= GRID_WIDTH, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() and t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert series_of(v["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]) <= known_series()


def test_the_dashboard_has_operator_serving_and_training_panels():
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == ["Operator", "Serving (vLLM through Ray Serve LLM)", "Training"]
    named = {s for _, expr in targets(dashboard()) for s in series_of(expr)}
    # what the issue asks to see: time to first token, time per output token, queue depth, KV cache, tokens/s
    for series in ("ray_vllm_time_to_first_token_seconds_bucket", "ray_vllm_inter_token_latency_seconds_bucket",
                   "ray_vllm_num_requests_waiting", "ray_vllm_kv_cache_usage_perc", "ray_vllm_generation_tokens_total"):
        assert series in named, series
    # the goodput ledger (issue 57): where the jobs' slice time went, and the productive share of it
    training = [p for p in dashboard()["panels"] if p["type"] != "row" and p["gridPos"]["y"] > 34]
    training_series = {s for p in training for t in p["targets"] for s in series_of(t["expr"])}
    assert {"tputorch_goodput_seconds", "tputorch_goodput_wall_clock_seconds"} <= training_series


def known_series() -> set[str]:
    return operator_series() | metric_series.recorded()


def test_every_panel_query_names_a_series_that_exists():
    known = known_series()
    missing = [(title, expr, sorted(series_of(expr) - known)) for title, expr in targets(dashboard())
               if series_of(expr) - known]
    assert not missing, missing
    assert all(series_of(expr) for _, expr in targets(dashboard()))


def test_the_recorded_scrape_holds_vllms_series_as_ray_serve_llm_exports_them():
    recorded = metric_series.recorded()
    assert any(n.startswith(metric_series.VLLM_PREFIXES) for n in recorded)
    assert "tputorch_services" not in recorded and "tputorch_services" in operator_series()


def test_every_alert_names_a_series_that_exists_and_the_three_asked_for_are_there():
    rules = metric_series.rules()
    known = known_series()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"} and rule["alert"], rule
        assert series_of(rule["expr"]) and series_of(rule["expr"]) <= known, (rule["alert"], series_of(rule["expr"]) - known)
    named = {s for r in rules for s in series_of(r["expr"])}
    assert {"ray_vllm_time_to_first_token_seconds_bucket", "ray_vllm_num_requests_waiting",
            "ray_serve_deployment_replica_healthy"} <= named
