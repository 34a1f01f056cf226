"""python -m experiments.steady_rate: the highest steady rate of ``flux`` at several item
delays, their bisections alternated probe by probe on one Spark session.

A rate is *steady* when the feed drops nothing and the median end-to-end latency (from
an input's arrival in the feed to its output in the driver) is at most ``--latency-ms``
(``experiments.throughput``'s probe). Below full rate the ingress cuts an item when
``item_delay`` has passed since its first input, so at a fixed rate the delay sets the
items' size, and every item costs each replica of each stage a fixed amount
(docs/results/throughput.md): short delays spend the cores on items, long ones spend
the latency budget waiting. This finds where each delay's steady rate lies.

Writes ``probes.csv`` (every probe), ``summary.json`` (per delay: the highest steady
rate and its probe) and ``steady_rate.png`` (median latency against rate, per delay)
under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
from typing import Any, Dict, List

from experiments.throughput import KINDS, Bisection, probe
from flux.testing.workloads import packet_workload


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.steady_rate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--item-delays", default="0.005,0.02",
                    help="seconds, comma-separated (the default for per-record operators "
                         "is 0.005, for vectorized ones 0.025)")
    ap.add_argument("--operators", choices=KINDS, default="per-record")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--probes", type=int, default=6, help="bisection steps per delay")
    ap.add_argument("--probe-seconds", type=float, default=8.0)
    ap.add_argument("--min-rate", type=float, default=5_000.0)
    ap.add_argument("--max-rate", type=float, default=160_000.0)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--out", default="results/steady_rate")
    args = ap.parse_args(argv)
    args.delays = [float(d) for d in args.item_delays.split(",") if d.strip()]
    if not args.delays or any(d <= 0 for d in args.delays) or args.probes < 1:
        ap.error("--item-delays: positive seconds; --probes >= 1")
    return args


def main(argv=None) -> int:
    from flux.spark.session import local_cluster

    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = int(args.max_rate * args.probe_seconds) + 1000
    records = packet_workload(inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    searches = {d: Bisection(args.min_rate, args.max_rate) for d in args.delays}
    rows: List[Dict[str, Any]] = []
    with local_cluster(args.nodes + 1) as spark:
        for step in range(args.probes):
            k = step % len(args.delays)  # alternated: each delay leads in turn
            for delay in args.delays[k:] + args.delays[:k]:
                search = searches[delay]
                if search.done:
                    continue
                rate = search.next_rate()
                row = probe(spark, rate, args, records, args.operators, item_delay=delay)
                row.update(item_delay_s=delay, step=step)
                search.took(rate, row)
                rows.append(row)
                print(row, flush=True)
    summary = {"settings": {k: v for k, v in vars(args).items()},
               "operators": args.operators,
               "delays": {str(d): {"highest_steady_tps": round(s.best) if s.best else None,
                                   "probe": next((r for r in s.probes if r["steady"] and
                                                  r["rate_asked_tps"] == round(s.best)), None)
                                   if s.best else None}
                          for d, s in searches.items()},
               "output_matches_reference": all(r["output_matches_reference"] is not False
                                               for r in rows)}
    with open(out / "probes.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(rows, args, out / "steady_rate.png")
    for d, s in summary["delays"].items():
        print(f"item_delay {d} s: highest steady rate {s['highest_steady_tps']}")
    print(f"wrote {out}/probes.csv, summary.json, steady_rate.png")
    return 0 if summary["output_matches_reference"] else 1


def plot(rows: List[Dict[str, Any]], args, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for delay in args.delays:
        mine = sorted((r["rate_asked_tps"], r["latency_p50_ms"]) for r in rows
                      if r["item_delay_s"] == delay and r["latency_p50_ms"] is not None)
        ax.plot([m[0] for m in mine], [m[1] for m in mine], "o-",
                label=f"item_delay {delay * 1000:g} ms")
    ax.axhline(args.latency_ms, color="grey", linestyle=":", label="latency bound")
    ax.set_xlabel("inputs/s (fed)")
    ax.set_ylabel("median latency, ms")
    ax.set_title(f"flux, {args.operators} operators, {args.nodes} nodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
