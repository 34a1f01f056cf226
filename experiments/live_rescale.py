"""python -m experiments.live_rescale: live rescales among running pairs, no restart.

DESIGN 13; docs/design/rescaling.md; docs/results/live_rescale.md. One embedded
local-cluster. A job of ``--pairs`` pairs (no standby) keeps ``--value-bytes`` per key
(``flux.testing.payload.KeyedPayload``, state keyed by the stage's key) and reads at
``--rate`` per second: first ``--mb`` megabytes of state per partition at the first
count of ``--counts`` (records of distinct keys), then updates of those keys. At its
first checkpoint ``job.spread_key_groups(counts[0])`` puts every key on the first
pairs (little state yet); once the state is built, each next count is reached live
(``spread_key_groups``), ``--settle`` seconds apart. ``--runs`` runs. ``--kill``: at
each rescale the node of the replica P of the last partition that gains groups is
killed ``--kill-after`` seconds after the ask (the bulk on its way), with one standby.
``--dormant``: the job starts with the first count of pairs and the others dormant
(``max_nodes=--pairs``, two more standbys), and a rescale to more starts them on the
standbys first (``job.rescale``; ``pairs_started_s``: seconds from the ask until every
process applied the join), and a rescale to fewer stops the pairs past it once their keys
moved (``job.rescale``; ``pairs_left_s``: seconds from the ask until the controller's
view stopped them; their nodes are standbys again). ``--sink-per-partition``: a sink per partition (the one stage is the last, so each move
changes its keys' sink partition: the two partitions' egresses hold what is past the
move's cut until a checkpoint covers it, docs/design/rescaling.md).

Measured per live rescale: seconds from the ask to its return (a complete checkpoint
covers it) and to the last range installed at both replicas of its destination
(``done_s``), the ranges moved (and how many in two phases: a bulk first, then the
changes), the longest pause of a destination replica (from the step that crossed the
move's cut to the end of the install: it processes nothing meanwhile) and of a source
replica (the steps that packed the bulk and the changes), the longest gap
between two outputs reaching one sink partition in the ``--settle / 2`` seconds after the ask
against the same in as many seconds before it (no move: the machine's own jitter), and
the longest output latency in both windows. Whether the sink holds the failure-free
output. Writes ``runs.csv`` (one row per rescale), ``summary.json`` (medians with
min-max per rescale) and ``live_rescale.png`` (output rate and latency over time of the
first run, the rescales marked).
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

#: seconds before the end of the build a rescale waits for (the state at its size)
BUILD_MARGIN = 0.5


class Stamped:
    """A sink noting when each output arrived, its input's SN and its sink partition
    (0 with one ordered sink)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: List[tuple] = []  # (arrival, input SN, record, sink partition)

    def write(self, item, partition: int = 0) -> None:
        with self.lock:
            self.rows.append((time.monotonic(), int(item[0][0]), item[1], partition))

    def partition(self, p: int):
        """The sink of partition ``p`` (``SinkPerPartition``)."""
        return lambda item: self.write(item, p)

    def window(self, lo: float, hi: float) -> List[tuple]:
        with self.lock:
            return [r for r in self.rows if lo <= r[0] < hi]


def longest_gap(rows: List[tuple]) -> float:
    """The longest time between two outputs of one sink partition."""
    return max((_gap([r for r in rows if r[3] == p]) for p in {r[3] for r in rows}),
               default=0.0)


def _gap(rows: List[tuple]) -> float:
    times = sorted(r[0] for r in rows)
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def longest_latency(rows: List[tuple], start: float, rate: float) -> float:
    """Arrival at the sink minus the input's arrival at the source (input ``n`` arrives
    ``(n - 1) / rate`` seconds after the source's first read, ``Paced``)."""
    return max((r[0] - (start + (r[1] - 1) / rate) for r in rows), default=0.0)


def run_one(spark, records: list, counts: List[int], args, location: str,
            index: int) -> tuple:
    from flux.connectors.sources import Paced
    from flux.dataflow import Dataflow, Stage
    from functools import partial
    from flux.spark.job import FluxJob
    from flux.testing.counter import first_field
    from flux.testing.payload import KeyedPayload

    dataflow = Dataflow([Stage("payload", first_field,
                               (partial(KeyedPayload, value_bytes=args.value_bytes),))])
    from flux.connector_api import SinkPerPartition

    stamped, source = Stamped(), Paced(records, args.rate)
    sink = SinkPerPartition(stamped.partition) if args.sink_per_partition else stamped.write
    nodes = dict(nodes=counts[0], max_nodes=args.pairs) if args.dormant else \
        dict(nodes=args.pairs)
    job = FluxJob(spark, dataflow, source, standbys=_standbys(args), sink=sink,
                  ordered_output=not args.sink_per_partition,
                  checkpoint=location, checkpoint_interval=1.0, **nodes)
    rows: List[Dict[str, Any]] = []
    with job:
        job.wait_until(lambda: len(job.checkpoints.completed) >= 1, 120)
        covered = job.checkpoints.completed[-1].number if args.dormant else \
            job.spread_key_groups(counts[0], timeout=120)
        built = source.start + args.keys / args.rate + BUILD_MARGIN
        time.sleep(max(0.0, built - time.monotonic()))
        previous = counts[0]
        for count in counts[1:]:
            asked = time.monotonic()
            after = covered  # this rescale's moves ride a later cut than the last one's
            killer = _kill_later(job, previous, count, args) if args.kill else None
            if args.dormant or count > job.running_pairs:  # pairs start or leave
                job.rescale(count, timeout=120)
                covered = job.checkpoints.completed[-1].number
            else:
                covered = job.spread_key_groups(count, timeout=120)
            returned = time.monotonic() - asked
            started = [t for t, kind, _ in list(job.metrics.events)
                       if kind == "pairs started" and t >= asked]
            left = [t for t, kind, _ in list(job.metrics.events)
                    if kind == "pairs left" and t >= asked]
            killed = killer.join() if killer is not None else ""
            job.wait_until(lambda: len(_moved(job, after)) >= _moves(previous, count, args),
                           60)
            moved = _moved(job, after)
            done = max((t for t, _ in moved), default=asked) - asked
            time.sleep(max(0.0, asked + args.settle - time.monotonic()))
            half = args.settle / 2  # (the window before is clear of the last rescale's)
            before = stamped.window(asked - half, asked)
            after = stamped.window(asked, asked + half)
            rows.append({
                "run": index, "rescale": f"{previous}->{count}", "asked_at_s":
                    round(asked - source.start, 3), "return_s": round(returned, 3),
                "done_s": round(done, 3), "ranges": len(moved), "killed": killed,
                "pairs_started_s": round(started[0] - asked, 3) if started else "",
                "pairs_left_s": round(left[0] - asked, 3) if left else "",
                "longest_pause_s": max((what[6] for _, what in moved), default=0.0),
                "longest_source_pause_s": max((what[7] for _, what in moved), default=0.0),
                "ranges_in_two_phases": sum(what[8] is not None for _, what in moved),
                "gap_before_s": round(longest_gap(before), 4),
                "gap_after_s": round(longest_gap(after), 4),
                "latency_before_s": round(longest_latency(before, source.start, args.rate), 4),
                "latency_after_s": round(longest_latency(after, source.start, args.rate), 4)})
            print(json.dumps(rows[-1]), flush=True)
            previous = count
        job.wait(timeout=600)
    return rows, stamped.rows, source.start, job.restart_log


class _Killer(threading.Thread):
    """Kills the node of a destination's replica P ``delay`` seconds after the ask: the
    bulk is then on its way (the first phase of the move)."""

    def __init__(self, job, victim, delay: float):
        super().__init__(name="live-rescale-kill", daemon=True)
        self.job, self.victim, self.delay, self.node = job, victim, delay, ""

    def run(self) -> None:
        placed = self.job.controller.recovery.placed
        while self.victim not in placed():  # a dormant pair's: once it starts
            time.sleep(0.005)
        time.sleep(self.delay)
        self.node = placed()[self.victim]
        self.job.kill_node(self.node)

    def join(self, timeout=None) -> str:
        super().join(timeout)
        return f"{self.victim} on {self.node}"


def _kill_later(job, old: int, new: int, args) -> _Killer:
    """A killer of the replica P of the last partition that gains groups."""
    from exchange.group_map import GroupMap
    from exchange.partitioner import KEY_GROUPS
    from flux.addresses import P, Addr

    moves = GroupMap.even(old, KEY_GROUPS, args.pairs).moves_to(
        GroupMap.even(new, KEY_GROUPS, args.pairs), 1)
    killer = _Killer(job, Addr(1, max(m.dest for m in moves), P), args.kill_after)
    killer.start()
    return killer


def _standbys(args) -> int:
    """Standbys: one for a kill's rebuild; two more for the dormant pairs to start on."""
    return int(args.kill) + 2 * args.dormant


def _moved(job, after: int) -> List[tuple]:
    """The ranges moved at cuts after checkpoint ``after``: (when, what) each."""
    return [(t, what) for t, kind, what in list(job.metrics.events)
            if kind == "range moved" and what[5] > after]


def _moves(old: int, new: int, args) -> int:
    """How many ranges change owner from ``old`` partitions to ``new``."""
    from exchange.group_map import GroupMap
    from exchange.partitioner import KEY_GROUPS

    return len(GroupMap.even(old, KEY_GROUPS, args.pairs).moves_to(
        GroupMap.even(new, KEY_GROUPS, args.pairs), 1))


def summarize(rows: List[dict]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for rescale in dict.fromkeys(r["rescale"] for r in rows):
        mine = [r for r in rows if r["rescale"] == rescale]
        for field in ("return_s", "done_s", "pairs_started_s", "pairs_left_s",
                      "longest_pause_s",
                      "longest_source_pause_s", "gap_before_s",
                      "gap_after_s", "latency_before_s", "latency_after_s"):
            values = [r[field] for r in mine if r.get(field, "") != ""]
            if not values:
                continue
            out[f"{rescale} {field}"] = {"median": round(statistics.median(values), 4),
                                         "min": min(values), "max": max(values)}
    return out


def plot(outputs: List[tuple], start: float, rate: float, rows: List[dict],
         path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = sorted((t - start, t - (start + (sn - 1) / rate)) for t, sn, *_ in outputs)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    end = times[-1][0] if times else 1.0
    bins = [i * 0.1 for i in range(int(end / 0.1) + 2)]
    top.hist([t for t, _ in times], bins=bins, color="tab:blue")
    top.set_ylabel("outputs per 100 ms")
    bottom.plot([t for t, _ in times], [lat * 1000 for _, lat in times], ",", color="tab:red")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since the source's first read")
    for r in rows:
        for ax in (top, bottom):
            ax.axvline(r["asked_at_s"], color="black", linestyle="--", linewidth=0.8)
        top.annotate(r["rescale"], (r["asked_at_s"], 0), xytext=(3, 3),
                     textcoords="offset points", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.live_rescale",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--counts", default="4,6,3")
    ap.add_argument("--mb", type=float, default=8.5)
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=4000.0)
    ap.add_argument("--settle", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="docs/results/live_rescale")
    ap.add_argument("--kill", action="store_true",
                    help="at each rescale, kill the node of a destination's replica P "
                         "--kill-after seconds after the ask (one standby rebuilds it)")
    ap.add_argument("--kill-after", type=float, default=0.05)
    ap.add_argument("--sink-per-partition", action="store_true",
                    help="a sink per partition (ordered_output=False): the one stage is "
                         "the last, so its moves change its keys' sink partition, and "
                         "the egresses of the partitions a move touches hold what is "
                         "past its cut until a checkpoint covers it")
    ap.add_argument("--dormant", action="store_true",
                    help="the job runs the first count of pairs and keeps the others "
                         "dormant (max_nodes=--pairs); a rescale to more starts them on "
                         "two standbys (job.rescale), to fewer spreads the keys over "
                         "fewer and stops the others (job.rescale)")
    args = ap.parse_args(argv)
    from flux.operator import wire_form
    from flux.spark.session import local_cluster
    from flux.testing.payload import payload_records

    counts = [int(c) for c in args.counts.split(",")]
    args.keys = int(args.mb * 1e6 * counts[0] / (args.value_bytes + 13))
    updates = int(args.rate * (args.settle * len(counts) + 2))
    records = payload_records(args.keys, updates)
    want = [(i + 1, wire_form(r)) for i, r in enumerate(records)]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[dict] = []
    exact = True
    with tempfile.TemporaryDirectory(prefix="flux-live-rescale-") as tmp, \
            local_cluster(args.pairs + _standbys(args)) as spark:
        for r in range(args.runs):
            mine, outputs, start, restarts = run_one(spark, records, counts, args,
                                                     str(pathlib.Path(tmp) / f"run{r}"), r)
            got = sorted((sn, wire_form(rec)) for _, sn, rec, _ in outputs)
            exact &= got == want and not restarts
            rows += mine
            if r == 0:
                plot(outputs, start, args.rate, mine, out / "live_rescale.png")
    summary = {"pairs": args.pairs, "kill": args.kill, "counts": counts,
               "dormant": args.dormant,
               "sink_per_partition": args.sink_per_partition,
               "mb_per_partition": args.mb,
               "keys": args.keys, "value_bytes": args.value_bytes, "rate": args.rate,
               "runs": args.runs, "exact": exact, **summarize(rows)}
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
