#!/usr/bin/env python3
"""A/B bursts: the operator at another git revision against this checkout's, alternately.

`python bench/ab.py REV [--n 500] [--pairs 3]` uses the local cluster (`hack/cluster.sh up`),
stops the KubeRay operator for the run and restarts it afterwards. Each pair bursts N
TPUTorchJobs through the operator at REV (a git worktree in bench/out/ab-REV), then through the
working tree's, each in a fresh namespace whose deletion is awaited before the next burst. One
line per burst: p50/p99 create -> RayJob, RayJobs/s, operator and API-server CPU per job.
Alternating cancels slow drifts of a shared machine's load: compare the sides pair by pair.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "operator"), str(HERE)]

import burst  # noqa: E402
import run  # noqa: E402


def worktree(rev: str) -> Path:
    path = HERE / "out" / f"ab-{rev.replace('/', '_')}"
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def one_burst(bench: burst.Bench, source: Path, n: int) -> dict:
    ns = bench.namespace("ab", n)
    op = burst.OperatorProcess(bench.kubeconfig, bench.log_dir / f"ab-{n}.log", [ns], source=source)
    op.start()
    try:
        time.sleep(2)
        return bench._through_controller(ns, n, op.proc.pid)
    finally:
        op.stop()
        bench.cleanup()
        bench.wait_namespaces_gone()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev", help="git revision to compare with the working tree, e.g. HEAD~1")
    p.add_argument("--n", type=int, default=500, help="jobs per burst (default 500)")
    p.add_argument("--pairs", type=int, default=3, help="A/B pairs (default 3)")
    args = p.parse_args()
    sides = {args.rev: worktree(args.rev) / "operator", "working tree": REPO / "operator"}

    if subprocess.run([str(REPO / "hack" / "cluster.sh"), "status"], capture_output=True).returncode != 0:
        burst.restart_cluster_components()
    env = run.cluster_env()
    os.environ.update(env)
    burst.ensure_crd(env["KUBECONFIG"])
    (HERE / "out").mkdir(exist_ok=True)
    bench = burst.Bench(env["KUBECONFIG"], HERE / "out")
    burst.stop_kuberay(Path(env["TPUTORCH_CLUSTER_DIR"]))
    rows = []
    try:
        for pair in range(1, args.pairs + 1):
            for side, source in sides.items():
                r = one_burst(bench, source, args.n)
                rows.append([pair, side, r["p50_ms"], r["p99_ms"], r["per_s"], 1000 * r["operator_cpu_s"] / r["n"],
                             1000 * r["apiserver_cpu_s"] / r["n"], f"{r['seen']}/{r['n']}"])
                print(f"pair {pair} {side}: {r['per_s']:.1f} RayJobs/s, p50 {r['p50_ms']:.0f} ms", flush=True)
    finally:
        bench.cleanup()
        burst.restart_cluster_components()
    print(run.table(["pair", "operator", "p50 ms", "p99 ms", "RayJobs/s", "op CPU ms/job", "apiserver ms/job", "RayJobs"],
                    rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
