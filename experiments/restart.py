"""python -m experiments.restart: what a failure Flux cannot mask costs (issue 14).

Three parts, on one embedded local-cluster (one Spark at a time):

- ``double``: a counting dataflow with ``--state-mb`` MB of keyed state per
  partition, fed at ``--rate`` from a replayable paced source, checkpointing
  every ``--interval`` seconds; at ``--kill-at`` both replicas of stage 1
  partition 0 are SIGKILLed. The job restarts by itself from its last
  checkpoint. Reported: the time from the kill to the first new output and
  until latency (counted from each input's first arrival) is back to normal,
  checkpoint sizes and times, and whether the output equals the failure-free
  run's.
- ``driver``: ``experiments.resumable_job`` (the same dataflow read from
  JSON-lines files into a ``FileSink``) has its driver SIGKILLed at
  ``--kill-at`` and is run again with the same checkpoint location: the time
  from the kill to the new driver's data and first output (a new driver starts
  its own Spark first), and whether the sink holds the failure-free output.
- ``cost``: the throughput of the same dataflow read as fast as it is taken,
  with and without checkpoints every ``--interval`` seconds, alternating
  ``--cost-runs`` runs of each; medians, spread and their ratio.

Writes ``summary.json``, ``timeline_double.csv``, ``cost.csv``,
``restart.png`` (the double failure's timeline) and ``recovery.png`` (time to
first output and to normal latency beside Flux's masked single failure and
Spark Structured Streaming's recovery, from
``docs/results/vs_structured_streaming/summary.json``).
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import statistics
import tempfile
import time
from typing import Any, Dict, List

from experiments.vs_structured_streaming import recovery_figures

NODES, STANDBYS = 4, 1
PARTS = ("double", "driver", "cost")
SS_SUMMARY = pathlib.Path("docs/results/vs_structured_streaming/summary.json")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.restart",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"subset of {', '.join(PARTS)}")
    ap.add_argument("--state-mb", type=float, default=8.5,
                    help="keyed state per partition (MB; the paper's 8.5 by default)")
    ap.add_argument("--rate", type=float, default=4000.0, help="input records per second")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of input")
    ap.add_argument("--kill-at", type=float, default=25.0, help="seconds after the start")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between checkpoints")
    ap.add_argument("--cost-runs", type=int, default=5, help="runs with and without, each")
    ap.add_argument("--cost-inputs", type=int, default=500_000)
    ap.add_argument("--quick", action="store_true", help="small and short (a smoke run)")
    ap.add_argument("--out", default="results/restart")
    args = ap.parse_args(argv)
    if args.quick:
        args.state_mb, args.duration, args.kill_at, args.interval = 1.0, 12.0, 6.0, 2.0
        args.cost_runs, args.cost_inputs = 1, 40_000
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        ap.error(f"--parts must be a subset of {', '.join(PARTS)}")
    if not 0 < args.kill_at < args.duration:
        ap.error("--kill-at must be inside (0, --duration)")
    if args.interval >= args.kill_at:
        ap.error("--interval must be below --kill-at (a checkpoint must complete before it)")
    if args.cost_runs < 1:
        ap.error("--cost-runs must be >= 1")
    return args


def dataflow(state_mb: float):
    from flux.examples import counting_dataflow, with_ballast

    return with_ballast(counting_dataflow(2), state_mb) if state_mb else counting_dataflow(2)


# -- a double failure, restarted from the last checkpoint ----------------------------------
def run_double(spark, args, folder: pathlib.Path) -> Dict[str, Any]:
    from flux.addresses import Addr, P, S
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.runtime.sources import Paced
    from flux.spark.job import FluxJob
    from flux.workload import keyed_workload

    records = keyed_workload(int(args.rate * args.duration), seed=7, keys=50)
    flow = dataflow(args.state_mb)
    expected = reference_output(flow, records, NODES)
    job = FluxJob(spark, flow, Paced(records, args.rate), nodes=NODES, standbys=STANDBYS,
                  checkpoint=str(folder / "ckpt"), checkpoint_interval=args.interval,
                  keep_output=True)
    with job:
        m = job.metrics
        job.wait_until(lambda: time.monotonic() - m.t0 >= args.kill_at, args.duration * 4)
        if not job.checkpoints.completed:
            job.wait_until(lambda: job.checkpoints.completed, 120)
        where = job.topology.where
        kill_at = time.monotonic() - m.t0
        for replica in (P, S):
            job.kill_node(where[Addr(1, 0, replica)])
        output = job.wait(timeout=args.duration * 10)
        rows = m.timeline()
        events = m.relative_events()
        done = list(job.checkpoints.completed)
    restarts = [(t, detail) for t, what, detail in events if what == "restart"]
    starts = [(t, detail) for t, what, detail in events if what == "data starts"]
    figures = recovery_figures(rows, kill_at)
    return {
        "kill_at_s": round(kill_at, 3),
        "restarted_from_checkpoint": restarts[0][1] if restarts else None,
        "restart_begun_after_kill_s": round(restarts[0][0] - kill_at, 3) if restarts else None,
        "data_again_after_kill_s": round(starts[0][0] - kill_at, 3) if starts else None,
        **figures,
        "outputs": len(output),
        "output_matches_reference": [wire_form(x) for x in output]
        == [wire_form(x) for x in expected],
        "checkpoints": [{"number": c.number, "cut": c.cut, "mb": round(c.nbytes / 1e6, 2),
                         "seconds": round(c.seconds, 3)} for c in done],
        "rows": rows,
    }


# -- the driver killed and run again ------------------------------------------------------
def run_driver(args, folder: pathlib.Path) -> Dict[str, Any]:
    from experiments.resumable_job import Program, read_sink, write_inputs

    expected = write_inputs(folder / "in", int(args.rate * args.duration))
    cli = ["--input", str(folder / "in"), "--sink", str(folder / "out"), "--checkpoint",
           str(folder / "ckpt"), "--interval", str(args.interval), "--rate", str(args.rate),
           "--state-mb", str(args.state_mb)]
    first = Program(cli, folder / "first.log")
    try:
        started = first.wait_for(lambda x: x["kind"] == "started", 300)
        first.wait_for(lambda x: x["kind"] == "progress" and x["checkpoint"]
                       and x["t"] - started["t"] >= args.kill_at, args.duration * 4)
    finally:
        killed = time.time()
        first.kill()
    second = Program(cli, folder / "second.log")
    try:
        spark_up = second.wait_for(lambda x: x["kind"] == "spark", 300)
        resumed = second.wait_for(lambda x: x["kind"] == "started", 300)
        output = second.wait_for(lambda x: x["kind"] in ("first_output", "done"), 300)
        second.wait_for(lambda x: x["kind"] == "done", args.duration * 10)
    finally:
        second.kill()
    return {
        "kill_after_start_s": round(killed - started["t"], 3),
        "resumed_from_checkpoint": resumed["checkpoint"],
        "resumed_at_cut": resumed["cut"],
        "spark_up_after_kill_s": round(spark_up["t"] - killed, 3),
        "data_again_after_kill_s": round(resumed["t"] - killed, 3),
        "flux_start_s": round(resumed["t"] - spark_up["t"], 3),
        "first_output_after_kill_s": round(output["t"] - killed, 3),
        "sink_matches_reference": read_sink("jsonl", str(folder / "out")) == expected,
    }


# -- what checkpointing costs ---------------------------------------------------------------
def run_cost(spark, args, folder: pathlib.Path) -> Dict[str, Any]:
    from flux.spark.job import FluxJob
    from flux.workload import keyed_workload

    records = keyed_workload(args.cost_inputs, seed=9, keys=50)
    flow = dataflow(args.state_mb)
    runs: List[Dict[str, Any]] = []
    for k in range(args.cost_runs):
        for with_ckpt in (k % 2 == 0, k % 2 == 1):  # alternate which goes first
            ckpt = str(folder / f"cost{k}{int(with_ckpt)}") if with_ckpt else None
            job = FluxJob(spark, flow, records, nodes=NODES, standbys=STANDBYS,
                          checkpoint=ckpt, checkpoint_interval=args.interval,
                          keep_output=False, sink=lambda item: None)
            with job:
                job.wait(timeout=600)
                seconds = time.monotonic() - job.metrics.t0
                done = list(job.checkpoints.completed) if with_ckpt else []
            runs.append({"checkpoints": with_ckpt, "seconds": round(seconds, 3),
                         "inputs_per_s": round(len(records) / seconds, 1),
                         "complete": len(done),
                         "mb": round(sum(c.nbytes for c in done) / 1e6 / max(1, len(done)), 2)})
            print(f"  cost run {len(runs)}: checkpoints={with_ckpt} "
                  f"{runs[-1]['inputs_per_s']:.0f} inputs/s ({len(done)} checkpoints)",
                  flush=True)

    def stats(xs):
        return {"median": round(statistics.median(xs), 1), "min": min(xs), "max": max(xs)}

    on = [r["inputs_per_s"] for r in runs if r["checkpoints"]]
    off = [r["inputs_per_s"] for r in runs if not r["checkpoints"]]
    return {"runs": runs, "with": stats(on), "without": stats(off),
            "cost_pct": round(100 * (1 - statistics.median(on) / statistics.median(off)), 1)}


# -- results ----------------------------------------------------------------------------------
def plot_timeline(rows, kill_at: float, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    t = [r["t_s"] for r in rows]
    top.plot(t, [r["outputs"] / 0.1 for r in rows], lw=0.8)
    lat = [(r["t_s"], r["avg_latency_ms"]) for r in rows if r["avg_latency_ms"] is not None]
    bottom.plot([x for x, _ in lat], [y for _, y in lat], lw=0.8)
    for ax in (top, bottom):
        ax.axvline(kill_at, color="black", ls="--", lw=1, label="both replicas killed")
    top.set_ylabel("outputs/s (100 ms)")
    bottom.set_ylabel("latency from arrival (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds since the data started")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_recovery(bars: Dict[str, Dict[str, Any]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(bars)
    first = [bars[n].get("first_output_after_kill_s") or 0 for n in names]
    normal = [bars[n].get("recovered_after_kill_s") or 0 for n in names]  # 0: not measured
    fig, ax = plt.subplots(figsize=(9, 4))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], first, height=0.4, label="to the first new output")
    ax.barh([i - 0.2 for i in y], normal, height=0.4, label="to normal latency")
    for container in ax.containers:
        ax.bar_label(container, fmt="%.2f s", fontsize=7, padding=2)
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("seconds after the failure")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from flux.spark.session import local_cluster

    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: Dict[str, Any] = {"state_mb": args.state_mb, "rate_tps": args.rate,
                               "duration_s": args.duration, "interval_s": args.interval}
    with tempfile.TemporaryDirectory(prefix="flux-restart-") as tmp:
        folder = pathlib.Path(tmp)
        if {"double", "cost"} & set(args.parts):
            with local_cluster(NODES + STANDBYS + 1) as spark:
                if "double" in args.parts:
                    print("double failure ...", flush=True)
                    double = run_double(spark, args, folder / "double")
                    rows = double.pop("rows")
                    summary["double"] = double
                    with open(out / "timeline_double.csv", "w", newline="") as f:
                        w = csv.DictWriter(f, fieldnames=list(rows[0]))
                        w.writeheader()
                        w.writerows(rows)
                    plot_timeline(rows, double["kill_at_s"], out / "restart.png",
                                  f"both replicas of a partition killed ({args.state_mb} MB "
                                  f"per partition, checkpoints every {args.interval} s)")
                    print(json.dumps(double, indent=1), flush=True)
                if "cost" in args.parts:
                    print("checkpointing cost ...", flush=True)
                    summary["cost"] = cost = run_cost(spark, args, folder / "cost")
                    with open(out / "cost.csv", "w", newline="") as f:
                        w = csv.DictWriter(f, fieldnames=list(cost["runs"][0]))
                        w.writeheader()
                        w.writerows(cost["runs"])
                    print(json.dumps({k: v for k, v in cost.items() if k != "runs"}), flush=True)
        if "driver" in args.parts:
            print("driver killed and run again ...", flush=True)
            summary["driver"] = run_driver(args, folder / "driver")
            print(json.dumps(summary["driver"], indent=1), flush=True)
    bars: Dict[str, Dict[str, Any]] = {}
    if SS_SUMMARY.exists():
        ss = json.loads(SS_SUMMARY.read_text())
        bars["Flux, one executor killed (masked)"] = ss["flux"]
        bars["Structured Streaming, one executor killed"] = ss["structured_streaming"]
    if "double" in summary:
        bars["Flux, both replicas killed (restart)"] = summary["double"]
    if "driver" in summary:
        bars["Flux, driver killed and run again"] = summary["driver"]
    if bars:
        plot_recovery(bars, out / "recovery.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}/summary.json, restart.png, recovery.png, timeline_double.csv, cost.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
