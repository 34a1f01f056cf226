"""python -m experiments.partition_pauses: does one partition's pause hold up the others'
output? An egress per partition (``ordered_output=False``) against the one ordered egress
(docs/design/parallel_io.md).

A keyed dataflow (``KeyedCounter`` stages with ``--state-mb`` of keyed state per
partition, so a catch-up moves real state and pauses its partition at the end) runs on
an embedded local-cluster at a steady rate; one node is killed. Its partitions' outputs
wait for the detection, and the partitions whose replica is rebuilt pause during their
catch-up; every other last-stage partition has no reason to wait, except what couples it:
the one ordered egress (its merge releases an output only once every partition has passed
its SN), or an upstream stage whose partition paused (every last-stage partition merges
every upstream partition's items by SN, DESIGN 4.3), or a paused partition's full buffer
at the producers that feed every partition (``pause_room=1``; by default a paused
partition's buffer may hold 8 times its capacity, docs/design/backpressure.md). The mode
``per-partition-burn`` kills nothing and spins processes on the cores instead, a control
for how long the partitions wait when only the machine stalls. The modes run alternately,
``--runs`` times each, on one Spark session.

Per run and last-stage partition it records the largest wait between two of that
partition's outputs before the kill (steady state) and after it (detection, take-over,
catch-up), and writes

- ``runs.csv``: one row per run and partition (with when its longest wait after the
  kill ended);
- ``events.csv``: what the job did after each kill (detection, take-over, the catch-up's
  pause, its end), in seconds after the kill;
- ``summary.json``: per mode, the medians (and spreads) over runs of the largest wait after
  the kill of the partitions the kill touched and of those it did not, and of the steady
  state's; and whether every partition's output equalled the failure-free run's.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Tuple

from flux.connector_api import CommitsBySN, SinkPerPartition
from flux.operator import wire_form
from flux.protocol.producer import PAUSE_ROOM
from flux.reference import ReferenceRun
from flux.testing.dataflows import counting_dataflow, with_ballast
from flux.testing.workloads import keyed_workload

#: mode -> (ordered_output, pause_room, egress on the executors)
MODES = {"ordered": (True, PAUSE_ROOM, False), "per-partition": (False, PAUSE_ROOM, False),
         "per-partition-room-1": (False, 1, False),
         "per-partition-executors": (False, PAUSE_ROOM, True),
         "per-partition-burn": (False, PAUSE_ROOM, False)}
#: modes that kill nothing: at ``--kill-at`` the machine's cores are taken instead
#: (``--burners`` processes spinning for ``--burn-seconds``), a control for how long the
#: partitions wait when only the machine stalls, as during a catch-up's bulk phase
BURN_MODES = {"per-partition-burn"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.partition_pauses",
                                 description="Per-partition output gaps through a kill: one "
                                             "ordered egress against an egress per partition.")
    ap.add_argument("--runs", type=int, default=3, help="runs of each mode, alternated")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rate", type=int, default=4000, help="inputs per second")
    ap.add_argument("--duration", type=float, default=16.0, help="seconds of input")
    ap.add_argument("--kill-at", type=float, default=6.0)
    ap.add_argument("--state-mb", type=float, default=50.0, help="keyed state per partition")
    ap.add_argument("--capacity", type=int, default=16,
                    help="sub-items a connection's buffer holds (the job's capacity)")
    ap.add_argument("--victim", default="node1")
    ap.add_argument("--splits", type=int, default=0,
                    help="read the input as K splits on the executors (ListSplits, dealt "
                         "by key) instead of the driver's feed: then no input and, with "
                         "per-partition-executors, no output crosses the driver")
    ap.add_argument("--burners", type=int, default=2,
                    help="per-partition-burn: processes spinning instead of the kill")
    ap.add_argument("--burn-seconds", type=float, default=1.5,
                    help="per-partition-burn: how long they spin (a catch-up's bulk phase)")
    ap.add_argument("--out", default="docs/results/partition_pauses")
    args = ap.parse_args(argv)
    if args.splits and "ordered" in args.modes:
        ap.error("--splits numbers the inputs in epochs, not as the reference does: the "
                 "ordered mode's partitions cannot be told from its one stream; give "
                 "--modes of the per-partition kinds")
    return args


class Arrivals:
    """When each output reached the sink, per last-stage partition: the sinks are called
    in the driver's egress thread."""

    def __init__(self, partition_of: Dict[tuple, int]):
        self.partition_of = partition_of
        self.times: Dict[int, List[float]] = {}
        self.outputs: Dict[int, List[Any]] = {}
        self._lock = threading.Lock()

    def sink(self, partition=None):
        def take(item):
            sn = tuple(item[0])
            p = self.partition_of[sn] if partition is None else partition
            with self._lock:
                self.times.setdefault(p, []).append(time.monotonic())
                self.outputs.setdefault(p, []).append(wire_form(item))
        return take


class TimedFileSink(CommitsBySN):
    """An exactly-once sink of one partition on an executor that writes, with each output,
    when the egress handed it over (``time.monotonic``: one clock for every process of a
    machine), so the driver can place the partition's waits after the job. What it keeps
    and drops is ``CommitsBySN``'s; it commits when the writer does."""

    name = "TimedFileSink"

    def __init__(self, path: str):
        self.path = path
        committed = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    committed = tuple(json.loads(line)[1])
        super().__init__(committed, commit_every=1 << 30)

    def write(self, items) -> None:
        now = time.monotonic()
        super().write([(sn, (now, record)) for sn, record in items])

    def _commit(self, rows: list, sn) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps([t, list(sn), record]) + "\n"
                         for sn, (t, record) in rows)


class TimedFiles:
    """``SinkPerPartition``'s opener: partition p's ``TimedFileSink`` in ``folder``."""

    def __init__(self, folder: str):
        self.folder = folder

    def __call__(self, partition: int) -> TimedFileSink:
        return TimedFileSink(os.path.join(self.folder, f"{partition}.jsonl"))

    def read(self, partition: int) -> List[list]:
        """``[time, sn, record]`` rows of the partition, as committed."""
        path = os.path.join(self.folder, f"{partition}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f]


def by_key(outputs: List[Any]) -> Dict[Any, List[Any]]:
    """A partition's outputs key by key, each key's in order: what a split source keeps
    (it numbers the splits' inputs in an order of its own, each key's in order)."""
    out: Dict[Any, List[Any]] = {}
    for _, record in outputs:
        out.setdefault(json.dumps(record[0]), []).append(record)
    return out


def largest_gap(times: List[float], start: float, end: float) -> float:
    """The longest wait between two outputs, of the waits that ended in ``(start, end]``."""
    return largest_gap_and_end(times, start, end)[0]


def largest_gap_and_end(times: List[float], start: float, end: float) -> tuple:
    """The longest wait ending in ``(start, end]``, and when it ended (None: no wait)."""
    return max(((b - a, b) for a, b in zip(times, times[1:]) if start < b <= end),
               default=(0.0, None))


def burn(burners: int, seconds: float) -> None:
    """``burners`` processes spinning on the machine's cores for ``seconds``; returns once
    they ended (each stopped by its PID should it outlive them)."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(burners)]
    try:
        for proc in procs:
            proc.wait(timeout=seconds + 30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def one_run(spark, mode: str, args, records, expected) -> Tuple[List[Dict[str, Any]], list]:
    from flux.connectors.sources import RateLimited
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob

    dataflow = with_ballast(counting_dataflow(args.stages), args.state_mb)
    arrivals = Arrivals(expected["partition_of"])
    ordered, pause_room, on_executors = MODES[mode]
    files = TimedFiles(tempfile.mkdtemp(prefix="flux-pauses-")) if on_executors else None
    sink = arrivals.sink() if ordered else SinkPerPartition(files or arrivals.sink)
    source = (ListSplits.by_key(records, args.splits, key=lambda r: r[0],
                                rate=args.rate / args.splits) if args.splits
              else RateLimited(records, args.rate))
    job = FluxJob(spark, dataflow, source, nodes=args.nodes,
                  standbys=1, sink=sink, ordered_output=ordered, pause_room=pause_room,
                  capacity=args.capacity, egress_on_executors=on_executors)
    with job:
        touched = {a.partition for a, n in job.topology.where.items()
                   if n == args.victim and a.stage == args.stages}
        assert job.wait_until(lambda: job.metrics.t0 is not None and
                              time.monotonic() - job.metrics.t0 >= args.kill_at, 120)
        killed = time.monotonic()
        if mode in BURN_MODES:
            touched = set()
            burn(args.burners, args.burn_seconds)
        else:
            try:
                job.kill_node(args.victim)
            except RuntimeError:  # it died before: say what the job saw
                print("the job's events before the kill:", job.metrics.relative_events())
                raise
        rec = lambda: job.controller.recovery  # noqa: E731
        job.wait(timeout=args.duration * 4 + 120)
        if mode not in BURN_MODES:
            assert job.wait_until(lambda: rec().completed and not rec().pending(), 120)
        t0 = job.metrics.t0
        ended = time.monotonic()
        # what the job did after the kill, to place each partition's longest wait
        events = [(round(t - killed, 4), what, str(detail)) for t, what, detail
                  in job.metrics.events if t >= killed]
    if files is not None:
        for p in range(args.nodes):
            got = files.read(p)
            arrivals.times[p] = [t for t, _, _ in got]
            arrivals.outputs[p] = [[sn, record] for _, sn, record in got]
        shutil.rmtree(files.folder, ignore_errors=True)
    same = ((lambda got, want: by_key(got) == by_key(want)) if args.splits
            else (lambda got, want: got == want))
    rows = []
    for p in range(args.nodes):
        times = arrivals.times.get(p, [])
        gap, gap_end = largest_gap_and_end(times, killed, ended)
        rows.append({
            "mode": mode, "partition": p, "touched": p in touched,
            "outputs": len(times),
            "same_as_failure_free": same(arrivals.outputs.get(p, []),
                                         expected["by_partition"][p]),
            # steady state: from a second in, up to the kill
            "largest_gap_before_s": round(largest_gap(times, t0 + 1.0, killed), 4),
            "largest_gap_after_s": round(gap, 4),
            # seconds from the kill to the end of that wait
            "largest_gap_after_ends_s": None if gap_end is None else round(gap_end - killed, 4),
        })
    return rows, events


def summarize(rows: List[Dict[str, Any]], modes) -> Dict[str, Any]:
    def spread(values):
        values = sorted(values)
        return {"median": round(statistics.median(values), 4), "min": values[0],
                "max": values[-1], "n": len(values)} if values else None

    out: Dict[str, Any] = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        out[mode] = {
            "largest_gap_after_kill_untouched_s": spread(
                [r["largest_gap_after_s"] for r in mine if not r["touched"]]),
            "largest_gap_after_kill_touched_s": spread(
                [r["largest_gap_after_s"] for r in mine if r["touched"]]),
            "largest_gap_steady_s": spread([r["largest_gap_before_s"] for r in mine]),
            "every_partition_same_as_failure_free": all(r["same_as_failure_free"]
                                                        for r in mine),
        }
    return out


def reference(args, records) -> Dict[str, Any]:
    run = ReferenceRun(with_ballast(counting_dataflow(args.stages), 0), args.nodes)
    outputs = [o for r in records for o in run.feed(r)]
    by: Dict[int, list] = {p: [] for p in range(args.nodes)}
    partition_of = {}
    for output, p in zip(outputs, run.output_partitions):
        by[p].append(wire_form(output))
        partition_of[tuple(output[0])] = p
    return {"by_partition": by, "partition_of": partition_of}


def main(argv=None) -> int:
    from flux.spark.session import local_cluster

    args = parse_args(argv)
    records = keyed_workload(int(args.rate * args.duration), seed=11, keys=2000)
    expected = reference(args, records)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    timeline: List[Dict[str, Any]] = []
    with local_cluster(args.nodes + 2) as spark:
        for run in range(args.runs):
            k = run % len(args.modes)  # alternated: each mode leads in turn
            for mode in args.modes[k:] + args.modes[:k]:
                print(f"run {run + 1}/{args.runs}: {mode} ...", flush=True)
                mine, events = one_run(spark, mode, args, records, expected)
                rows.extend({"run": run, **row} for row in mine)
                timeline.extend({"run": run, "mode": mode, "after_kill_s": t, "event": what,
                                 "detail": detail} for t, what, detail in events)
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "events.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", "mode", "after_kill_s", "event", "detail"])
        writer.writeheader()
        writer.writerows(timeline)
    summary = {"settings": vars(args), **summarize(rows, args.modes)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for mode in args.modes:
        s = summary[mode]
        print(f"{mode:20s} largest gap after the kill: untouched partitions "
              f"{s['largest_gap_after_kill_untouched_s']}, touched "
              f"{s['largest_gap_after_kill_touched_s']}; steady {s['largest_gap_steady_s']}; "
              f"same as failure-free: {s['every_partition_same_as_failure_free']}")
    print(f"wrote {out}/runs.csv, events.csv, summary.json")
    return 0 if all(summary[m]["every_partition_same_as_failure_free"]
                    for m in args.modes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
