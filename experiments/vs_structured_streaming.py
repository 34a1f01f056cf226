"""python -m experiments.vs_structured_streaming: Flux beside Spark Structured Streaming.

Both systems compute the paper's session statistics from the same packets,
fed at the same steady rate, on the same embedded local-cluster (one at a
time); at the same moment one executor JVM is killed (a machine crash). For
each, the output rate and average latency per 100 ms are measured from the
packets' arrival, and from them: the longest output stall after the kill,
how long until output resumed, and how long until latency was back to
normal. Structured Streaming's side is ``experiments.structured_streaming``
(checkpointing to a local folder, default or RocksDB state store, a tunable
trigger); Flux's side is ``experiments.failover`` with ``--kill executor``.

Writes ``comparison.png`` (both timelines on the same axes),
``summary.json`` and ``timeline_{flux,structured_streaming}.csv``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import signal
import statistics
import time
from typing import Any, Dict, List

from tqdm import tqdm

from experiments import failover
from flux.examples import paper_dataflow
from flux.reference import reference_output
from flux.testing.workloads import packet_workload

SYSTEMS = ("flux", "structured_streaming")
LABELS = {"flux": "Flux", "structured_streaming": "Structured Streaming"}
#: latency is "back to normal" once it stays this long under the threshold
STEADY_FOR_S = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.vs_structured_streaming",
                                 description="Kill an executor mid-stream in Flux and in "
                                             "Structured Streaming; compare stall and recovery.")
    ap.add_argument("--quick", action="store_true",
                    help="short runs (20 s of data, kill at 10 s): a few minutes in all")
    ap.add_argument("--duration", type=float, default=None, help="seconds of input (default 40)")
    ap.add_argument("--kill-at", type=float, default=None,
                    help="seconds after the start (default: half the duration)")
    ap.add_argument("--rate", type=float, default=1_000.0,
                    help="input packets per second, for both systems (default: a rate "
                         "Structured Streaming sustains on 2 cores)")
    ap.add_argument("--trigger", type=float, default=1.0,
                    help="Structured Streaming's micro-batch trigger interval, seconds (0: as "
                         "fast as possible)")
    ap.add_argument("--state-store", choices=("hdfs", "rocksdb"), default="hdfs",
                    help="Structured Streaming's state store provider")
    ap.add_argument("--buckets", type=int, default=16,
                    help="Structured Streaming groups keys into this many groups, each keeping "
                         "its keys' state (applyInPandasWithState costs ~1 ms per group here); "
                         "0: one group per key, as the documentation writes it")
    ap.add_argument("--partitions", type=int, default=4,
                    help="partitions of each stage, in both systems (Flux: its nodes)")
    ap.add_argument("--flux-from", default=None,
                    help="reuse a finished 'experiments.failover --kill executor' run in this "
                         "folder instead of running Flux again")
    ap.add_argument("--skip-flux", action="store_true", help="run Structured Streaming only")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/vs_structured_streaming")
    args = ap.parse_args(argv)
    if args.duration is None:
        args.duration = 20.0 if args.quick else 40.0
    if args.kill_at is None:
        args.kill_at = args.duration / 2
    if not 0 < args.kill_at < args.duration:
        ap.error(f"--kill-at must be within the run (0, {args.duration})")
    if args.rate <= 0:
        ap.error("--rate must be > 0")
    if args.trigger < 0:
        ap.error("--trigger must be >= 0")
    if args.buckets < 0:
        ap.error("--buckets must be >= 0")
    if args.partitions < 2:
        ap.error("--partitions must be >= 2 (Flux needs a pair per partition)")
    return args


# -- what a timeline says about a failure ----------------------------------------------------
def recovery_figures(rows: List[Dict[str, Any]], kill_at: float) -> Dict[str, Any]:
    """Stall, resumption and return to normal latency after a kill at ``kill_at``.

    - ``normal_latency_ms``: median interval latency between 2 s and the kill;
    - ``max_stall_before_kill_s``: the longest stretch without output before the kill
      (a micro-batch engine has one between every two batches);
    - ``stall_s``: the longest stretch without output that ends after the kill;
    - ``first_output_after_kill_s``: from the kill to the first output after it;
    - ``peak_latency_ms``: the highest interval latency after the kill;
    - ``recovered_after_kill_s``: from the kill until latency is back under
      max(2 x normal, normal + 100 ms) and stays there for 5 s (or until the last
      output: a backlog drained after the feed ended counts); None if it never is.
    """
    out = [r["outputs"] for r in rows]
    t = [r["t_s"] for r in rows]
    lat = [r["avg_latency_ms"] for r in rows]
    before = [v for ti, v in zip(t, lat) if 2.0 <= ti < kill_at and v is not None]
    normal = statistics.median(before) if before else None
    stalls, start = [], None  # (start, end) of runs of empty intervals
    for ti, n in zip(t, out):
        if n == 0 and start is None:
            start = ti
        elif n and start is not None:
            stalls.append((start, ti))
            start = None
    pre = [e - s for s, e in stalls if e <= kill_at]
    post = [(e - s, e) for s, e in stalls if e > kill_at]
    stall = max(post)[0] if post else 0.0
    first_after = next((ti for ti, n in zip(t, out) if ti >= kill_at and n), None)
    after = [(ti, v) for ti, v in zip(t, lat) if ti >= kill_at and v is not None]
    recovered = None
    if normal is not None:
        limit = max(2 * normal, normal + 100.0)
        for i, (ti, _) in enumerate(after):
            window = [v for tj, v in after[i:] if tj < ti + STEADY_FOR_S]
            if all(v <= limit for v in window):
                recovered = round(ti - kill_at, 3)
                break
    return {
        "normal_latency_ms": normal,
        "max_stall_before_kill_s": round(max(pre), 3) if pre else 0.0,
        "stall_s": round(stall, 3),
        "first_output_after_kill_s": (round(first_after - kill_at, 3)
                                      if first_after is not None else None),
        "peak_latency_ms": max((v for _, v in after), default=None),
        "recovered_after_kill_s": recovered,
    }


# -- the two runs ------------------------------------------------------------------------------
def run_structured_streaming(args, records, expected) -> Dict[str, Any]:
    from experiments.structured_streaming import (
        StructuredStreamingRun,
        matches_reference,
    )
    from flux.spark.session import local_cluster

    print(f"Structured Streaming: a local-cluster of {args.partitions + 2} executors, trigger "
          f"{args.trigger}s, {args.state_store} state store, "
          f"{args.buckets or 'one group per key'} buckets ...", flush=True)
    with local_cluster(args.partitions + 2) as spark:
        warm_up(spark, args)
        run = StructuredStreamingRun(spark, records, args.rate, args.trigger, args.partitions,
                                     args.state_store, buckets=args.buckets)
        try:
            run.start()
            _watch(run, args, len(expected))
        finally:
            run.stop()
    output = run.output()
    m = run.metrics
    base = m.summary()
    kill = next(t for t, what, _ in m.relative_events() if what == "killed")
    return {
        "system": "structured_streaming", "metrics": m,
        "summary": {
            "trigger_s": args.trigger, "state_store": args.state_store, "buckets": args.buckets,
            "partitions": args.partitions, "input_rate_tps": base["input_rate_tps"],
            "inputs": base["inputs"], "outputs": len(output), "expected_outputs": len(expected),
            "dropped_inputs": base["dropped_inputs"],
            "output_matches_reference": matches_reference(output, expected),
            "replayed_batches": run.replayed_batches, "kill_at_s": kill,
            "micro_batches": _batch_figures(run.progress()),
            "events": base["events"],
        },
    }


def warm_up(spark, args, packets: int = 4_000, timeout: float = 300.0) -> None:
    """Run the same queries once on other packets and throw them away: the first
    micro-batches start Python workers, import pandas and compile code on every executor,
    which Flux's nodes also do before data flows."""
    from experiments.structured_streaming import StructuredStreamingRun

    records = packet_workload(packets, seed=args.seed + 1, pairs=200, apps=2, sources=100)
    expected = len(reference_output(paper_dataflow(), records, args.partitions))
    run = StructuredStreamingRun(spark, records, packets / 2.0, args.trigger, args.partitions,
                                 args.state_store, buckets=args.buckets)
    print(f"warming up on {packets} other packets ...", flush=True)
    try:
        run.start()
        deadline = time.monotonic() + timeout
        while not run.finished(expected):
            run.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the warm-up did not finish in {timeout}s")
            time.sleep(0.2)
    finally:
        run.stop()


def _batch_figures(progress: List[Dict[str, Any]]) -> Dict[str, Any]:
    figures = {}
    for query in ("sessions", "stats"):
        ms = [p["ms"] for p in progress if p["query"] == query and p["rows"]]
        if ms:
            figures[query] = {"batches_with_data": len(ms), "median_ms": statistics.median(ms),
                              "max_ms": max(ms)}
    return figures


#: after the feed ends, a run whose output stops growing for this long is over (short)
STALLED_S = 120.0


def _watch(run, args, expected: int) -> None:
    """Show progress, kill the executor holding the most statistics state on time, and
    return when every expected output is in, or when the output stopped growing long after
    the feed ended (then the summary says the output does not match)."""
    m, killed = run.metrics, False
    last, since = -1, time.monotonic()
    with tqdm(total=round(args.duration, 1), unit="s", desc="data time",
              bar_format="{desc}: {n:.1f}/{total}s |{bar}| {postfix}") as bar:
        while not run.finished(expected):
            run.check()
            now = time.monotonic() - m.t0
            bar.n = min(round(now, 1), bar.total)
            bar.set_postfix_str(f"read={run.rows_read()} out={m.output_total}/{expected} "
                                f"{'killed' if killed else ''}")
            if not killed and now >= args.kill_at:
                victim = run.busiest_jvm()
                if victim is None:
                    raise RuntimeError("found no executor JVM to kill")
                m.killed(f"executor JVM {victim}")
                os.kill(victim, signal.SIGKILL)
                killed = True
            if run.outputs() != last or not run.feed.done.is_set():
                last, since = run.outputs(), time.monotonic()
            elif time.monotonic() - since > STALLED_S:
                print(f"no output for {STALLED_S:.0f}s after the feed ended: "
                      f"{last} of {expected} outputs", flush=True)
                return
            time.sleep(0.2)


def run_flux(args) -> Dict[str, Any]:
    """Flux's side: the failover experiment with an executor kill at the same moment."""
    if args.flux_from:
        folder = pathlib.Path(args.flux_from)
        summary = json.loads((folder / "summary.json").read_text())
        if summary.get("kill") != "executor":
            raise SystemExit(f"{folder} holds a {summary.get('kill')} kill, not an executor kill")
        rows = _read_timeline(folder / "timeline.csv")
        return {"system": "flux", "rows": rows, "interval": summary["interval_s"],
                "summary": summary}
    flux_args = failover.parse_args([
        "--duration", str(args.duration), "--kill-at", str(args.kill_at),
        "--kill", "executor", "--rate", str(args.rate), "--nodes", str(args.partitions),
        "--seed", str(args.seed), "--out", str(pathlib.Path(args.out) / "flux")])
    summary = failover.run(flux_args)
    rows = _read_timeline(pathlib.Path(flux_args.out) / "timeline.csv")
    return {"system": "flux", "rows": rows, "interval": summary["interval_s"], "summary": summary}


def _read_timeline(path: pathlib.Path) -> List[Dict[str, Any]]:
    with open(path) as f:
        return [{"t_s": float(r["t_s"]), "outputs": int(r["outputs"]),
                 "avg_latency_ms": float(r["avg_latency_ms"]) if r["avg_latency_ms"] else None}
                for r in csv.DictReader(f)]


# -- results ------------------------------------------------------------------------------------
def plot(series: Dict[str, Dict[str, Any]], kill_at: float, path: pathlib.Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"flux": "tab:blue", "structured_streaming": "tab:red"}
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for name, s in series.items():
        rows, interval = s["rows"], s["interval"]
        t = [r["t_s"] for r in rows]
        per_s = _per_second(rows, interval)
        top.plot(t, per_s, lw=1, color=colors[name], label=LABELS[name])
        lat = [(r["t_s"], r["avg_latency_ms"]) for r in rows if r["avg_latency_ms"] is not None]
        bottom.plot([x for x, _ in lat], [y for _, y in lat], lw=0.8, color=colors[name],
                    label=LABELS[name], marker="." if name == "structured_streaming" else None)
    for ax in (top, bottom):
        ax.axvline(kill_at, color="black", ls="--", lw=1, label="executor killed")
    top.set_ylabel("output rate (tuples/s, 1 s window)")
    bottom.set_ylabel("average latency (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("time since the feed started (s), 100 ms intervals")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _per_second(rows: List[Dict[str, Any]], interval: float) -> List[float]:
    """Output rate over the trailing second: a micro-batch engine's output comes in bursts."""
    k = max(1, round(1.0 / interval))
    counts = [r["outputs"] for r in rows]
    return [sum(counts[max(0, i - k + 1):i + 1]) / (k * interval) for i in range(len(counts))]


def write_timeline(rows: List[Dict[str, Any]], interval: float, path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "outputs", "output_rate_tps", "avg_latency_ms"])
        for r in rows:
            w.writerow([r["t_s"], r["outputs"], round(r["outputs"] / interval, 1),
                        r["avg_latency_ms"]])


def main(argv=None) -> int:
    args = parse_args(argv)
    n = int(args.rate * args.duration)
    print(f"preparing {n} packets and their failure-free output ...", flush=True)
    records = packet_workload(n, seed=args.seed, pairs=failover.PAIRS, apps=failover.APPS,
                              sources=failover.SOURCES)
    expected = reference_output(paper_dataflow(), records, args.partitions)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    series: Dict[str, Dict[str, Any]] = {}
    summary: Dict[str, Any] = {"rate_tps": args.rate, "duration_s": args.duration,
                               "kill_at_s": args.kill_at, "kill": "executor",
                               "expected_outputs": len(expected)}
    if not args.skip_flux:
        flux = run_flux(args)
        series["flux"] = {"rows": flux["rows"], "interval": flux["interval"]}
        keep = ("input_rate_tps", "outputs", "dropped_inputs", "output_matches_reference",
                "kill_at_s", "detect_after_kill_s", "takeover_after_kill_s",
                "catchup_after_kill_s", "state_bytes_moved", "max_output_gap_s")
        summary["flux"] = {k: flux["summary"].get(k) for k in keep}
    ss = run_structured_streaming(args, records, expected)
    m = ss["metrics"]
    series["structured_streaming"] = {"rows": m.timeline(), "interval": m.interval}
    summary["structured_streaming"] = ss["summary"]
    for name, s in series.items():
        kill = summary[name]["kill_at_s"]
        summary[name].update(recovery_figures(s["rows"], kill))
        write_timeline(s["rows"], s["interval"], out / f"timeline_{name}.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plot(series, args.kill_at, out / "comparison.png",
         f"{args.rate:,.0f} packets/s, {args.partitions} partitions, an executor killed at "
         f"{args.kill_at:g} s (2 shared cores)")
    keys = ("output_matches_reference", "dropped_inputs", "normal_latency_ms", "stall_s",
            "max_stall_before_kill_s", "first_output_after_kill_s", "peak_latency_ms",
            "recovered_after_kill_s")
    print(f"{'':28s} " + " ".join(f"{LABELS[s]:>22s}" for s in series))
    for k in keys:
        print(f"{k:28s} " + " ".join(f"{str(summary[s].get(k)):>22s}" for s in series))
    print(f"wrote {out}/comparison.png, summary.json, timeline_*.csv")
    ok = all(summary[s]["output_matches_reference"] for s in series)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
