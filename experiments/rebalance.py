"""python -m experiments.rebalance: the metric-driven rebalancing policy on a skewed feed.

DESIGN 13; docs/design/rescaling.md; docs/results/rebalance.md. One embedded
local-cluster. A one-stage keyed dataflow (``regrouping_dataflow(1)``) over 4 pairs reads
``--rate`` inputs a second for ``--seconds``; a share ``--hot`` of the inputs have keys
whose key groups partition 0 owns, the rest keys of the other partitions. Each run is
with ``rebalance=flux.Rebalance(every=--every)`` or without it, alternated, ``--runs``
of each.

Measured per run, from the nodes' counters sampled every second: each partition's share
of the inputs per second, and the imbalance (the busiest partition's inputs over the
mean) in the first ``--every`` seconds and in the last third of the run; the policy's
moves (when, which groups, where); the output latency (arrival at the sink minus the
input's arrival at the source) at the 99th percentile in those two windows; whether the
output is the failure-free run's. Writes ``runs.csv`` (one row per run), ``shares.csv``
(per run, second and partition), ``summary.json`` (medians with min-max per mode) and
``rebalance.png`` (each partition's share over time in the first run of each mode).
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import statistics
import tempfile
import threading
import time
from typing import Any, Dict, List

from experiments.live_rescale import Stamped

PARTITIONS = 4


def skewed_records(n: int, hot: float) -> list:
    """``n`` records ``(key, i)``: a share ``hot`` of them of 40 keys of partition 0's
    groups, the rest of 120 keys of the other partitions'."""
    from exchange.partitioner import HashPartitioner

    groups = HashPartitioner(1, 256)
    keys = [f"k{i}" for i in range(1000)]
    hot_keys = [k for k in keys if groups.group(k) < 256 // PARTITIONS][:40]
    cold_keys = [k for k in keys if groups.group(k) >= 256 // PARTITIONS][:120]
    every = round(1 / (1 - hot)) if hot < 1 else 0
    return [(cold_keys[i % 120] if every and i % every == 0 else hot_keys[i % 40], i)
            for i in range(n)]


class Sampler:
    """Each partition's inputs taken, from the nodes' last counters, every second."""

    def __init__(self, job):
        self.job, self.rows = job, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            taken = [0] * PARTITIONS
            for _, stats in list(self.job.controller.node_stats.values()):
                for s in stats.segments:
                    if s.addr.stage == 1:
                        p = s.addr.partition
                        taken[p] = max(taken[p], s.taken)
            self.rows.append((time.monotonic(), taken))

    def shares(self) -> List[tuple]:
        """(time, inputs/s of each partition) between successive samples."""
        out = []
        for (t0, a), (t1, b) in zip(self.rows, self.rows[1:]):
            if all(y >= x for x, y in zip(a, b)):
                out.append((t1, [(y - x) / (t1 - t0) for x, y in zip(a, b)]))
        return out


def imbalance(rates: List[float]) -> float:
    mean = sum(rates) / len(rates)
    return max(rates) / mean if mean else 0.0


def p99(values: List[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else 0.0


def run_one(spark, records: list, expected: list, args, rebalance: bool, index: int):
    from flux import Rebalance
    from flux.connectors.sources import Paced
    from flux.operator import wire_form
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    stamped, source = Stamped(), Paced(records, args.rate)
    with tempfile.TemporaryDirectory() as location:
        job = FluxJob(spark, regrouping_dataflow(1), source, nodes=PARTITIONS, standbys=0,
                      sink=stamped.write, checkpoint=location, checkpoint_interval=1.0,
                      rebalance=Rebalance(every=args.every) if rebalance else None)
        with job, Sampler(job) as sampler:
            job.wait(timeout=args.seconds * 4 + 120)
            moves = [(t, what) for t, kind, what in job.metrics.events if kind == "rebalanced"]
    start, end = source.start, source.start + len(records) / args.rate
    shares = [(t - start, rates) for t, rates in sampler.shares() if t <= end]
    first = [imbalance(r) for t, r in shares if t <= args.every]
    last = [imbalance(r) for t, r in shares if t >= args.seconds * 2 / 3]
    lat = [(t - start, t - (start + (sn - 1) / args.rate)) for t, sn, _ in stamped.rows]
    row = {"run": index, "rebalance": rebalance,
           "imbalance_first": round(statistics.median(first), 3) if first else None,
           "imbalance_last_third": round(statistics.median(last), 3) if last else None,
           "moves": len(moves),
           "first_move_at_s": round(moves[0][0] - start, 2) if moves else None,
           "groups_moved": sum(w[2] - w[1] + 1 for _, w in moves),
           "latency_p99_first_s": round(p99([x for t, x in lat if t <= args.every]), 4),
           "latency_p99_last_third_s": round(p99([x for t, x in lat
                                                   if t >= args.seconds * 2 / 3]), 4),
           "exact": [wire_form(r) for _, _, r in stamped.rows] == expected,
           "restarts": len(job.restart_log)}
    print(json.dumps(row), flush=True)
    return row, shares, [(round(t - start, 2), w[:4]) for t, w in moves]


def plot(runs: Dict[bool, tuple], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, mode in zip(axes, (False, True)):
        if mode not in runs:
            continue
        shares, moves = runs[mode]
        for p in range(PARTITIONS):
            ax.plot([t for t, _ in shares], [r[p] for _, r in shares], label=f"partition {p}")
        for t, _ in moves:
            ax.axvline(t, color="grey", linestyle=":")
        ax.set_title("rebalance=Rebalance(...)" if mode else "no rebalancing")
        ax.set_xlabel("seconds")
    axes[0].set_ylabel("inputs/s")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def spread(values: List[float]) -> Any:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": min(values),
            "max": max(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.rebalance",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=4000.0)
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--hot", type=float, default=0.75)
    ap.add_argument("--every", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default="docs/results/rebalance")
    args = ap.parse_args(argv)
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.session import local_cluster
    from flux.testing.dataflows import regrouping_dataflow

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = skewed_records(int(args.rate * args.seconds), args.hot)
    expected = [wire_form(r) for _, r in reference_output(regrouping_dataflow(1), records,
                                                          PARTITIONS)]
    rows, firsts, share_rows = [], {}, []
    with local_cluster(PARTITIONS + 1) as spark:
        for index in range(args.runs):
            for mode in (False, True):  # alternated
                row, shares, moves = run_one(spark, records, expected, args, mode, index)
                rows.append(row)
                share_rows += [(index, mode, round(t, 2), *[round(x) for x in r])
                               for t, r in shares]
                firsts.setdefault(mode, (shares, moves))
                if mode:
                    row["moves_made"] = json.dumps(moves)
    with open(out / "runs.csv", "w", newline="") as f:
        fields = sorted({k for r in rows for k in r})
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(out / "shares.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "rebalance", "t_s"] + [f"partition_{p}" for p in range(PARTITIONS)])
        w.writerows(share_rows)
    summary = {str(mode): {k: spread([r[k] for r in rows if r["rebalance"] is mode])
                           for k in ("imbalance_first", "imbalance_last_third",
                                     "latency_p99_first_s", "latency_p99_last_third_s",
                                     "moves", "groups_moved", "first_move_at_s")}
               for mode in (False, True)}
    summary["all_exact"] = all(r["exact"] for r in rows)
    summary["args"] = vars(args)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(firsts, out / "rebalance.png")
    print(json.dumps(summary, indent=1))
    return 0 if summary["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
