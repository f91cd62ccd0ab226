#!/usr/bin/env python3
"""Benchmarks: `make bench` (everything) or `BENCH_ARGS=--quick make bench` (smaller counts, the same
keys; 17 min at load average ~25 in run 6 with 1,000 existing jobs and pods, hence 500 since run 7).

The five measures of issue 16 on the local cluster (started if needed), then tables,
bench/out/results.json (the headline figures), bench/out/details.json (every figure, with the load
average at its time), bench/out/RESULTS.md (tables for bench/RESULTS.md) and bench/out/bench.png.

1. e2e: apply -> TPU worker pods Running, operator vs the same RayJob by hand (KubeRay running)
2. bursts: the operator vs bench/minimal_controller.py, with the same writes (the floor) and RayJob-only (KubeRay stopped)
3. existing: thousands of finished/running jobs; first start, restart, a burst on top (KubeRay stopped)
4. pods: RSS with thousands of unrelated pods vs none (KubeRay stopped)
5. waiting: status writes of jobs waiting for a busy slice (KubeRay running)
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
MEASURES = ("e2e", "waiting", "bursts", "existing", "pods")
# (full, quick)
SIZES = {
    "e2e_samples": (20, 6), "e2e_concurrent": (100, 10),
    "waiting_jobs": (50, 10), "waiting_window_s": (300, 60),
    "bursts": ([500, 1000], [200]),
    "existing": (5000, 500), "existing_burst": (100, 100), "idle_s": (30, 10),
    "pods": (5000, 500),
}
HEADLINE = ("e2e_p50_ratio", "burst_throughput_vs_minimal", "burst_p50_vs_minimal", "burst_throughput_vs_floor",
            "burst_p50_vs_floor", "burst_cpu_vs_floor", "restart_objects",
            "restart_seconds", "restart_creates", "restart_status_writes", "restart_rss_mb",
            "unrelated_pods_rss_delta_mb", "pending_status_writes_per_job_per_5min",
            "e2e_writes_per_job", "burst_writes_per_job")


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")))
    return {"nproc": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1), "cpu": cpu,
            "python": platform.python_version(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "loadavg_at_start": os.getloadavg()}


def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(c) -> str:
    if isinstance(c, float):
        if c.is_integer():
            return str(int(c))
        return f"{c:.0f}" if abs(c) >= 100 else f"{c:.2f}" if abs(c) < 10 else f"{c:.1f}"
    return str(c)


def md_table(headers: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)] + \
        ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]


def cluster_env() -> dict:
    out = subprocess.run([str(REPO / "hack" / "cluster.sh"), "env"], check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = v
    return env


# --- the run ----------------------------------------------------------------------------------------

def run_cluster(which: set[str], size: dict, direct: bool, rounds: int = 1) -> dict:
    import burst
    import scale

    if subprocess.run([str(REPO / "hack" / "cluster.sh"), "status"], capture_output=True).returncode != 0:
        burst.restart_cluster_components()
    env = cluster_env()
    os.environ.update(env)
    burst.ensure_crd(env["KUBECONFIG"])
    OUT.mkdir(exist_ok=True)
    bench = burst.Bench(env["KUBECONFIG"], OUT)
    res: dict = {}

    def step(name: str, fn):
        if name not in which:
            return
        at_start = scale.load()
        print(f"-- {name} (load {at_start})", flush=True)
        started = time.monotonic()
        res[name] = fn()
        res[name].update(seconds=time.monotonic() - started, load_at_start=at_start)

    try:
        # KubeRay running: a large CPU node for heads and submitters, v6e 2x2 hosts for the concurrent jobs.
        if which & {"e2e", "waiting"}:
            scale.bench_nodes(bench, size["e2e_concurrent"] if "e2e" in which else 0)
            step("e2e", lambda: scale.end_to_end(bench, size["e2e_samples"], size["e2e_concurrent"], rounds))
            step("waiting", lambda: scale.waiting(bench, size["waiting_jobs"], size["waiting_window_s"]))
            scale.remove_bench_nodes(bench)
        if which & {"bursts", "existing", "pods"}:
            stopped = burst.stop_kuberay(Path(env["TPUTORCH_CLUSTER_DIR"]))
            print(f"KubeRay operator stopped (pid {stopped}); only tputorch acts on the objects", flush=True)
            step("bursts", lambda: bursts(bench, size["bursts"], direct, rounds))
            step("existing", lambda: scale.existing(bench, size["existing"], size["existing_burst"], size["idle_s"]))
            step("pods", lambda: scale.unrelated_pods(bench, size["pods"]))
    finally:
        bench.cleanup()
        bench.wait_namespaces_gone()
        scale.remove_bench_nodes(bench)
        try:  # a failure here must not lose the figures above (a port taken by another process)
            burst.restart_cluster_components()
            print("KubeRay operator running again (hack/cluster.sh up)")
        except subprocess.CalledProcessError as err:
            print(f"WARNING: hack/cluster.sh up failed after the measures ({err}); see .cluster/logs/", flush=True)
    return res


def bursts(bench, sizes: list[int], direct: bool, rounds: int = 1) -> dict:
    """Per size: the floor (the minimal controller doing the operator's critical-path writes), the
    operator and the RayJob-only minimal controller one after the other (then the direct creates if
    asked), each side's namespace deleted, and its deletion awaited, before the next. With
    ``rounds`` > 1 the sides run that many times, the order turned each round (the load on a
    shared machine moves within minutes), and each side's figures are the round with its median
    throughput; every round is kept under "rounds"."""
    import scale

    out = {"sizes": {}}
    measures = {"floor": lambda n: bench.minimal(n, same_work=True), "operator": lambda n: bench.operator(n, 50),
                "minimal": bench.minimal, **({"direct": bench.direct} if direct else {})}
    for n in sizes:
        runs: dict[str, list] = {side: [] for side in measures}
        for r in range(rounds):
            order = list(measures) if r % 2 == 0 else list(reversed(measures))
            for side in order:
                print(f"   N={n}: {side} (round {r + 1}/{rounds})", flush=True)
                runs[side].append({**measures[side](n), "load": scale.load(), "round": r})
                bench.cleanup()
                bench.wait_namespaces_gone()
        sides = {side: sorted(rs, key=lambda x: x["per_s"])[(len(rs) - 1) // 2] for side, rs in runs.items()}
        if rounds > 1:
            sides["rounds"] = runs
        o = sides["operator"]
        for base in ("minimal", "floor"):
            b = sides[base]
            suffix = "" if base == "minimal" else "_floor"
            sides["throughput_ratio" + suffix] = o["per_s"] / b["per_s"]
            sides["p50_ratio" + suffix] = o["p50_ms"] / b["p50_ms"]
            sides["cpu_ratio" + suffix] = o["operator_cpu_s"] / b["operator_cpu_s"]
            sides["cpu_settled_ratio" + suffix] = o["cpu_ms_per_job_settled"] / b["cpu_ms_per_job_settled"]
        print(f"   N={n}: operator/floor {sides['throughput_ratio_floor']:.2f}x jobs/s, "
              f"{sides['p50_ratio_floor']:.2f}x p50, {sides['cpu_ratio_floor']:.2f}x CPU; operator/minimal "
              f"{sides['throughput_ratio']:.2f}x jobs/s, {sides['p50_ratio']:.2f}x p50", flush=True)
        out["sizes"][str(n)] = sides
    return out


def headline(c: dict) -> dict:
    """The figures of results.json; a measure not run gives null. Bursts: the worst size."""
    h = dict.fromkeys(HEADLINE)
    if "e2e" in c:
        h["e2e_p50_ratio"] = c["e2e"]["single_p50_ratio"]
        if "writes_per_job" in c["e2e"]:
            h["e2e_writes_per_job"] = {side: round(sum(w.values()), 2) for side, w in c["e2e"]["writes_per_job"].items()}
    if "bursts" in c:
        sizes = c["bursts"]["sizes"].values()
        h["burst_throughput_vs_minimal"] = min(s["throughput_ratio"] for s in sizes)
        h["burst_p50_vs_minimal"] = max(s["p50_ratio"] for s in sizes)
        floors = [s for s in sizes if "floor" in s]  # runs before issue 40 had no floor
        if floors:
            h["burst_throughput_vs_floor"] = min(s["throughput_ratio_floor"] for s in floors)
            h["burst_p50_vs_floor"] = max(s["p50_ratio_floor"] for s in floors)
            h["burst_cpu_vs_floor"] = max(s["cpu_ratio_floor"] for s in floors)
        last = list(sizes)[-1]
        if "writes_per_job" in last["operator"]:
            h["burst_writes_per_job"] = {side: round(sum(last[side]["writes_per_job"].values()), 2)
                                         for side in ("minimal", "floor", "operator") if side in last}
    if "existing" in c:
        r = c["existing"]["restart"]
        h.update(restart_objects=c["existing"]["objects"], restart_seconds=r.get("reconciled_s"),
                 restart_creates=r.get("creates"), restart_status_writes=r.get("status_writes"),
                 restart_rss_mb=r.get("rss_mb"))
    if "pods" in c:
        h["unrelated_pods_rss_delta_mb"] = c["pods"]["rss_delta_mb"]
    if "waiting" in c:
        h["pending_status_writes_per_job_per_5min"] = c["waiting"]["per_job_per_5min"]
    return h


def merged(runs: list[dict]) -> dict:
    """Several runs' details as one report; each measure from the last run that has it."""
    if len(runs) == 1:
        return runs[0]
    out = {**runs[-1], "cluster": {}, "parts": []}
    for r in runs:
        out["cluster"].update(r.get("cluster", {}))
        out["parts"].append({"date": r["machine"]["date"], "mode": r["mode"], "measures": sorted(r.get("cluster", {})),
                             "load_at_start": round(r["machine"]["loadavg_at_start"][0], 1)})
    out["headline"] = headline(out["cluster"])
    return out


# --- tables -----------------------------------------------------------------------------------------

def sections(results: dict) -> list[tuple[str, list[str], list[list]]]:
    """(title, headers, rows) for every measure that ran."""
    c = results.get("cluster", {})
    out = []
    t = results["throughput"]
    out.append(("Render + validate, one process (calls/s)", ["path", "calls/s", "µs/call", "parse+render ÷ this"],
                [[k, v["per_s"], v["us_per_call"], v.get("operator_ratio", "")] for k, v in t["rows"].items()]))
    if "e2e" in c:
        e = c["e2e"]
        rows = [["one v6e 4x4 at a time", s["n"], e["single_summary"]["hand"]["p50_s"], s["p50_s"],
                 e["single_p50_ratio"], e["single_summary"]["hand"]["p90_s"], s["p90_s"],
                 f"{min(e['load'])}–{max(e['load'])}"]
                for s in [e["single_summary"]["operator"]]]
        if "concurrent" in e:
            m = e["concurrent"]
            rounds = f" ({len(m['rounds'])} rounds)" if len(m.get("rounds", [])) > 1 else ""
            rows.append([f"{m['operator'].get('at_once', m['operator']['of'])} v6e 2x2 at once{rounds}",
                         m["operator"]["n"], m["hand"]["p50_s"],
                         m["operator"]["p50_s"], m["p50_ratio"], m["hand"]["max_s"], m["operator"]["max_s"],
                         f"{m['hand']['load']}/{m['operator']['load']}"])
        out.append(("1. Apply -> all TPU worker pods Running, KubeRay running (s)",
                    ["jobs", "n", "hand p50", "operator p50", "op/hand p50", "hand p90|max", "op p90|max", "load"], rows))
    if "bursts" in c:
        rows = []
        for n, s in c["bursts"]["sizes"].items():
            o = s["operator"]
            for base in ("floor", "minimal"):
                if base not in s:
                    continue
                b, suffix = s[base], "_floor" if base == "floor" else ""
                rows.append([n, base, b["per_s"], o["per_s"], s["throughput_ratio" + suffix], b["p50_ms"], o["p50_ms"],
                             s["p50_ratio" + suffix], o["p99_ms"], 1000 * b["operator_cpu_s"] / b["n"],
                             1000 * o["operator_cpu_s"] / o["n"], b.get("cpu_ms_per_job_settled", ""),
                             o.get("cpu_ms_per_job_settled", ""), o["rss_loaded_mb"], f"{b['load']}/{o['load']}"])
        out.append(("2. Bursts: operator vs the same-work floor and the RayJob-only minimal controller (KubeRay stopped)",
                    ["N", "baseline", "base jobs/s", "op jobs/s", "op/base", "base p50 ms", "op p50 ms", "op/base p50",
                     "op p99 ms", "base CPU ms/job", "op CPU ms/job", "base CPU ms/job, all",
                     "op CPU ms/job, all (statuses, events)", "op RSS MB", "load base/op"], rows))
    rows = []
    if "e2e" in c and "writes_per_job" in c["e2e"]:
        for side, w in c["e2e"]["writes_per_job"].items():
            rows.append([f"1. e2e, {side}", sum(w.values()), ", ".join(f"{k} {v:.2f}" for k, v in w.items())])
    if "bursts" in c:
        for n, s in c["bursts"]["sizes"].items():
            for side in ("minimal", "floor", "operator"):
                w = (s.get(side) or {}).get("writes_per_job")
                if w is not None:
                    rows.append([f"2. burst of {n}, {side}", sum(w.values()),
                                 ", ".join(f"{k} {v:.2f}" for k, v in w.items())])
    if rows:
        out.append(("Writes per job, counted by the API server (apiserver_request_total: TPUTorchJobs, RayJobs, "
                    "NetworkPolicies, Secrets, Events)", ["side", "writes/job", "by verb and resource"], rows))
    if "existing" in c:
        x = c["existing"]
        rows = []
        for label, r in (("first start", x["first_start"]), ("restart", x["restart"])):
            rows.append([label, r.get("served_s"), r.get("reconciled_s"), r.get("last_patch_s"), r.get("creates"),
                         r.get("status_writes"), r.get("objects_changed", ""), r.get("events_posted", ""),
                         r.get("rss_mb"), r.get("idle_cpu_ms_per_s", ""), r.get("load")])
        out.append((f"3. {x['objects']} existing jobs ({', '.join(f'{v} {k}' for k, v in x['counts'].items())}); "
                    f"made in {x['populate']['seconds']:.0f}s",
                    ["start", "listed s", "all reconciled s", "last status write s", "RayJob creates", "status writes",
                     "objects changed", "events", "RSS MB", "idle CPU ms/s", "load"], rows))
        e, lo = x["burst_empty"], x["burst_loaded"]
        out.append((f"3b. Burst of {e['n']} on an empty cluster vs on top of the {x['objects']}",
                    ["cluster", "p50 ms", "p99 ms", "jobs/s", "load"],
                    [["empty", e["p50_ms"], e["p99_ms"], e["per_s"], e["load"]],
                     [f"{x['objects']} existing", lo["p50_ms"], lo["p99_ms"], lo["per_s"], lo["load"]],
                     ["ratio", x["burst_p50_ratio"], lo["p99_ms"] / e["p99_ms"], lo["per_s"] / e["per_s"], ""]]))
    if "pods" in c:
        p = c["pods"]
        out.append((f"4. Cluster-wide operator RSS with {p['pods']} unrelated pods (MB)",
                    ["pods", "RSS MB", "listed s", "load"],
                    [["none", p["none"]["rss_mb"], p["none"]["listed_s"], p["none"]["load"]],
                     [p["pods"], p["with"]["rss_mb"], p["with"]["listed_s"], p["with"]["load"]],
                     ["none (after)", p["none_after"]["rss_mb"], p["none_after"]["listed_s"], p["none_after"]["load"]],
                     ["delta", p["rss_delta_mb"], "", ""]]))
    if "waiting" in c:
        w = c["waiting"]
        out.append((f"5. Jobs waiting for a busy v6e 4x4 slice, KubeRay running",
                    ["jobs", "window s", "status writes", "reconciles", "writes/job/5 min", "load"],
                    [[w["jobs"], w["window_s"], w["status_writes"], w["reconciles"], w["per_job_per_5min"], w["load"]]]))
    return out


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, {m['date']}; "
             f"load average at start {m['loadavg_at_start'][0]:.1f}; {results['mode']} mode.", ""]
    for part in results.get("parts", []):
        lines.append(f"- {', '.join(part['measures']) or 'render only'}: {part['mode']} run of {part['date']}, "
                     f"load {part['load_at_start']} at its start")
    if results.get("parts"):
        lines.append("")
    for title, headers, rows in sections(results):
        lines += [f"#### {title}", ""] + md_table(headers, rows) + [""]
    lines += ["Headline (bench/out/results.json):", "", "```json", json.dumps(results["headline"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = results.get("cluster", {})
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    ax = axes[0]
    if "e2e" in c:
        e = c["e2e"]
        ax.boxplot([e["single"]["hand"], e["single"]["operator"]], tick_labels=["by hand", "operator"])
        ax.set_title(f"apply -> v6e 4x4 workers Running\n(op/hand p50 {e['single_p50_ratio']:.2f}x, target ≤ 1.1x)")
        ax.set_ylabel("s")
    ax = axes[1]
    if "bursts" in c:
        ns = list(c["bursts"]["sizes"])
        for off, key, color in ((-0.27, "minimal", "C1"), (0, "floor", "C2"), (0.27, "operator", "C0")):
            if all(key in c["bursts"]["sizes"][n] for n in ns):
                ax.bar([i + off for i in range(len(ns))], [c["bursts"]["sizes"][n][key]["per_s"] for n in ns], 0.27,
                       label=key, color=color)
        ax.set_xticks(range(len(ns)), [f"N={n}" for n in ns])
        ax.set_title("bursts: jobs/s until all RayJobs exist")
        ax.legend()
    ax = axes[2]
    if "existing" in c:
        x = c["existing"]
        labels = ["first start", "restart"]
        ax.bar(labels, [x["first_start"]["status_writes"], x["restart"]["status_writes"]], color=["C7", "C0"])
        ax.set_title(f"{x['objects']} existing jobs (statuses right): status writes\n"
                     f"(restart: all reconciled in {x['restart']['reconciled_s']:.0f}s, "
                     f"RSS {x['restart']['rss_mb']:.0f} MB)")
    ax = axes[3]
    if "pods" in c or "waiting" in c:
        bars = {}
        if "pods" in c:
            bars["RSS +MB, unrelated pods"] = c["pods"]["rss_delta_mb"]
        if "waiting" in c:
            bars["writes/waiting job/5 min"] = c["waiting"]["per_job_per_5min"]
        ax.bar(list(bars), list(bars.values()), color=["C2", "C3"][:len(bars)])
        ax.axhline(1, color="r", ls="--", lw=0.8)
        ax.set_title("unrelated pods (≤ 10 MB), waiting jobs (≤ 1)")
    fig.suptitle(f"tputorch-operator bench ({results['mode']}), {results['machine']['nproc']} cores, "
                 f"{results['machine']['date']}, load {results['machine']['loadavg_at_start'][0]:.1f} at start")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    global OUT
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller counts (500 existing jobs and pods, bursts of 200)")
    p.add_argument("--only", default=",".join(MEASURES), help=f"measures to run, comma-separated ({','.join(MEASURES)})")
    p.add_argument("--direct", action="store_true", help="bursts: also time direct RayJob creates")
    p.add_argument("--rounds", type=int, default=1,
                   help="bursts and e2e's concurrent jobs: run each side this many times, the order turned "
                        "each round (bursts: median kept; e2e: every round's jobs pooled)")
    p.add_argument("--no-cluster", action="store_true", help="only the render + validate throughput")
    p.add_argument("--out", default=str(OUT), help=f"output folder (default {OUT})")
    p.add_argument("--report", metavar="DETAILS_JSON", action="append",
                   help="only print and write the tables and plot of earlier runs (repeat: a later run's "
                        "measures replace an earlier one's)")
    args = p.parse_args()
    which = {m for m in args.only.split(",") if m}
    if which - set(MEASURES):
        p.error(f"--only: unknown {sorted(which - set(MEASURES))}; allowed: {', '.join(MEASURES)}")
    size = {k: v[1] if args.quick else v[0] for k, v in SIZES.items()}
    OUT = Path(args.out)
    OUT.mkdir(exist_ok=True)

    if args.report:
        results = merged([json.loads(Path(f).read_text()) for f in args.report])
    else:
        results = {"machine": machine(), "mode": "quick" if args.quick else "full", "sizes": size}
        print(f"machine: {results['machine']}")
        results["throughput"] = throughput.run(1.0 if args.quick else 3.0)
        if not args.no_cluster:
            started = time.monotonic()
            results["cluster"] = run_cluster(which, size, args.direct, args.rounds)
            results["cluster_seconds"] = time.monotonic() - started
        results["headline"] = headline(results.get("cluster", {}))
        # Before any table: a report that fails loses no figure (--report redoes it).
        (OUT / "details.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        (OUT / "results.json").write_text(json.dumps(results["headline"], indent=2) + "\n")

    for title, headers, rows in sections(results):
        print(f"\n{title}\n{table(headers, rows)}")
    print("\nheadline:", json.dumps(results["headline"]))
    (OUT / "RESULTS.md").write_text(markdown(results))
    if args.report:
        (OUT / "results.json").write_text(json.dumps(results["headline"], indent=2) + "\n")
    try:
        plot(results, OUT / "bench.png")
        print(f"\nwrote {OUT}/results.json, details.json, RESULTS.md and bench.png")
    except ImportError:
        print(f"\nwrote {OUT}/results.json (no matplotlib: pip install -e '.[bench]' for the plot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
