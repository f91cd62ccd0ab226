#!/usr/bin/env python3
"""Benchmarks: `make bench` (everything) or `python bench/run.py --sizes 50 --seconds 1` (quick).

Prints tables, writes bench/out/results.json and bench/out/bench.png. The cluster part uses the
local cluster (`hack/cluster.sh up`, started if needed) and deletes every namespace it created.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402

OUT = HERE / "out"


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")))
    return {"nproc": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1), "cpu": cpu,
            "python": platform.python_version(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "loadavg_at_start": os.getloadavg()}


def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[f"{c:.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cluster_env() -> dict:
    out = subprocess.run([str(REPO / "hack" / "cluster.sh"), "env"], check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = v
    return env


def run_cluster(sizes: list[int], samples: int) -> dict:
    import burst

    if subprocess.run([str(REPO / "hack" / "cluster.sh"), "status"], capture_output=True).returncode != 0:
        burst.restart_cluster_components()
    env = cluster_env()
    os.environ.update(env)
    kubeconfig, cluster_dir = env["KUBECONFIG"], Path(env["TPUTORCH_CLUSTER_DIR"])
    burst.ensure_crd(kubeconfig)
    OUT.mkdir(exist_ok=True)
    bench = burst.Bench(kubeconfig, OUT)
    results = {"kuberay_stopped": True, "creator_threads": burst.CREATORS, "sizes": {}}
    stopped = burst.stop_kuberay(cluster_dir)
    print(f"KubeRay operator stopped for the measurement (pid {stopped}); only tputorch acts on the objects")
    try:
        for n in sizes:
            sides = {}
            for side, label, measure in (("direct", "direct RayJob creates (baseline)", bench.direct),
                                         ("minimal", "TPUTorchJobs through bench/minimal_controller.py", bench.minimal),
                                         ("operator", "TPUTorchJobs through the operator",
                                          lambda n: bench.operator(n, samples))):
                print(f"-- N={n}: {label}", flush=True)
                sides[side] = measure(n)
                # The namespace's deletion would load the API server during the next measurement.
                bench.cleanup()
                bench.wait_namespaces_gone()
            results["sizes"][str(n)] = sides
    finally:
        bench.cleanup()
        bench.wait_namespaces_gone()
        burst.restart_cluster_components()
        print("KubeRay operator restarted (hack/cluster.sh up)")
    return results


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def cluster_rows(res: dict) -> tuple[list, list, list, list]:
    """Latency, throughput, status propagation and resource rows, one per burst size."""
    lat, rate, status, resources = [], [], [], []
    for n, r in res["sizes"].items():
        d, m, o = r["direct"], r["minimal"], r["operator"]
        lat.append([n, d["p50_ms"], m["p50_ms"], o["p50_ms"], ratio(m["p50_ms"], d["p50_ms"]), ratio(o["p50_ms"], d["p50_ms"]),
                    d["p99_ms"], m["p99_ms"], o["p99_ms"], ratio(o["p99_ms"], d["p99_ms"]), f"{o['seen']}/{o['n']}"])
        rate.append([n, d["per_s"], m["per_s"], o["per_s"], ratio(m["per_s"], d["per_s"]), ratio(o["per_s"], d["per_s"]),
                     ratio(o["per_s"], m["per_s"]), o["wall_s"], o["all_status_s"]])
        s = o["status"]
        status.append([n, s["n"], s["p50_ms"], s["p99_ms"], s["max_ms"], f"{s['seen']}/{s['n']}"])
        per_job = lambda side, key: 1000 * side[key] / side["n"]  # noqa: E731
        resources.append([n, o["rss_idle_mb"], o["rss_loaded_mb"], o["rss_after_status_mb"], per_job(m, "operator_cpu_s"),
                          per_job(o, "operator_cpu_s"), per_job(d, "apiserver_cpu_s"), per_job(m, "apiserver_cpu_s"),
                          per_job(o, "apiserver_cpu_s"), "yes" if o.get("kuberay_running") else "no"])
    return lat, rate, status, resources


LAT_HEAD = ["N", "direct p50", "minimal p50", "op p50", "minimal/direct", "op/direct", "direct p99", "minimal p99", "op p99",
            "op/direct p99", "RayJobs"]
RATE_HEAD = ["N", "direct", "minimal", "operator", "minimal/direct", "op/direct", "op/minimal", "op: all RayJobs s",
             "op: all statuses s"]
STATUS_HEAD = ["N", "samples", "p50", "p99", "max", "seen"]
RES_HEAD = ["N", "RSS idle MB", "after burst", "after status", "minimal CPU ms/job", "op CPU ms/job",
            "apiserver ms/job direct", "minimal", "operator", "KubeRay running?"]


def report_cluster(res: dict) -> list[str]:
    lat, rate, status, resources = cluster_rows(res)
    return [
        "Create -> RayJob watch event (ms, client clock)", table(LAT_HEAD, lat), "",
        "Jobs/s until all RayJobs exist", table(RATE_HEAD, rate), "",
        "RayJob status patch -> TPUTorchJob status shows it (ms)", table(STATUS_HEAD, status), "",
        "Operator RSS (MB); CPU per job of the controller and of the API server during each burst",
        table(RES_HEAD, resources),
    ]


def md_table(headers: list[str], rows: list[list]) -> list[str]:
    fmt = lambda c: (f"{c:.0f}" if c >= 100 else f"{c:.1f}") if isinstance(c, float) else str(c)  # noqa: E731
    return ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)] + \
        ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]


def markdown(results: dict) -> str:
    """The summary committed as bench/RESULTS.md (copied from bench/out/RESULTS.md by hand)."""
    m = results["machine"]
    lines = [f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, {m['date']}; "
             f"load average at start {m['loadavg_at_start'][0]:.1f}.", "",
             "### Render + validate (one process, one core)", "",
             "| path | calls/s | µs/call | parse+render ÷ this |", "|---|---:|---:|---:|"]
    for k, v in results["throughput"]["rows"].items():
        lines.append(f"| {k} | {v['per_s']:.0f} | {v['us_per_call']:.0f} | "
                     f"{format(v['operator_ratio'], '.2f') if 'operator_ratio' in v else ''} |")
    c = results.get("cluster")
    if c:
        lat, rate, status, resources = cluster_rows(c)
        lines += ["", f"### Bursts on the local cluster (KubeRay operator stopped; {c['creator_threads']} client threads create)",
                  "", "Create → RayJob (ms):", ""] + md_table(LAT_HEAD, lat)
        lines += ["", "Jobs/s until all RayJobs exist:", ""] + md_table(RATE_HEAD, rate)
        lines += ["", "Status propagation (ms):", ""] + md_table(STATUS_HEAD, status)
        lines += ["", "Memory and CPU:", ""] + md_table(RES_HEAD, resources)
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = results["throughput"]["rows"]
    axes[0].barh(list(rows), [r["per_s"] for r in rows.values()], color=["C0", "C0", "C0", "C7", "C7"])
    axes[0].axvline(2000, color="r", ls="--", label="target 2000/s")
    axes[0].set_xlabel("calls/s (one core)")
    axes[0].set_title("render + validate")
    axes[0].legend()
    sizes = results.get("cluster", {}).get("sizes", {})
    if sizes:
        ns = list(sizes)
        x = range(len(ns))
        for off, key, color in ((-0.27, "direct", "C7"), (0, "minimal", "C1"), (0.27, "operator", "C0")):
            axes[1].bar([i + off for i in x], [sizes[n][key]["p50_ms"] for n in ns], 0.27, label=f"{key} p50", color=color)
            axes[1].scatter([i + off for i in x], [sizes[n][key]["p99_ms"] for n in ns], color="k", marker="_", s=200)
            axes[2].bar([i + off for i in x], [sizes[n][key]["per_s"] for n in ns], 0.27, label=key, color=color)
        for ax, title, label in ((axes[1], "create -> RayJob (p50 bar, p99 tick)", "ms"), (axes[2], "jobs/s until all RayJobs exist", "jobs/s")):
            ax.set_xticks(list(x), [f"N={n}" for n in ns])
            ax.set_title(title)
            ax.set_ylabel(label)
            ax.legend()
    fig.suptitle(f"tputorch-operator bench, {results['machine']['nproc']} cores, {results['machine']['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,500,1000", help="burst sizes, comma-separated (default 100,500,1000)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per throughput row")
    p.add_argument("--status-samples", type=int, default=100, help="RayJob status patches to time per size")
    p.add_argument("--no-cluster", action="store_true", help="only the pure throughput part")
    args = p.parse_args()

    results = {"machine": machine()}
    print(f"machine: {results['machine']}")
    results["throughput"] = throughput.run(args.seconds)
    t = results["throughput"]
    print("\nRender + validate, one process (calls/s)")
    print(table(["path", "calls/s", "us/call", "parse+render / this"],
                [[k, v["per_s"], v["us_per_call"], f"{v['operator_ratio']:.2f}x" if "operator_ratio" in v else ""] for k, v in t["rows"].items()]))
    print(f"target >= {t['target_per_s']}/s: {'met' if t['met'] else 'MISSED'}\n")

    if not args.no_cluster:
        started = time.monotonic()
        results["cluster"] = run_cluster([int(s) for s in args.sizes.split(",") if s], args.status_samples)
        results["cluster"]["seconds"] = time.monotonic() - started
        print("\n" + "\n".join(report_cluster(results["cluster"])))

    OUT.mkdir(exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    (OUT / "RESULTS.md").write_text(markdown(results))
    try:
        plot(results, OUT / "bench.png")
        print(f"\nwrote {OUT / 'results.json'} and {OUT / 'bench.png'}")
    except ImportError:
        print(f"\nwrote {OUT / 'results.json'} (no matplotlib: pip install -e '.[bench]' for the plot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
