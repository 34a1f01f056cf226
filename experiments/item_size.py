"""python -m experiments.item_size: the full rate of ``flux`` by the most inputs an item
holds (``batch_rows``), alternated in one Spark session.

At full rate items are full, so ``batch_rows`` sets how often an item's outputs reach
the egress, hence the steps of the output and the longest gap a failover leaves
(``python -m experiments.failover --max-rate --batch-rows N`` measures that side). Every
item costs each replica numpy and Arrow calls whatever it holds, so a smaller item costs
rate: this measures how much. Each round runs every size once, in rotating order, on the
same packets; every output is checked against the per-record reference. Prints and
writes ``runs.csv`` and ``summary.json`` (medians with min-max, and per round the rate
of each size against the largest) under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
from typing import Any, Dict, List

from experiments.throughput import KINDS, per_round_ratios, replicated_run, spread


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.item_size",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-rows", type=int, nargs="+", default=[16384, 8192])
    ap.add_argument("--operators", choices=KINDS, default="vectorized")
    ap.add_argument("--inputs", type=int, default=600_000, help="packets per run")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--out", default="results/item_size")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.inputs < 1000 or min(args.batch_rows) < 1 or \
            len(set(args.batch_rows)) != len(args.batch_rows):
        ap.error("--rounds >= 1, --inputs >= 1000, --batch-rows distinct and >= 1")
    args.vectorized_input = "batches"  # what replicated_run feeds the vectorized kind
    return args


def summarize(rows: List[Dict[str, Any]], sizes: List[int]) -> Dict[str, Any]:
    """Each size's rates (median, min-max) and, per round, its rate over the largest's."""
    rates = {b: [r["input_rate_tps"] for r in sorted(rows, key=lambda r: r["round"])
                 if r["batch_rows"] == b] for b in sizes}
    largest = max(sizes)
    return {"input_rate_tps": {str(b): spread(v) for b, v in rates.items()},
            "vs_largest": {str(b): per_round_ratios(rates[b], rates[largest])
                           for b in sizes if b != largest},
            "all_exact": all(r["output_matches_reference"] for r in rows)}


def main(argv=None) -> int:
    from flux.examples import paper_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.session import local_cluster
    from flux.testing.workloads import packet_workload

    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, args.nodes)]
    sizes = list(args.batch_rows)
    rows: List[Dict[str, Any]] = []
    with local_cluster(args.nodes + 1) as spark:
        for r in range(args.rounds):
            for b in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:  # rotate
                row = replicated_run(spark, "flux", records, expected, args,
                                     kind=args.operators, batch_rows=b)
                row.update(round=r, batch_rows=b)
                rows.append(row)
                print(row, flush=True)
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = {"operators": args.operators, "inputs": args.inputs, "nodes": args.nodes,
               **summarize(rows, sizes)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
