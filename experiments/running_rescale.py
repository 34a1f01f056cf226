"""python -m experiments.running_rescale: ``job.rescale(n)`` on a running job, with one
ordered egress and with a sink per partition (drained first).

DESIGN 13; docs/design/rescaling.md. One embedded local-cluster. A job of ``--old``
nodes reads ``--inputs`` keyed records at ``--rate`` per second (the regrouping
dataflow: its output does not depend on the count), checkpointing every second; once
two checkpoints are complete, ``job.rescale(--new)``, and the job runs to its end. Two
modes, ``--runs`` rounds each, alternated (``ordered`` first in rounds 0, 2, ...):

- ``ordered``: one ordered egress into one sink: a checkpoint cut at once, the restart
  from it;
- ``drained``: ``ordered_output=False``, a sink per partition: the source read no
  further than the cut, every sink partition committing up to it, then the restart.

Measured per run: seconds ``job.rescale`` took (its return: the data flows again), the
longest gap between two outputs reaching the sinks (the stall a user sees), and whether
the sinks together hold the failure-free output, each output once. Writes
``summary.json`` (medians with min-max per mode) and ``runs.csv``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import tempfile
import threading
import time
from typing import Any, Dict, List

#: seconds of output at the start and end a gap is not looked for in (the job's start
#: and its drain at the end are not the rescale's)
EDGE = 0.5


class Stamped:
    """Sinks that note when each output arrived, for one partition or all."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: List[tuple] = []  # (arrival, sn, record)

    def sink(self, partition: int = 0):
        def write(item) -> None:
            with self.lock:
                self.rows.append((time.monotonic(), tuple(item[0]), item[1]))
        return write

    def longest_gap(self, after: float) -> float:
        """The longest time between two outputs that arrived after ``after``."""
        times = sorted(t for t, _, _ in self.rows if t > after)
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def run_one(spark, records: list, want: list, mode: str, old: int, new: int,
            rate: float, location: str) -> Dict[str, Any]:
    from flux.connector_api import SinkPerPartition
    from flux.connectors.sources import Paced
    from flux.operator import wire_form
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    stamped = Stamped()
    ordered = mode == "ordered"
    sink = stamped.sink() if ordered else SinkPerPartition(stamped.sink)
    job = FluxJob(spark, regrouping_dataflow(2), Paced(records, rate), nodes=old, standbys=0,
                  sink=sink, checkpoint=location, checkpoint_interval=1.0,
                  ordered_output=ordered)
    with job:
        job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        asked = time.monotonic()
        job.rescale(new)
        took = time.monotonic() - asked
        job.wait(timeout=600)
    rows = sorted((sn, record) for _, sn, record in stamped.rows)
    return {"round": 0, "mode": mode, "old": old, "new": new, "rescale_s": round(took, 3),
            "longest_gap_s": round(stamped.longest_gap(asked - EDGE), 3),
            "outputs": len(rows),
            "exact": wire_form(rows) == wire_form(sorted((tuple(sn), r) for sn, r in want))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.running_rescale",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=30_000)
    ap.add_argument("--rate", type=float, default=4000.0)
    ap.add_argument("--old", type=int, default=4)
    ap.add_argument("--new", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="docs/results/running_rescale")
    args = ap.parse_args(argv)
    from experiments.rescale import summarize
    from flux.reference import reference_output
    from flux.spark.session import local_cluster
    from flux.testing.dataflows import regrouping_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(args.inputs, seed=7, keys=300)]
    want = reference_output(regrouping_dataflow(2), records, args.old)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="flux-running-rescale-") as tmp, \
            local_cluster(max(args.old, args.new)) as spark:
        for r in range(args.runs):
            modes = ["ordered", "drained"]
            for mode in modes if r % 2 == 0 else modes[::-1]:
                run = run_one(spark, records, want, mode, args.old, args.new, args.rate,
                              str(pathlib.Path(tmp) / f"run{r}-{mode}"))
                run["round"] = r
                print(json.dumps(run), flush=True)
                runs.append(run)
    summary = {"inputs": args.inputs, "rate": args.rate, "old": args.old, "new": args.new,
               "runs": args.runs, **summarize(runs, ("ordered", "drained"),
                                              ("rescale_s", "longest_gap_s"))}
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["ordered_exact"] and summary["drained_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
