#!/usr/bin/env python3
"""Profile the operator's event loop (cProfile) through a burst: `python bench/profile_operator.py N`.

Prints the top functions by cumulative and internal time; KubeRay is left running (suspend: true
jobs only get a status from it). Deletes its namespace afterwards.
"""

from __future__ import annotations

import os
import pstats
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "operator"), str(HERE)]

import burst  # noqa: E402
import throughput  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    kubeconfig = os.environ["KUBECONFIG"]
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    bench = burst.Bench(kubeconfig, out)
    ns = bench.namespace("profile", n)
    prof = out / "operator.prof"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "operator")}
    proc = subprocess.Popen([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "tputorch", "run",
                             "--namespace", ns], env=env, stdout=open(out / "profile-operator.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(6)
        bodies = []
        for i in range(n):
            b = throughput.job_body(f"job-{i:05d}", ns)
            del b["metadata"]["namespace"], b["metadata"]["generation"]
            bodies.append((f"job-{i:05d}", (burst.GROUP, burst.VERSION, burst.PLURAL), b))
        t0 = time.monotonic()
        bench._burst(ns, bodies)
        bench._settle(ns, n)
        print(f"{n} jobs settled in {time.monotonic() - t0:.1f}s")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        bench.cleanup()
    stats = pstats.Stats(str(prof))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
