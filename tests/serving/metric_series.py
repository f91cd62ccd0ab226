"""The Prometheus series the real serving chain exports (Ray's, Serve's and vLLM's, from every Ray
node's metrics port), recorded as a list that tests/unit/test_dashboard.py checks the chart's
dashboard against without a Ray head. tests/cluster/test_real_serving.py scrapes the chain and
fails when a recorded series is missing; RECORD_METRICS=1 there writes the list anew."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

RECORDED = Path(__file__).resolve().parent / "recorded" / "real-serving-metric-series.txt"
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


HEADER = ("# Series names in a scrape of the Ray nodes' metrics ports while Ray Serve LLM serves the tiny model\n"
          "# (Ray 2.60, vLLM 0.29 on CPU) after its first completions. tests/cluster/test_real_serving.py checks\n"
          "# them on the real serving chain; RECORD_METRICS=1 there records them anew.\n")
