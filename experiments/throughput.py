"""python -m experiments.throughput: sustained input rate of the paper's dataflow on Spark.

Runs the two group-bys of the paper (sessions, then per-(app, src) statistics)
with replication "flux" on an embedded local-cluster (4 nodes + 1 standby +
1 spare), feeds N synthetic packets as fast as the ingress takes them, checks
the output against the failure-free reference, and prints and writes the
figures (results/throughput/summary.json). No failure is injected.
``--curve-cost`` measures the cost of authenticated, encrypted connections
(ZeroMQ CURVE, on by default): runs without and with it, alternating, twice
each, on one cluster.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.workload import packet_workload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.throughput", description=__doc__)
    ap.add_argument("--inputs", type=int, default=200_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--standbys", type=int, default=1)
    ap.add_argument("--out", default="results/throughput")
    ap.add_argument("--curve-cost", action="store_true",
                    help="run without and with CURVE, alternating (2 runs each)")
    args = ap.parse_args(argv)
    from flux.spark.job import FluxJob
    from flux.spark.session import local_cluster

    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = reference_output(paper_dataflow(), records, args.nodes)
    modes = [False, True, False, True] if args.curve_cost else [True]
    runs = []
    with local_cluster(args.nodes + args.standbys + 1) as spark:
        for curve in modes:
            job = FluxJob(spark, paper_dataflow(), records, nodes=args.nodes,
                          standbys=args.standbys, authenticate=curve)
            with job:
                job.wait_until(lambda: job.controller.started, 120)
                started = time.perf_counter()
                job.wait(3600)
                elapsed = time.perf_counter() - started
            same = [wire_form(x) for x in job.delivered] == [wire_form(x) for x in expected]
            runs.append({"curve": curve, "seconds": round(elapsed, 3),
                         "input_rate_tps": round(args.inputs / elapsed),
                         "output_matches_reference": same})
            print(runs[-1], flush=True)
    same = all(r["output_matches_reference"] for r in runs)
    summary = {"inputs": args.inputs, "outputs": len(expected), "nodes": args.nodes,
               "standbys": args.standbys, "seconds": runs[-1]["seconds"],
               "input_rate_tps": runs[-1]["input_rate_tps"], "output_matches_reference": same,
               "runs": runs}
    if args.curve_cost:
        rate = {c: sum(r["input_rate_tps"] for r in runs if r["curve"] == c) / 2
                for c in (False, True)}
        summary["curve_cost"] = {"without_tps": rate[False], "with_tps": rate[True],
                                 "ratio": round(rate[True] / rate[False], 3)}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
