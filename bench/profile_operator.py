#!/usr/bin/env python3
"""Profile the operator through a burst or a start over existing jobs: cProfile of its event loop's
thread, or with --threads yappi's CPU clock over every thread (the watches and API calls included).

  python bench/profile_operator.py N                       # a burst of N jobs in a new namespace
  python bench/profile_operator.py --threads N             # the same, every thread
  python bench/profile_operator.py --existing NS OBJECTS   # a start over the OBJECTS jobs of NS
                                                           # (e.g. made by tests/cluster/population.py)

KUBECONFIG from the environment (`eval "$(hack/cluster.sh env)"`). Prints the top functions by
internal and cumulative time, and the operator's RSS at the end; the profile is bench/out/operator.prof.
"""

from __future__ import annotations

import argparse
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
import scale  # noqa: E402
import throughput  # noqa: E402


class Profiled(burst.OperatorProcess):
    """The operator under cProfile; SIGINT makes it write its profile on the way out."""

    def __init__(self, kubeconfig: str, log: Path, namespaces: list[str], prof: Path, threads: bool = False) -> None:
        super().__init__(kubeconfig, log, namespaces)
        self.prof = prof
        self.threads = threads

    def start(self, timeout: float = 300) -> "Profiled":
        profiler = [str(HERE / "yappi_run.py"), str(self.prof)] if self.threads else \
            ["-m", "cProfile", "-o", str(self.prof), "-m", "tputorch"]
        args = [sys.executable, *profiler, "run",
                "--liveness", f"http://127.0.0.1:{self.health_port}/healthz",
                "--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port)]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONPATH": str(self.source)}
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        return self

    def stop(self) -> None:
        if self.threads:  # yappi_run.py saves on SIGUSR1
            saved = self.prof.stat().st_mtime if self.prof.exists() else 0
            os.kill(self.proc.pid, signal.SIGUSR1)
            end = time.monotonic() + 120
            while time.monotonic() < end and (not self.prof.exists() or self.prof.stat().st_mtime == saved):
                time.sleep(0.5)
            time.sleep(2)  # written whole
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("n", nargs="?", type=int, default=200, help="jobs in the burst (default 200)")
    p.add_argument("--threads", action="store_true", help="every thread, with yappi (pip install yappi)")
    p.add_argument("--existing", nargs=2, metavar=("NAMESPACE", "OBJECTS"), help="profile a start over existing jobs")
    args = p.parse_args()
    kubeconfig = os.environ["KUBECONFIG"]
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    prof = out / "operator.prof"
    bench = burst.Bench(kubeconfig, out)
    if args.existing:
        ns, objects = args.existing[0], int(args.existing[1])
        op = Profiled(kubeconfig, out / "profile-operator.log", [ns], prof)
        started = time.monotonic()
        op.start()
        print(scale.settle(op, started, objects))
        print(f"RSS {burst.rss_mb(op.proc.pid):.1f} MB")
        op.stop()
    else:
        ns = bench.namespace("profile", args.n)
        op = Profiled(kubeconfig, out / "profile-operator.log", [ns], prof, args.threads)
        op.start()
        cpu0 = burst.cpu_s(op.proc.pid)
        try:
            time.sleep(6)
            bodies = []
            for i in range(args.n):
                b = throughput.job_body(f"job-{i:05d}", ns)
                del b["metadata"]["namespace"], b["metadata"]["generation"]
                bodies.append((f"job-{i:05d}", (burst.GROUP, burst.VERSION, burst.PLURAL), b))
            t0 = time.monotonic()
            bench._burst(ns, bodies)
            bench._settle(ns, args.n)
            print(f"{args.n} jobs settled in {time.monotonic() - t0:.1f}s; RSS {burst.rss_mb(op.proc.pid):.1f} MB; "
                  f"operator CPU {1000 * (burst.cpu_s(op.proc.pid) - cpu0) / args.n:.1f} ms/job (profiled)")
        finally:
            op.stop()
            bench.cleanup()
    stats = pstats.Stats(str(prof))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
