"""python -m experiments.soak: the paper's dataflow on an endless feed, for minutes or hours.

A steady feed of packets (``--rate`` per second, never ending) runs through the
paper's dataflow with Flux on an embedded local-cluster into a sink that keeps
nothing: it counts the outputs and checks each against the failure-free run,
computed as it goes from the inputs the ingress took (so the check itself holds
no growing list). Every ``--sample`` seconds it records the resident memory of
the driver and of every node, the end-to-end latency percentiles of the outputs
of that period, the ingress's and the egress's queues, the driver's garbage
collector pauses, drops and detections. ``--slow-sink`` makes the sink 10x
slower than the feed's outputs: back-pressure must hold the memory flat, the
feed (which cannot wait) drops and counts, and what was accepted still comes
out exactly.

Writes ``soak.csv`` (one row per sample), ``summary.json`` and ``soak.png``.
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import pathlib
import threading
import time
from array import array
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from flux.examples import paper_dataflow
from flux.protocol.ingress import INGRESS
from flux.operator import wire_form
from flux.reference import ReferenceRun
from flux.connectors.sources import NOT_YET, RateLimited
from flux.testing.workloads import PacketWorkload

#: the paper's workload knobs (as experiments.failover)
PAIRS, APPS, SOURCES = 100_000, 10, 1_000
#: "endless": more packets than any run takes
ENDLESS = 10 ** 15
#: the first samples are warm-up (caches, JIT-less but still: allocator arenas, Spark)
WARMUP_FRACTION = 0.2


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.soak",
                                 description="An endless feed for minutes: memory, latency, "
                                             "queues and GC pauses over time.")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=5_000.0, help="input packets per second")
    ap.add_argument("--slow-sink", action="store_true",
                    help="the sink takes outputs at a tenth of the rate they are made")
    ap.add_argument("--backlog", type=int, default=None,
                    help="records the feed holds while the ingress does not read, beyond "
                         "which it drops (default 100,000; with --slow-sink a second of "
                         "input: a feed that buffers 20 s in front of a slow sink only "
                         "adds its 200 s of waiting to every latency)")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--standbys", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/soak")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.sample <= 0:
        ap.error("--minutes, --rate and --sample must be > 0")
    if args.backlog is not None and args.backlog < 1:
        ap.error("--backlog must be >= 1")
    if args.nodes < 2:
        ap.error("--nodes must be >= 2")
    return args


class RecordedFeed(RateLimited):
    """The feed, remembering each record the ingress takes (with its arrival) until the
    sink has checked the outputs it caused."""

    def __init__(self, records, rate: float, backlog: int = 100_000):
        super().__init__(records, rate, backlog)
        self.taken: Deque[Tuple[Any, float]] = deque()

    def __next__(self) -> Any:
        record = super().__next__()
        if record is not NOT_YET:
            self.taken.append((record, self.arrival))
        return record


class CheckingSink:
    """Keeps no output: counts them, compares each with the failure-free run fed from the
    inputs taken so far, times it from its input's arrival, and may be paced to a rate."""

    def __init__(self, dataflow, partitions: int, feed: RecordedFeed,
                 max_rate: Optional[float] = None):
        self.reference = ReferenceRun(dataflow, partitions)
        self.feed = feed
        self.expected: Deque[Tuple[Any, Any]] = deque()
        self.arrival = 0.0  # of the input whose outputs are expected now
        self.count = 0
        self.mismatches = 0
        self.first_mismatch: Optional[str] = None
        self.latencies = array("d")  # seconds, since the last ``take_latencies``
        self._lock = threading.Lock()
        self.interval = 1.0 / max_rate if max_rate else 0.0
        self._due = None

    def __call__(self, item: Tuple[Any, Any]) -> None:
        sn, record = item
        now = time.monotonic()
        while not self.expected:
            if not self.feed.taken:  # an output of an input never taken: impossible
                self._mismatch(f"output {sn} before its input was taken")
                return
            taken, self.arrival = self.feed.taken.popleft()
            self.expected.extend(self.reference.feed(taken))
        want_sn, want = self.expected.popleft()
        if tuple(sn) != want_sn or wire_form(record) != wire_form(want):
            self._mismatch(f"output {self.count}: got {sn} {record!r}, "
                           f"the failure-free run has {want_sn} {want!r}")
        self.count += 1
        with self._lock:
            self.latencies.append(now - self.arrival)
        if self.interval:
            self._due = (self._due or now) + self.interval
            if self._due > now:
                time.sleep(self._due - now)

    def _mismatch(self, what: str) -> None:
        self.mismatches += 1
        if self.first_mismatch is None:
            self.first_mismatch = what

    def take_latencies(self) -> List[float]:
        with self._lock:
            out, self.latencies = self.latencies, array("d")
        return sorted(out)


class GcPauses:
    """The driver's collector pauses (gc.callbacks), the longest and the sum per sample."""

    def __init__(self):
        self._start = 0.0
        self.longest = self.total = 0.0
        self.collections = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            pause = time.perf_counter() - self._start
            self.longest = max(self.longest, pause)
            self.total += pause
            self.collections += 1

    def take(self) -> Tuple[float, float, int]:
        out = (self.longest, self.total, self.collections)
        self.longest = self.total = 0.0
        self.collections = 0
        return out


def rss_mb(pid: int) -> Optional[float]:
    """Resident memory of a process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(sorted_values: List[float], q: float) -> Optional[float]:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def outputs_per_input(dataflow, partitions: int, seed: int, n: int = 200_000) -> float:
    """Outputs per input once sessions end as often as they start (the second half of
    ``n`` packets): what the sink must take to keep up."""
    run = ReferenceRun(dataflow, partitions)
    outputs = [len(run.feed(r)) for r in PacketWorkload(n, seed, PAIRS, APPS, SOURCES)]
    return sum(outputs[n // 2:]) / (n - n // 2)


def sample(job, sink: CheckingSink, gcp: GcPauses, t: float, last: Dict[str, Any],
           names: List[str]) -> Dict[str, Any]:
    m = job.metrics
    lat = sink.take_latencies()
    longest, total, collections = gcp.take()
    dt = t - last["t"]
    inputs, outputs = m.input_total, sink.count
    reports = list(dict(job.controller.node_stats).values())
    row = {
        "t_s": round(t, 3),
        "inputs": inputs, "outputs": outputs, "dropped": m.dropped_total,
        "input_rate_tps": round((inputs - last["inputs"]) / dt, 1),
        "output_rate_tps": round((outputs - last["outputs"]) / dt, 1),
        "latency_p50_ms": _ms(percentile(lat, 0.5)), "latency_p99_ms": _ms(percentile(lat, 0.99)),
        "latency_max_ms": _ms(lat[-1] if lat else None),
        "rss_driver_mb": round(rss_mb(os.getpid()) or 0.0, 1),
        "rss_ingress_mb": round(rss_mb(job.ingress_pid) or 0.0, 1),
        "ingress_buffered": next((s.buffered for s in job.driver_stats()
                                  if s.addr == INGRESS), 0),
        "egress_queued": job._egress.fcons.queued(),
        "feed_backlog": len(job.source.waiting),
        "unchecked_inputs": len(job.source.taken),
        "arrivals_kept": m.arrivals_kept,
        # what the nodes last reported (NodeStats, as the metrics endpoint shows them)
        "max_segment_queued": max((seg.queued for _, st in reports for seg in st.segments),
                                  default=0),
        "max_segment_in_flight": max((seg.in_flight for _, st in reports
                                      for seg in st.segments), default=0),
        "gc_longest_ms": round(1000 * longest, 2), "gc_total_ms": round(1000 * total, 2),
        "gc_collections": collections,
        "detections": sum(1 for _, what, _ in list(m.events) if what == "detected"),
        "mismatches": sink.mismatches,
    }
    for name in names:
        pid = job.controller.pids(name)[0]
        row[f"rss_{name}_mb"] = round(rss_mb(pid) or 0.0, 1)
    last.update(t=t, inputs=inputs, outputs=outputs)
    return row


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(1000 * seconds, 2)


def flatness(rows: List[Dict[str, Any]], key: str) -> Optional[float]:
    """After warm-up: the largest distance of a sample from the median, as a fraction of
    the median (0.1 = within +-10%)."""
    values = sorted(r[key] for r in rows if r.get(key))
    if not values:
        return None
    median = values[len(values) // 2]
    return round(max(abs(values[0] - median), abs(values[-1] - median)) / median, 4)


def summarize(rows: List[Dict[str, Any]], args, sink: CheckingSink, names: List[str],
              sink_rate: Optional[float]) -> Dict[str, Any]:
    warm = rows[int(len(rows) * WARMUP_FRACTION):] or rows
    half = len(warm) // 2
    p99 = [r["latency_p99_ms"] for r in warm if r["latency_p99_ms"] is not None]
    first, second = sorted(p99[:half]) or [None], sorted(p99[half:]) or [None]
    last = rows[-1] if rows else {}
    return {
        "minutes": args.minutes, "rate_asked_tps": args.rate, "slow_sink": args.slow_sink,
        "sink_rate_tps": sink_rate, "nodes": args.nodes, "standbys": args.standbys,
        "samples": len(rows), "warmup_samples": len(rows) - len(warm),
        "inputs": last.get("inputs"), "outputs": sink.count, "dropped_inputs": last.get("dropped"),
        "output_exact": sink.mismatches == 0 and sink.count > 0,
        "mismatches": sink.mismatches, "first_mismatch": sink.first_mismatch,
        "detections": last.get("detections"),
        # +-fraction of the median RSS after warm-up, per process
        "rss_flatness": {k: flatness(warm, f"rss_{k}_mb")
                         for k in ["driver", "ingress", *names]},
        "rss_mb_after_warmup": {k: [min(r[f"rss_{k}_mb"] for r in warm),
                                    max(r[f"rss_{k}_mb"] for r in warm)]
                                for k in ["driver", "ingress", *names]} if warm else {},
        "latency_p99_ms_median_first_half": first[len(first) // 2],
        "latency_p99_ms_median_second_half": second[len(second) // 2],
        "latency_p50_ms_median": median([r["latency_p50_ms"] for r in warm]),
        "gc_longest_ms": max((r["gc_longest_ms"] for r in rows), default=None),
        "max_ingress_buffered": max((r["ingress_buffered"] for r in rows), default=None),
        "max_egress_queued": max((r["egress_queued"] for r in rows), default=None),
        "max_feed_backlog": max((r["feed_backlog"] for r in rows), default=None),
        "max_segment_queued": max((r["max_segment_queued"] for r in rows), default=None),
        "max_segment_in_flight": max((r["max_segment_in_flight"] for r in rows), default=None),
    }


def median(values: List[Optional[float]]) -> Optional[float]:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def write(rows: List[Dict[str, Any]], summary: Dict[str, Any], out: pathlib.Path,
          names: List[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "soak.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plot(rows, summary, out / "soak.png", names)


def plot(rows, summary, path, names) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    fig, (mem, lat, rate) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    for key in ["driver", "ingress", *names]:
        mem.plot(t, [r[f"rss_{key}_mb"] for r in rows], lw=1, label=key)
    mem.set_ylabel("resident memory (MB)")
    mem.legend(fontsize=7, ncol=3)
    for key, color in (("latency_p50_ms", "tab:blue"), ("latency_p99_ms", "tab:purple"),
                       ("gc_longest_ms", "tab:gray")):
        lat.plot(t, [r[key] for r in rows], lw=1, color=color, label=key.replace("_", " "))
    lat.set_ylabel("ms")
    lat.set_yscale("log")
    lat.legend(fontsize=7)
    for key in ("input_rate_tps", "output_rate_tps"):
        rate.plot(t, [r[key] for r in rows], lw=1, label=key.replace("_", " "))
    drops = [(b["dropped"] - a["dropped"]) / (b["t_s"] - a["t_s"]) for a, b in zip(rows, rows[1:])]
    rate.plot(t[1:], drops, lw=1, color="tab:red", label="dropped inputs/s")
    rate.set_ylabel("tuples/s")
    rate.set_xlabel("minutes")
    rate.legend(fontsize=7)
    mode = "slow sink (10x slower)" if summary["slow_sink"] else "sink keeps nothing"
    mem.set_title(f"soak: {summary['rate_asked_tps']:.0f} inputs/s, {mode}, "
                  f"output exact: {summary['output_exact']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from flux.spark.job import FluxJob
    from flux.spark.session import local_cluster

    dataflow = paper_dataflow()
    sink_rate = None
    if args.slow_sink:
        sink_rate = round(args.rate * outputs_per_input(dataflow, args.nodes, args.seed) / 10, 1)
    backlog = args.backlog or (int(args.rate) if args.slow_sink else 100_000)
    feed = RecordedFeed(PacketWorkload(ENDLESS, args.seed, PAIRS, APPS, SOURCES), args.rate,
                        backlog)
    sink = CheckingSink(dataflow, args.nodes, feed, sink_rate)
    gcp = GcPauses()
    rows: List[Dict[str, Any]] = []
    print(f"starting a local-cluster of {args.nodes + args.standbys + 1} executors ...", flush=True)
    with local_cluster(args.nodes + args.standbys + 1) as spark:
        job = FluxJob(spark, dataflow, feed, nodes=args.nodes, standbys=args.standbys, sink=sink)
        with job:
            names = list(job.topology.nodes) + [n for n in job.controller.registered
                                                if n not in job.topology.nodes]
            gc.callbacks.append(gcp)
            try:
                t0 = job.metrics.t0
                last = {"t": 0.0, "inputs": 0, "outputs": 0}
                end = t0 + 60 * args.minutes
                while (now := time.monotonic()) < end:
                    job.wait_until(lambda: False, min(args.sample, end - now))
                    row = sample(job, sink, gcp, time.monotonic() - t0, last, names)
                    rows.append(row)
                    print(" ".join(f"{k}={row[k]}" for k in (
                        "t_s", "input_rate_tps", "output_rate_tps", "dropped",
                        "latency_p50_ms", "latency_p99_ms", "rss_driver_mb",
                        "gc_longest_ms", "mismatches")), flush=True)
            finally:
                gc.callbacks.remove(gcp)
    summary = summarize(rows, args, sink, names, sink_rate)
    write(rows, summary, pathlib.Path(args.out), names)
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = run(args)
    for k in ("inputs", "outputs", "dropped_inputs", "output_exact", "detections",
              "rss_flatness", "latency_p50_ms_median", "latency_p99_ms_median_first_half",
              "latency_p99_ms_median_second_half", "gc_longest_ms", "max_egress_queued"):
        print(f"{k:36s} {summary[k]}")
    print(f"wrote {args.out}/soak.csv, summary.json, soak.png")
    return 0 if summary["output_exact"] and not summary["detections"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
