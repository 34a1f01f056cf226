"""python -m experiments.overhead: the cost of replication (the paper's overhead table, 5.4).

The paper's dataflow with extra CPU work in the first group-by (``BusyWork``)
runs on one embedded local-cluster three times, fed as fast as it takes
input: ``none`` (one replica per partition), ``cluster-pairs`` (two whole
replicas of the dataflow, coordinated only at the ingress and egress) and
``flux`` (partition pairs in chained declustering). Each run's output is
checked against the failure-free reference. Writes
``results/overhead/summary.json`` and ``results/overhead/table.md`` with the
throughputs and their ratios.

On a machine with fewer cores than nodes, replicated modes do twice the
work on the same cores: compare ``flux`` with ``cluster-pairs`` (both
replicated); ``none`` is the unreplicated ceiling.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any, Dict, List

from flux.examples import cpu_bound_paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.workload import packet_workload

MODES = ("none", "cluster-pairs", "flux")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.overhead",
                                 description="Maximum sustained throughput per replication mode.")
    ap.add_argument("--inputs", type=int, default=100_000, help="packets per mode")
    ap.add_argument("--rounds", type=int, default=1000,
                    help="BusyWork rounds per record in the first group-by")
    ap.add_argument("--nodes", type=int, default=4)
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
    if args.inputs < 1 or args.rounds < 0:
        ap.error("--inputs must be >= 1 and --rounds >= 0")
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


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| replication | input packets/s | vs none | vs cluster-pairs | output = reference |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['mode']}` | {r['input_rate_tps']:,.0f} | "
                     f"{r.get('vs_none', '-')} | {r.get('vs_cluster_pairs', '-')} | "
                     f"{'yes' if r['output_matches_reference'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    from flux.spark.session import local_cluster

    print(f"preparing {args.inputs} packets and their failure-free output ...", flush=True)
    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = reference_output(cpu_bound_paper_dataflow(args.rounds), records, args.nodes)
    rows = []
    with local_cluster(args.nodes + 1) as spark:
        for mode in args.modes:
            print(f"{mode}: {args.inputs} packets as fast as they are taken ...", flush=True)
            rows.append(measure(spark, mode, records, expected, args))
            print(f"  {rows[-1]['input_rate_tps']:,.0f} packets/s", flush=True)
    rate = {r["mode"]: r["input_rate_tps"] for r in rows}
    for r in rows:
        if "none" in rate:
            r["vs_none"] = round(r["input_rate_tps"] / rate["none"], 3)
        if "cluster-pairs" in rate:
            r["vs_cluster_pairs"] = round(r["input_rate_tps"] / rate["cluster-pairs"], 3)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"rounds": args.rounds, "nodes": args.nodes, "inputs": args.inputs, "runs": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(rows))
    print(table(rows))
    print(f"wrote {out}/summary.json and table.md")
    return 0 if all(r["output_matches_reference"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
