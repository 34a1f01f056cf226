"""python -m experiments.throughput: how close the replicated data path comes to the operators.

Measures in one run, on one machine (DESIGN 9):

1. **operators alone**: the paper's two operators (sessions, then windowed stats),
   one instance each, every packet straight through both on one core: no
   partitioner, no SNs, no protocol. The ceiling of a Python data path.
2. **reference**: the single-process failure-free run (``flux.reference``):
   partitioner and SNs included, no replication, no sockets.
3. **replicated rates** on an embedded local-cluster (``--nodes`` nodes, fed as
   fast as the ingress takes input): ``none``, ``cluster-pairs`` and ``flux``,
   ``--runs`` times each in rotating order, every output checked against the
   reference; medians with their spread (min-max).
4. **steady-rate search** (``flux``): a feed at a fixed rate for ``--probe-seconds``;
   a rate is *steady* when nothing is dropped and the median end-to-end latency
   (from the packet's arrival in the feed) is at most ``--latency-ms``. A
   bisection finds the highest steady rate; the latency at 0.8 of the
   operators-alone rate (DESIGN 9's target) is probed as well.

All of it for each kind of operators (``--operators``): the paper's per-record
operators, and their twins on Arrow batches (``flux.examples.vectorized``; alone
they run on batches of 1024 rows made beforehand, and the replicated runs are fed
the same batches, a columnar source's, unless ``--vectorized-input records``;
the steady-rate probes feed records for both kinds), each replicated run's output
checked against the per-record reference (the two give it SN for SN). Runs of
both kinds and every mode alternate, so ratios between them come from one
stretch of the machine's speed.

Prints the figures and writes ``summary.json`` and ``runs.csv`` under ``--out``
(and a plot per kind). Replication on two cores doubles the work on twice the
cores, so 1.0 of the operators-alone rate is the limit of ``flux``; the targets
are 0.5 (per-record) and 0.35 (vectorized).
``--curve-cost`` instead measures the cost of CURVE-encrypted connections
(without and with, alternating, on one cluster).
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from flux.examples import paper_dataflow, vectorized_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.testing.workloads import packet_workload

MODES = ("none", "cluster-pairs", "flux")
#: the operators: the paper's per-record ones, or their twins on Arrow batches
KINDS = ("per-record", "vectorized")
#: also measurable: the per-record operators with their stages keyed by columns
#: (``paper_dataflow_on_columns``: Arrow between stages, vectorized routing)
MORE_KINDS = ("per-record-columns",)
#: rows per batch of the vectorized operators run alone
ALONE_BATCH = 1024


def dataflow_of(kind: str):
    if kind == "per-record-columns":
        from flux.examples.dataflows import paper_dataflow_on_columns
        return paper_dataflow_on_columns()
    return vectorized_dataflow() if kind == "vectorized" else paper_dataflow()


def spread(values: List[float]) -> Dict[str, float]:
    """Median, min and max of repeated measurements (never one run alone)."""
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "n": len(values)}


def best_of_core(work: Callable[[], Any], repeats: int) -> List[float]:
    """Seconds of ``work`` run ``repeats`` times in this process (one core)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return times


def operators_alone(dataflow, records: List[Any]) -> Callable[[], int]:
    """The dataflow's operators, one instance per stage, each record straight through."""
    def run() -> int:
        batch = records
        for stage in dataflow.stages:
            for op in [factory() for factory in stage.operators]:
                nxt: List[Any] = []
                for record in batch:
                    nxt.extend(op.process(record))
                batch = nxt
        return len(batch)
    return run


def as_batches(records: List[Any]) -> List[Any]:
    """The packets as Arrow batches of ``ALONE_BATCH`` rows (a columnar source's)."""
    from exchange.columns import to_batch
    from flux.examples.vectorized import PACKET_SCHEMA

    return [to_batch(records[i:i + ALONE_BATCH], PACKET_SCHEMA)
            for i in range(0, len(records), ALONE_BATCH)]


def vectorized_alone(records: List[Any]) -> Callable[[], int]:
    """The vectorized operators, one instance each, on batches of ``ALONE_BATCH`` rows
    made beforehand."""
    from flux.examples.vectorized import VectorizedSessions, VectorizedStats

    batches = as_batches(records)

    def run() -> int:
        sessions, stats, outputs = VectorizedSessions(), VectorizedStats(), 0
        for batch in batches:
            outputs += stats.process_arrow(sessions.process_arrow(batch)[1])[1].num_rows
        return outputs
    return run


class DriverWakeups:
    """How late a thread of the driver wakes from a 1 ms sleep while the job runs: the
    wait for the driver's GIL that its controller thread (heartbeats, detection) has too."""

    def __init__(self):
        self.late: List[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="wakeups")

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.perf_counter()
            time.sleep(0.001)
            self.late.append((time.perf_counter() - asked - 0.001) * 1000)

    def __enter__(self) -> "DriverWakeups":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def p99_ms(self) -> float:
        late = sorted(self.late)
        return round(late[min(len(late) - 1, int(0.99 * len(late)))], 2) if late else None


def replicated_run(spark, mode: str, records: List[Any], expected: List[str],
                   args, authenticate: bool = True, kind: str = "per-record",
                   **tuning: Any) -> Dict[str, Any]:
    """One run of ``mode`` fed as fast as the ingress takes input (``tuning``: more of
    ``FluxJob``'s keyword arguments)."""
    from flux.spark.job import FluxJob

    source = records
    if kind == "vectorized" and args.vectorized_input == "batches":
        source = as_batches(records)
    job = FluxJob(spark, dataflow_of(kind), source, nodes=args.nodes, standbys=0,
                  replication=mode, authenticate=authenticate, **tuning)
    with job:
        job.wait_until(lambda: job.controller.started, 120)
        with DriverWakeups() as wakeups:
            started = time.perf_counter()
            output = job.wait(3600)
            elapsed = time.perf_counter() - started
        summary = job.metrics.summary()
    same = [wire_form(x) for x in output] == expected
    return {"operators": kind, "mode": mode, "inputs": len(records),
            "seconds": round(elapsed, 3),
            "input_rate_tps": round(len(records) / elapsed, 1),
            "latency_p50_ms": summary["latency_p50_ms"],
            "driver_wakeup_p99_ms": wakeups.p99_ms(),
            "output_matches_reference": same}


def probe(spark, rate: float, args, records: List[Any],
          kind: str = "per-record", **tuning: Any) -> Dict[str, Any]:
    """``flux`` fed at ``rate`` for ``--probe-seconds``: drops and median latency
    (``tuning``: more of ``FluxJob``'s keyword arguments)."""
    from flux.connectors.sources import RateLimited
    from flux.spark.job import FluxJob

    feed = records[:max(1000, int(rate * args.probe_seconds))]
    want = expected_for(feed, args)
    job = FluxJob(spark, dataflow_of(kind), RateLimited(feed, rate), nodes=args.nodes,
                  standbys=0, replication="flux", **tuning)
    with job:
        output = job.wait(600)
        summary = job.metrics.summary()
    lat = summary["latency_p50_ms"]
    dropped = summary["dropped_inputs"]
    row = {"rate_asked_tps": round(rate), "inputs": len(feed), "dropped": dropped,
           "input_rate_tps": summary["input_rate_tps"], "latency_p50_ms": lat,
           "latency_p90_ms": summary["latency_p90_ms"],
           "latency_p99_ms": summary.get("latency_p99_ms"),
           # the feed dropped inputs the job never accepted: the reference of what it did
           # accept is unknown here, so such a run's output is not judged (None)
           "output_matches_reference": None if dropped else [
               wire_form(x) for x in output] == want}
    row["steady"] = (dropped == 0 and lat is not None and lat <= args.latency_ms
                     and row["output_matches_reference"] is True)
    return row


def expected_for(records: List[Any], args) -> List[str]:
    return [wire_form(x) for x in reference_output(paper_dataflow(), records, args.nodes)]


class Bisection:
    """A search for the highest steady rate in [lo, hi]: the first probe at the lowest
    rate, then halfway between the highest steady and the lowest unsteady rate probed;
    done when not even the lowest rate is steady."""

    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = lo, hi
        self.best: Optional[float] = None
        self.probes: List[Dict[str, Any]] = []
        self.done = False

    def next_rate(self) -> float:
        return self.lo if not self.probes else (self.lo + self.hi) / 2

    def took(self, rate: float, row: Dict[str, Any]) -> None:
        self.probes.append(row)
        if row["steady"]:
            self.best, self.lo = max(self.best or 0.0, rate), rate
        else:
            self.hi = rate
            self.done = self.best is None


def search(spark, args, records, hi: float, kind: str = "per-record") -> Dict[str, Any]:
    """Bisect the highest steady rate in [lo, hi] with ``--probes`` probes."""
    bisection = Bisection(args.min_rate, hi)
    for _ in range(args.probes):
        rate = bisection.next_rate()
        row = probe(spark, rate, args, records, kind)
        print("probe", row, flush=True)
        bisection.took(rate, row)
        if bisection.done:
            break
    best = bisection.best
    return {"highest_steady_tps": round(best) if best else None, "probes": bisection.probes}


def plot(summary: Dict[str, Any], path: pathlib.Path, kind: str = "per-record",
         latency_ms: float = 50.0) -> None:
    """Rates (medians, min-max bars) beside the steady-rate search's latencies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{kind}\noperators alone", summary["operators_alone_tps"]),
            ("per-record\nreference", summary["reference_tps"])]
    bars += [(m, s) for m, s in summary.get("modes", {}).items()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    med = [s["median"] / 1000 for _, s in bars]
    err = [[(s["median"] - s["min"]) / 1000 for _, s in bars],
           [(s["max"] - s["median"]) / 1000 for _, s in bars]]
    left.bar([name for name, _ in bars], med, yerr=err, capsize=4,
             color=["#999999", "#bbbbbb"] + ["#4c72b0"] * (len(bars) - 2))
    left.set_ylabel("inputs/s (thousands), median, min-max")
    left.set_title(f"{kind} operators, as fast as taken (2 cores)")
    probes = summary.get("steady", {}).get("probes", [])
    if probes:
        probes = sorted(probes, key=lambda p: p["rate_asked_tps"])
        for steady, marker in ((True, "o"), (False, "x")):
            pts = [p for p in probes if p["steady"] is steady and p["latency_p50_ms"] is not None]
            right.plot([p["rate_asked_tps"] / 1000 for p in pts],
                       [p["latency_p50_ms"] for p in pts], marker, ms=8,
                       label="steady" if steady else "not steady")
        right.axhline(latency_ms, color="red", lw=1, ls="--", label=f"{latency_ms:g} ms")
        right.set_xlabel("feed rate (thousand inputs/s), flux")
        right.set_ylabel("median latency (ms)")
        right.set_title(f"highest steady rate: {summary['steady']['highest_steady_tps']}/s")
        right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=200_000, help="packets per replicated run")
    ap.add_argument("--runs", type=int, default=5, help="runs per replication mode")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--operators", default=",".join(KINDS),
                    help="per-record, vectorized (default: both, alternated), or also "
                         "per-record-columns (per-record operators, stages keyed by "
                         "columns)")
    ap.add_argument("--vectorized-input", choices=("batches", "records"), default="batches",
                    help="what the vectorized kind's full-rate runs are fed")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="single-process measurements")
    ap.add_argument("--probes", type=int, default=6, help="steps of the steady-rate search")
    ap.add_argument("--probe-seconds", type=float, default=8.0)
    ap.add_argument("--min-rate", type=float, default=5_000.0)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--out", default="results/throughput")
    ap.add_argument("--curve-cost", action="store_true",
                    help="only the cost of CURVE: flux without and with it, alternating")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    kinds = [k.strip() for k in args.operators.split(",") if k.strip()]
    if any(m not in MODES for m in modes) or any(k not in KINDS + MORE_KINDS for k in kinds) or \
            not kinds or args.runs < 1 or args.inputs < 1000:
        ap.error(f"--modes from {MODES}, --operators from {KINDS + MORE_KINDS}, --runs >= 1, "
                 f"--inputs >= 1000")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.curve_cost:
        return curve_cost(args, out)

    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    reference = paper_dataflow()
    alone = {"per-record": operators_alone(reference, records),
             "vectorized": vectorized_alone(records)}
    alone["per-record-columns"] = alone["per-record"]
    summary: Dict[str, Any] = {"inputs": args.inputs, "nodes": args.nodes,
                               "runs_per_mode": args.runs}
    for kind in kinds:
        summary[kind] = {"operators_alone_tps": spread(
            [args.inputs / s for s in best_of_core(alone[kind], args.repeats)])}
    summary["reference_tps"] = spread([args.inputs / s for s in best_of_core(
        lambda: reference_output(reference, records, args.nodes), args.repeats)])
    expected = [wire_form(x) for x in reference_output(reference, records, args.nodes)]
    print({k: summary[k]["operators_alone_tps"] for k in kinds}, "reference",
          summary["reference_tps"], flush=True)
    from flux.spark.session import local_cluster

    rows: List[Dict[str, Any]] = []
    pairs = [(kind, mode) for mode in modes for kind in kinds]
    with local_cluster(args.nodes + 1) as spark:
        for r in range(args.runs):
            for kind, mode in pairs[r % len(pairs):] + pairs[:r % len(pairs)]:  # rotate
                row = replicated_run(spark, mode, records, expected, args, kind=kind)
                row["round"] = r
                rows.append(row)
                print(row, flush=True)
        for kind in kinds:
            summary[kind].update(_figures(rows, kind, modes,
                                          summary[kind]["operators_alone_tps"]["median"]))
        for other in ("vectorized", "per-record-columns"):
            if "flux" in modes and {other, "per-record"} <= set(kinds):
                summary[f"{other}_vs_per_record_flux"] = per_round_ratios(
                    _rates(rows, other, "flux"), _rates(rows, "per-record", "flux"))
        if not args.no_search:
            for kind in kinds:
                figures = summary[kind]
                hi = 1.2 * max(_rates(rows, kind, "flux") or [args.min_rate * 4])
                figures["steady"] = search(spark, args, records, hi, kind)
                target = 0.8 * figures["operators_alone_tps"]["median"]
                if kind == "vectorized":  # the latency target: 0.8 of the highest
                    target = 0.8 * (figures["steady"]["highest_steady_tps"] or args.min_rate)
                figures["at_0.8"] = probe(spark, target, args, records, kind)
                print(kind, "at 0.8", figures["at_0.8"], flush=True)
    judged = list(rows)
    for kind in kinds:
        judged += summary[kind].get("steady", {}).get("probes", [])
        judged.append(summary[kind].get("at_0.8", {}))
    summary["output_matches_reference"] = all(
        r.get("output_matches_reference") is not False for r in judged)
    with open(out / "runs.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for kind in kinds:
        plot({**summary[kind], "reference_tps": summary["reference_tps"]},
             out / f"throughput_{kind}.png", kind, args.latency_ms)
    print(json.dumps(summary, indent=2))
    return 0 if summary["output_matches_reference"] else 1


def _rates(rows: List[Dict[str, Any]], kind: str, mode: str) -> List[float]:
    return [r["input_rate_tps"] for r in rows if r["operators"] == kind and r["mode"] == mode]


def per_round_ratios(a: List[float], b: List[float]) -> Dict[str, float]:
    """Per round (the two ran side by side): median, min and max of a / b."""
    ratios = [x / y for x, y in zip(a, b)]
    return {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
            "max": round(max(ratios), 3), "n": len(ratios)}


def _figures(rows: List[Dict[str, Any]], kind: str, modes: List[str],
             alone: float) -> Dict[str, Any]:
    """One kind's replicated rates (medians, spread), against its operators alone."""
    figures: Dict[str, Any] = {}
    rates = {m: _rates(rows, kind, m) for m in modes}
    figures["modes"] = {m: spread(v) for m, v in rates.items()}
    figures["vs_operators_alone"] = {m: round(s["median"] / alone, 3)
                                     for m, s in figures["modes"].items()}
    if "flux" in modes and "cluster-pairs" in modes:
        figures["flux_vs_cluster_pairs"] = per_round_ratios(rates["flux"], rates["cluster-pairs"])
    figures["driver_wakeup_p99_ms"] = {m: spread(
        [r["driver_wakeup_p99_ms"] for r in rows if r["operators"] == kind and r["mode"] == m])
        for m in modes}
    return figures


def curve_cost(args, out: pathlib.Path) -> int:
    """flux without and with CURVE, alternating, ``--runs`` times each, on one cluster."""
    from flux.spark.session import local_cluster

    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, args.nodes)]
    runs = []
    with local_cluster(args.nodes + 1) as spark:
        for r in range(args.runs):
            for curve in ((False, True) if r % 2 == 0 else (True, False)):
                runs.append({"curve": curve, **replicated_run(spark, "flux", records, expected,
                                                               args, authenticate=curve)})
                print(runs[-1], flush=True)
    rate = {c: [r["input_rate_tps"] for r in runs if r["curve"] == c] for c in (False, True)}
    summary = {"inputs": args.inputs, "runs": runs, "without_tps": spread(rate[False]),
               "with_tps": spread(rate[True]),
               "ratio": round(statistics.median(rate[True]) / statistics.median(rate[False]), 3),
               "output_matches_reference": all(r["output_matches_reference"] for r in runs)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["output_matches_reference"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
