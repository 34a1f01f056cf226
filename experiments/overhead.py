"""python -m experiments.overhead: the cost of replication (the paper's overhead table, 5.4).

The paper's dataflow with extra CPU work in the first group-by (``BusyWork``)
runs on one embedded local-cluster three times, fed as fast as it takes
input: ``none`` (one replica per partition), ``cluster-pairs`` (two whole
replicas of the dataflow, coordinated only at the ingress and egress) and
``flux`` (partition pairs in chained declustering), ``--runs`` rounds with the
modes' order rotating from round to round (the machine's speed drifts; one run
says little). Each run's output is checked against the failure-free reference.
Writes ``results/overhead/summary.json`` (every run, each mode's median rate
with its min-max, and the Flux / cluster-pairs ratio per round with its
median and min-max) and ``results/overhead/table.md``.

On a machine with fewer cores than nodes, replicated modes do twice the
work on the same cores: compare ``flux`` with ``cluster-pairs`` (both
replicated); ``none`` is the unreplicated ceiling.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Any, Dict, List

from flux.testing.dataflows import cpu_bound_paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.testing.workloads import packet_workload

MODES = ("none", "cluster-pairs", "flux")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.overhead",
                                 description="Maximum sustained throughput per replication mode.")
    ap.add_argument("--inputs", type=int, default=100_000, help="packets per mode")
    ap.add_argument("--rounds", type=int, default=1000,
                    help="BusyWork rounds per record in the first group-by")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5, help="rounds of every mode, order rotating")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, from {', '.join(MODES)}")
    ap.add_argument("--out", default="results/overhead")
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        ap.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    if args.nodes < 2 or args.nodes % 2:
        ap.error("--nodes must be even and >= 2 (cluster pairs split the nodes in two)")
    if args.inputs < 1 or args.rounds < 0 or args.runs < 1:
        ap.error("--inputs and --runs must be >= 1 and --rounds >= 0")
    return args


def measure(spark, mode: str, records: List[Any], expected: List[Any], args) -> Dict[str, Any]:
    from flux.spark.job import FluxJob

    dataflow = cpu_bound_paper_dataflow(args.rounds)
    job = FluxJob(spark, dataflow, records, nodes=args.nodes, standbys=0, replication=mode)
    with job:
        output = job.wait(timeout=3600)
        elapsed = time.monotonic() - job.metrics.t0
    same = [wire_form(x) for x in output] == [wire_form(x) for x in expected]
    return {"mode": mode, "inputs": len(records), "outputs": len(output),
            "seconds": round(elapsed, 3), "input_rate_tps": round(len(records) / elapsed, 1),
            "median_interval_latency_ms": job.metrics.summary()["median_interval_latency_ms"],
            "output_matches_reference": same}


def spread(values: List[float], digits: int = 1) -> Dict[str, float]:
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits), "n": len(values)}


def summarize(rows: List[Dict[str, Any]], modes: List[str]) -> Dict[str, Any]:
    """Each mode's median rate with its spread; the ratios per round (the modes of a round
    ran back to back), with theirs."""
    rates = {m: [r["input_rate_tps"] for r in rows if r["mode"] == m] for m in modes}
    out: Dict[str, Any] = {"modes": {m: spread(v) for m, v in rates.items() if v}}
    for name, num, den in (("flux_vs_cluster_pairs", "flux", "cluster-pairs"),
                           ("flux_vs_none", "flux", "none"),
                           ("cluster_pairs_vs_none", "cluster-pairs", "none")):
        if rates.get(num) and rates.get(den):
            out[name] = spread([a / b for a, b in zip(rates[num], rates[den])], 3)
    return out


def table(summary: Dict[str, Any]) -> str:
    lines = ["| replication | input packets/s, median (min-max) | runs |", "|---|---|---|"]
    for mode, s in summary["modes"].items():
        lines.append(f"| `{mode}` | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) | "
                     f"{s['n']} |")
    lines += ["", "| ratio, per round | median | min-max |", "|---|---|---|"]
    for key in ("flux_vs_cluster_pairs", "flux_vs_none", "cluster_pairs_vs_none"):
        if key in summary:
            s = summary[key]
            lines.append(f"| {key.replace('_', ' ')} | {s['median']} | {s['min']}-{s['max']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    from flux.spark.session import local_cluster

    print(f"preparing {args.inputs} packets and their failure-free output ...", flush=True)
    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = reference_output(cpu_bound_paper_dataflow(args.rounds), records, args.nodes)
    rows = []
    with local_cluster(args.nodes + 1) as spark:
        for r in range(args.runs):
            k = r % len(args.modes)
            for mode in args.modes[k:] + args.modes[:k]:  # rotate the order each round
                print(f"round {r}, {mode}: {args.inputs} packets as fast as taken ...",
                      flush=True)
                rows.append({"round": r, **measure(spark, mode, records, expected, args)})
                print(f"  {rows[-1]['input_rate_tps']:,.0f} packets/s", flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"rounds": args.rounds, "nodes": args.nodes, "inputs": args.inputs,
               **summarize(rows, args.modes), "runs": rows,
               "output_matches_reference": all(r["output_matches_reference"] for r in rows)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(summary))
    print(table(summary))
    print(f"wrote {out}/summary.json and table.md")
    return 0 if summary["output_matches_reference"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
