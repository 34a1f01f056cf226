"""python -m experiments.restart: what a failure Flux cannot mask costs.

Three parts, on one embedded local-cluster (one Spark at a time):

- ``double``: a counting dataflow with ``--state-mb`` MB of keyed state per
  partition, fed at ``--rate`` from a replayable paced source, checkpointing
  every ``--interval`` seconds; at ``--kill-at`` both replicas of stage 1
  partition 0 are SIGKILLed. The job restarts by itself from its last
  checkpoint. Reported: the time from the kill to the first new output and
  until latency (counted from each input's first arrival) is back to normal,
  checkpoint sizes and times, and whether the output equals the failure-free
  run's. Checkpoints are incremental: each replica writes a whole snapshot once
  in ``--full-every`` checkpoints and otherwise its keyed stores' changes since
  its previous one (``FluxJob(checkpoint_full_every=)``). Unless
  ``--full-every`` is 1, the same failure is run again with every checkpoint
  whole (``checkpoint_full_every=1``, what checkpoints were before) for
  comparison.
- ``driver``: ``experiments.resumable_job`` (the same dataflow read from
  JSON-lines files into a ``FileSink``) has its driver SIGKILLed at
  ``--kill-at`` and is run again with the same checkpoint location: the time
  from the kill to the new driver's data and first output (a new driver starts
  its own Spark first), and whether the sink holds the failure-free output.
- ``cost``: the throughput of the same dataflow read as fast as it is taken,
  without checkpoints, with whole checkpoints (``checkpoint_full_every=1``) and
  with incremental ones (``--full-every``) every ``--interval`` seconds,
  ``--cost-runs`` runs of each, alternated and rotated (ABC BCA CAB ...: no mode
  always runs first or last in its round); medians, spread (min-max) and the
  ratios against no checkpoints.

Every checkpoint is told whole or incremental by what its snapshots' reports to
the job's ``CheckpointService`` say: a snapshot whose chain is one file is
whole, a longer chain is a delta; a checkpoint is ``whole`` when all its
snapshots are, ``incremental`` when none is, else ``mixed`` (a replica that
writes for the first time, after a restart or a take-over, writes whole).
Each run also records ``others_cpu_share``: the share of the machine's CPU that
processes outside this experiment used meanwhile (figures on 2 cores are only as
good as the machine was quiet).

Writes ``summary.json``, ``timeline_double.csv`` (and
``timeline_double_full_every_1.csv``), ``cost.csv``,
``restart.png`` (the double failure's timeline) and ``recovery.png`` (time to
first output and to normal latency beside Flux's masked single failure and
Spark Structured Streaming's recovery, from
``docs/results/vs_structured_streaming/summary.json``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
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
    ap.add_argument("--full-every", type=int, default=10,
                    help="a whole snapshot once in this many checkpoints, else the keyed "
                         "stores' changes since the last (1: every checkpoint whole)")
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
    if args.full_every < 1:
        ap.error("--full-every must be >= 1")
    return args


def dataflow(state_mb: float):
    from flux.testing.dataflows import counting_dataflow, with_ballast

    return with_ballast(counting_dataflow(2), state_mb) if state_mb else counting_dataflow(2)


# -- what else ran meanwhile ---------------------------------------------------------------------
class OtherLoad:
    """The CPU that processes other than this one and its descendants (Spark's JVMs and
    Python workers, a resumable job's driver) used on this machine: measurements on 2
    cores are only as good as the machine was quiet. ``others()`` is the share of all
    cores (0-1) they used since ``start()``, from ``/proc`` (None where there is none):
    the machine's busy time less this process tree's CPU (its reaped children's
    included). Approximate: a process of this experiment that ends without a process of
    it reaping it (a Python worker whose daemon died first) takes its CPU out of the
    tree's, so a share can be overstated (above 1 is that)."""

    def __init__(self):
        self.t0, self.busy0, self.mine0 = time.monotonic(), None, None

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # not idle/iowait

    @staticmethod
    def _mine() -> float:
        """CPU seconds of this process and its descendants (with their reaped children)."""
        parent, cpu = {}, {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            parent[int(name)] = int(fields[1])
            cpu[int(name)] = sum(int(x) for x in fields[11:15])
        mine, grew = {os.getpid()}, True
        while grew:
            more = {pid for pid, pp in parent.items() if pp in mine} - mine
            grew, mine = bool(more), mine | more
        return sum(cpu.get(pid, 0) for pid in mine) / os.sysconf("SC_CLK_TCK")

    def start(self) -> "OtherLoad":
        try:
            self.t0, self.busy0, self.mine0 = time.monotonic(), self._busy(), self._mine()
        except (OSError, ValueError, IndexError):
            self.busy0 = None
        return self

    def others(self) -> Any:
        if self.busy0 is None:
            return None
        try:
            busy, mine = self._busy() - self.busy0, self._mine() - self.mine0
        except (OSError, ValueError, IndexError):
            return None
        wall = (time.monotonic() - self.t0) * (os.cpu_count() or 1)
        return round(max(0.0, busy - mine) / wall, 3) if wall > 0 else None


# -- checkpoints, whole or incremental -------------------------------------------------------
class SnapshotReports:
    """Every snapshot report (``SnapshotWritten``) ``job``'s ``CheckpointService`` gets: it
    wraps the service's ``snapshot_written`` before the job starts (the controller takes
    the method at each attempt's launch), and passes every report on unchanged."""

    def __init__(self, job):
        self.reports: List[Any] = []
        service = job.checkpoints
        handle = service.snapshot_written

        def record(msg):
            self.reports.append(msg)
            handle(msg)

        service.snapshot_written = record

    def rows(self, completed) -> List[Dict[str, Any]]:
        """One row per completed checkpoint: its kind, bytes and seconds (the service's:
        every snapshot's bytes, from the cut's choice to the manifest), and how many of its
        snapshots were whole and deltas."""
        out = []
        for c in completed:
            written = [m for m in self.reports if m.number == c.number and not m.error]
            whole = sum(1 for m in written if len(m.chain) <= 1)
            deltas = len(written) - whole
            kind = "whole" if not deltas else "incremental" if not whole else "mixed"
            out.append({"number": c.number, "cut": c.cut, "kind": kind,
                        "mb": round(c.nbytes / 1e6, 3), "seconds": round(c.seconds, 3),
                        "whole_snapshots": whole, "delta_snapshots": deltas,
                        "longest_chain": max((len(m.chain) for m in written), default=0)})
        return out


def spread(xs) -> Dict[str, Any]:
    return {"median": round(statistics.median(xs), 3), "min": min(xs), "max": max(xs)}


def by_kind(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Checkpoints' MB and seconds, median and spread, per kind (whole, incremental, mixed)."""
    out = {}
    for kind in ("whole", "incremental", "mixed"):
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            out[kind] = {"count": len(mine), "mb": spread([r["mb"] for r in mine]),
                         "seconds": spread([r["seconds"] for r in mine])}
    return out


# -- a double failure, restarted from the last checkpoint ----------------------------------
def run_double(spark, args, folder: pathlib.Path, full_every: int) -> Dict[str, Any]:
    from flux.addresses import Addr, P, S
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(int(args.rate * args.duration), seed=7, keys=50)
    flow = dataflow(args.state_mb)
    expected = reference_output(flow, records, NODES)
    job = FluxJob(spark, flow, Paced(records, args.rate), nodes=NODES, standbys=STANDBYS,
                  checkpoint=str(folder / "ckpt"), checkpoint_interval=args.interval,
                  checkpoint_full_every=full_every, keep_output=True)
    reports = SnapshotReports(job)
    load = OtherLoad().start()
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
    checkpoints = reports.rows(done)
    return {
        "full_every": full_every,
        "kill_at_s": round(kill_at, 3),
        "restarted_from_checkpoint": restarts[0][1] if restarts else None,
        "restart_begun_after_kill_s": round(restarts[0][0] - kill_at, 3) if restarts else None,
        "data_again_after_kill_s": round(starts[0][0] - kill_at, 3) if starts else None,
        **figures,
        "outputs": len(output),
        "output_matches_reference": [wire_form(x) for x in output]
        == [wire_form(x) for x in expected],
        "checkpoints": checkpoints,
        "checkpoints_by_kind": by_kind(checkpoints),
        "others_cpu_share": load.others(),
        "rows": rows,
    }


# -- the driver killed and run again ------------------------------------------------------
def run_driver(args, folder: pathlib.Path) -> Dict[str, Any]:
    from experiments.resumable_job import Program, read_sink, write_inputs

    expected = write_inputs(folder / "in", int(args.rate * args.duration))
    cli = ["--input", str(folder / "in"), "--sink", str(folder / "out"), "--checkpoint",
           str(folder / "ckpt"), "--interval", str(args.interval), "--rate", str(args.rate),
           "--state-mb", str(args.state_mb), "--full-every", str(args.full_every)]
    load = OtherLoad().start()
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
        "full_every": args.full_every,
        "kill_after_start_s": round(killed - started["t"], 3),
        "resumed_from_checkpoint": resumed["checkpoint"],
        "resumed_at_cut": resumed["cut"],
        "spark_up_after_kill_s": round(spark_up["t"] - killed, 3),
        "data_again_after_kill_s": round(resumed["t"] - killed, 3),
        "flux_start_s": round(resumed["t"] - spark_up["t"], 3),
        "first_output_after_kill_s": round(output["t"] - killed, 3),
        "sink_matches_reference": read_sink("jsonl", str(folder / "out")) == expected,
        "others_cpu_share": load.others(),
    }


# -- what checkpointing costs ---------------------------------------------------------------
def cost_modes(full_every: int) -> List[tuple]:
    """(name, checkpoint_full_every or None for no checkpoints), in the order they run."""
    modes = [("without", None), ("whole", 1)]
    if full_every != 1:
        modes.append(("incremental", full_every))
    return modes


def run_cost(spark, args, folder: pathlib.Path) -> Dict[str, Any]:
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(args.cost_inputs, seed=9, keys=50)
    flow = dataflow(args.state_mb)
    modes = cost_modes(args.full_every)
    runs: List[Dict[str, Any]] = []
    for k in range(args.cost_runs):
        # ABC BCA CAB ...: no mode always runs first or last in its round
        for mode, full_every in modes[k % len(modes):] + modes[:k % len(modes)]:
            ckpt = str(folder / f"cost{k}-{mode}") if full_every else None
            job = FluxJob(spark, flow, records, nodes=NODES, standbys=STANDBYS,
                          checkpoint=ckpt, checkpoint_interval=args.interval,
                          checkpoint_full_every=full_every or 1,
                          keep_output=False, sink=lambda item: None)
            reports = SnapshotReports(job) if full_every else None
            load = OtherLoad().start()
            with job:
                job.wait(timeout=600)
                seconds = time.monotonic() - job.metrics.t0
                done = list(job.checkpoints.completed) if full_every else []
            rows = reports.rows(done) if reports else []
            runs.append({"round": k, "mode": mode, "full_every": full_every,
                         "seconds": round(seconds, 3),
                         "inputs_per_s": round(len(records) / seconds, 1),
                         "complete": len(rows),
                         "kinds": " ".join(r["kind"] for r in rows),
                         "mb": " ".join(f"{r['mb']:.2f}" for r in rows),
                         "ckpt_seconds": " ".join(f"{r['seconds']:.3f}" for r in rows),
                         "others_cpu_share": load.others(),
                         "checkpoints": rows})
            print(f"  cost run {len(runs)}: {mode:<11} {runs[-1]['inputs_per_s']:.0f} inputs/s "
                  f"({len(rows)} checkpoints: {runs[-1]['kinds'] or '-'}; "
                  f"MB {runs[-1]['mb'] or '-'}; others' CPU {runs[-1]['others_cpu_share']})",
                  flush=True)

    return {"runs": runs, "order": " ".join(mode for mode, _ in modes) + " (rotated each round)",
            **cost_figures(runs, [mode for mode, _ in modes])}


def cost_figures(runs: List[Dict[str, Any]], modes: List[str]) -> Dict[str, Any]:
    """Throughput per mode (median, min-max), the ratio of each checkpointing mode's median
    to the median without, the same ratio taken within each round (its runs ran one after
    the other, so a load that comes and goes weighs on them alike: median, min-max), and
    the checkpoints' sizes and times per kind."""
    throughput = {m: spread([r["inputs_per_s"] for r in runs if r["mode"] == m])
                  for m in modes}
    for stats in throughput.values():
        stats["median"] = round(stats["median"], 1)
    base = throughput["without"]["median"]
    with_ = [m for m in modes if m != "without"]
    rounds = {}
    for r in runs:
        rounds.setdefault(r["round"], {})[r["mode"]] = r["inputs_per_s"]
    paired = {m: spread([round(x[m] / x["without"], 4) for x in rounds.values()
                         if m in x and "without" in x]) for m in with_}
    return {
        "throughput": throughput,
        "ratio_to_without": {m: round(throughput[m]["median"] / base, 4) for m in with_},
        "cost_pct": {m: round(100 * (1 - throughput[m]["median"] / base), 1) for m in with_},
        "ratio_to_without_same_round": paired,
        "checkpoints_by_kind": {m: by_kind([c for r in runs if r["mode"] == m
                                            for c in r["checkpoints"]]) for m in with_},
    }


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
    for container, values in zip(ax.containers, (first, normal)):
        ax.bar_label(container, labels=[f"{v:.2f} s" if v else "not measured" for v in values],
                     fontsize=7, padding=2)
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("seconds after the failure")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_rows(rows: List[Dict[str, Any]], path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def report(summary: Dict[str, Any]) -> str:
    """The figures, as a few lines for the terminal."""
    lines = []

    def kinds(label, table):
        for kind, k in table.items():
            lines.append(f"  {label:<34} {kind:<11} x{k['count']:<3} "
                         f"MB {k['mb']['median']:.2f} ({k['mb']['min']:.2f}-{k['mb']['max']:.2f})  "
                         f"s {k['seconds']['median']:.3f} "
                         f"({k['seconds']['min']:.3f}-{k['seconds']['max']:.3f})")

    lines.append("checkpoints (kind, count, MB and seconds: median (min-max)):")
    for key in ("double", "double_full_every_1"):
        if key in summary:
            kinds(f"{key} (full_every={summary[key]['full_every']})",
                  summary[key]["checkpoints_by_kind"])
    if "cost" in summary:
        for mode, table in summary["cost"]["checkpoints_by_kind"].items():
            kinds(f"cost, {mode}", table)
    for key in ("double", "double_full_every_1"):
        if key in summary:
            d = summary[key]
            lines.append(f"{key}: restored from {d['restarted_from_checkpoint']}, data again "
                         f"{d['data_again_after_kill_s']} s, first output "
                         f"{d['first_output_after_kill_s']} s, normal latency "
                         f"{d['recovered_after_kill_s']} s after the kill; "
                         f"exact: {d['output_matches_reference']}; "
                         f"others' CPU {d.get('others_cpu_share')}")
    if "driver" in summary:
        d = summary["driver"]
        lines.append(f"driver: Spark up {d['spark_up_after_kill_s']} s, first output "
                     f"{d['first_output_after_kill_s']} s after the kill; "
                     f"exact: {d['sink_matches_reference']}; "
                     f"others' CPU {d.get('others_cpu_share')}")
    if "cost" in summary:
        c = summary["cost"]
        for mode, t in c["throughput"].items():
            ratio = c["ratio_to_without"].get(mode)
            lines.append(f"cost, {mode:<11}: {t['median']:.0f} inputs/s "
                         f"({t['min']:.0f}-{t['max']:.0f})"
                         + (f", x{ratio:.3f} ({c['cost_pct'][mode]}%)" if ratio else "")
                         + (f"; within rounds x{c['ratio_to_without_same_round'][mode]['median']}"
                            f" ({c['ratio_to_without_same_round'][mode]['min']}-"
                            f"{c['ratio_to_without_same_round'][mode]['max']})"
                            if mode in c.get("ratio_to_without_same_round", {}) else ""))
        shares = [r["others_cpu_share"] for r in c["runs"]
                  if r.get("others_cpu_share") is not None]
        if shares:
            lines.append(f"others' CPU during the cost runs: median {statistics.median(shares)}"
                         f" ({min(shares)}-{max(shares)}) of the machine")
    return "\n".join(lines)


def main(argv=None) -> int:
    from flux.spark.session import local_cluster

    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: Dict[str, Any] = {"state_mb": args.state_mb, "rate_tps": args.rate,
                               "duration_s": args.duration, "interval_s": args.interval,
                               "full_every": args.full_every}
    earlier = out / "summary.json"
    if set(args.parts) != set(PARTS) and earlier.exists():
        # a run of some parts keeps the others of an earlier run with the same settings
        kept = json.loads(earlier.read_text())
        if all(kept.get(k) == v for k, v in summary.items()):
            redone = {key for part in args.parts for key in
                      (("double", "double_full_every_1") if part == "double" else (part,))}
            taken = [k for k in kept if k not in summary and k not in redone]
            summary.update({k: kept[k] for k in taken})
            print(f"keeping {', '.join(taken) or 'nothing'} of {earlier}", flush=True)
    with tempfile.TemporaryDirectory(prefix="flux-restart-") as tmp:
        folder = pathlib.Path(tmp)
        if {"double", "cost"} & set(args.parts):
            with local_cluster(NODES + STANDBYS + 1) as spark:
                if "double" in args.parts:
                    # the incremental run, then every checkpoint whole (what they were)
                    runs = [("double", args.full_every, "timeline_double.csv")]
                    if args.full_every != 1:
                        runs.append(("double_full_every_1", 1,
                                     "timeline_double_full_every_1.csv"))
                    for key, full_every, csv_name in runs:
                        print(f"double failure (full_every={full_every}) ...", flush=True)
                        double = run_double(spark, args, folder / key, full_every)
                        rows = double.pop("rows")
                        summary[key] = double
                        write_rows(rows, out / csv_name)
                        if key == "double":
                            plot_timeline(
                                rows, double["kill_at_s"], out / "restart.png",
                                f"both replicas of a partition killed ({args.state_mb} MB per "
                                f"partition, checkpoints every {args.interval} s, whole once "
                                f"in {full_every})")
                        print(json.dumps(double, indent=1), flush=True)
                if "cost" in args.parts:
                    print("checkpointing cost ...", flush=True)
                    summary["cost"] = cost = run_cost(spark, args, folder / "cost")
                    write_rows([{k: v for k, v in r.items() if k != "checkpoints"}
                                for r in cost["runs"]], out / "cost.csv")
                    print(json.dumps({k: v for k, v in cost.items() if k != "runs"}, indent=1),
                          flush=True)
        if "driver" in args.parts:
            print("driver killed and run again ...", flush=True)
            summary["driver"] = run_driver(args, folder / "driver")
            print(json.dumps(summary["driver"], indent=1), flush=True)
    bars: Dict[str, Dict[str, Any]] = {}
    if SS_SUMMARY.exists():
        ss = json.loads(SS_SUMMARY.read_text())
        bars["Flux, one executor killed (masked)"] = ss["flux"]
        bars["Structured Streaming, one executor killed"] = ss["structured_streaming"]
    if "double_full_every_1" in summary:
        bars["Flux, both replicas killed (restart, whole checkpoints)"] = \
            summary["double_full_every_1"]
    if "double" in summary:
        bars[f"Flux, both replicas killed (restart, whole once in {args.full_every})"] = \
            summary["double"]
    if "driver" in summary:
        bars["Flux, driver killed and run again"] = summary["driver"]
    if bars:
        plot_recovery(bars, out / "recovery.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(report(summary), flush=True)
    print(f"wrote {out}/summary.json, restart.png, recovery.png, timeline_double*.csv, cost.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
