"""python -m experiments.scale: where a job's CPU goes as it grows, per process, and the
ceiling that projects (docs/design/parallel_io.md, step 5).

The paper's dataflow runs at fixed total rates (``--rates``) on ``--nodes`` nodes (2, 4
and 8 by default) plus a standby, on the multi-host rig (a Spark standalone cluster of
one host per executor, each in a network namespace of its own; ``--local``: an embedded
local-cluster). Once the data has flowed for ``--warmup`` seconds, the CPU time of every
process of the job is read from ``/proc`` twice, ``--window`` seconds apart: the
driver's Python and its JVM, the ingress process, and each node's Python worker and
executor JVM. Divided by the inputs taken meanwhile: each process's CPU per input; by
the seconds: its busy share of a core.

The model: a process's busy share is ``t + c * rate``: what it pays per second whatever
comes (loops that wake, heartbeats, items that leave half empty on their delay) and
what it pays per input. Fitted per process kind and node count over the rates (and
checked: fitted to all rates but the highest, it predicts that one). The driver and the
ingress pay per input whatever the number of nodes; a node's ``c`` is ``a / N + b`` (its
share, and what every item costs each node), fitted over the counts. The job's ceiling
on ``N`` machines is the rate at which its busiest single-threaded process is busy all
the time: ``min over processes of (1 - t) / c``.

Writes ``processes.csv`` (one row per run, rate and process) and ``summary.json`` (per
node count and rate: each kind's CPU per input, the busiest process; the fits, their
check, and the projection).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from flux.connector_api import SinkPerPartition
from flux.connectors.file_sink import FileSink
from flux.connectors.sources import RateLimited
from flux.examples import paper_dataflow
from flux.testing.workloads import packet_workload

TICKS = os.sysconf("SC_CLK_TCK")
#: inputs per second the records of a run at rate 0 (as fast as taken) are made for
FULL_RATE = 60_000


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.scale",
                                 description="CPU per input of every process of a job at "
                                             "2, 4 and 8 nodes, and the ceiling it projects.")
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rates", type=int, nargs="+", default=[2000, 5000, 8000],
                    help="total inputs per second, each measured in turn on one cluster "
                         "(0: as fast as the job takes them)")
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=1, help="runs per node count, alternated")
    ap.add_argument("--local", action="store_true", help="an embedded local-cluster, no rig")
    ap.add_argument("--egress", nargs="+", choices=("driver", "executors"),
                    default=["driver"],
                    help="where the egresses run (several: alternated at every rate): one "
                         "ordered egress in the driver, or each partition's on an executor "
                         "into a FileSink of its own (egress_on_executors)")
    ap.add_argument("--source", nargs="+", choices=("driver", "splits", "splits-logged"),
                    default=["driver"],
                    help="who reads the input (several: alternated at every rate): the "
                         "driver, feeding its ingress process; or ingresses on the "
                         "executors, a split per node (a SplitSource, each split paced at "
                         "rate / nodes); splits-logged: the same with checkpoint= (no "
                         "checkpoint within the run: what the splits' durable logs cost)")
    ap.add_argument("--summarize", action="store_true",
                    help="no runs: the summary of the processes.csv in --out, again")
    ap.add_argument("--out", default="docs/results/scale")
    return ap.parse_args(argv)


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU of process ``pid`` so far (its threads included), or None when
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def children(pid: int) -> List[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def processes(job) -> Dict[str, int]:
    """Every process of the job by role: ``driver``, ``driver-jvm``, ``ingress``, and
    ``<node>`` / ``<node>-jvm`` for each node (standbys included)."""
    me = os.getpid()
    found = {"driver": me}
    if job.ingress_pid is not None:  # none: the splits are read on the executors
        found["ingress"] = job.ingress_pid
    jvms = [p for p in children(me) if p != job.ingress_pid]
    if jvms:
        found["driver-jvm"] = jvms[0]
    controller = job.controller
    for name in sorted(controller.registered):
        worker, jvm = controller.pids(name)
        found[name], found[f"{name}-jvm"] = worker, jvm
    return found


def kind_of(role: str) -> str:
    if role in ("driver", "driver-jvm", "ingress"):
        return role
    return "node-jvm" if role.endswith("-jvm") else "node"


def measure(job, args) -> List[Dict[str, Any]]:
    """Each process's CPU per input over ``--window`` seconds of steady flow."""
    m = job.metrics
    assert job.wait_until(lambda: m.t0 is not None and
                          time.monotonic() - m.t0 >= args.warmup, 180)
    procs = processes(job)
    before = {role: cpu_seconds(pid) for role, pid in procs.items()}
    inputs0, started = m.input_total, time.monotonic()
    job.wait_until(lambda: False, args.window)  # sleeps; raises a job error at once
    after = {role: cpu_seconds(pid) for role, pid in procs.items()}
    inputs, seconds = m.input_total - inputs0, time.monotonic() - started
    rows = []
    for role, pid in procs.items():
        if before[role] is None or after[role] is None:
            continue
        cpu = after[role] - before[role]
        rows.append({"role": role, "kind": kind_of(role), "pid": pid,
                     "cpu_s": round(cpu, 3), "inputs": inputs,
                     "input_rate": round(inputs / seconds, 1),
                     "cpu_us_per_input": round(cpu / inputs * 1e6, 3) if inputs else None,
                     "busy_share": round(cpu / seconds, 4)})
    return rows


def one_run(spark, nodes: int, rate: int, args, records, egress: str = "driver",
            source: str = "driver") -> List[Dict[str, Any]]:
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob

    def count(item) -> None:
        pass

    with tempfile.TemporaryDirectory(prefix="flux-scale-") as folder:
        where = dict(sink=count) if egress == "driver" else dict(
            sink=SinkPerPartition(lambda p: FileSink(f"{folder}/{p}")),
            ordered_output=False, egress_on_executors=True)
        if source == "driver":
            feed = RateLimited(records, rate) if rate else records
        else:
            feed = ListSplits([records[k::nodes] for k in range(nodes)],
                              rate=rate / nodes if rate else None)
        if source == "splits-logged":  # the logs written, no checkpoint cut in the run
            where.update(checkpoint=f"{folder}/ckpt", checkpoint_interval=3600.0)
        job = FluxJob(spark, paper_dataflow(), feed, nodes=nodes, standbys=1, **where)
        with job:
            rows = measure(job, args)
    return [{"nodes": nodes, "rate": rate, "egress": egress, "source": source, **row}
            for row in rows]


def fit(points: Dict[int, float]) -> tuple:
    """``a, b`` of ``a / N + b`` by least squares over ``{N: cpu per input}``."""
    ns = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(n)] for n in ns])
    a, b = np.linalg.lstsq(np.vstack([1 / ns, np.ones_like(ns)]).T, ys, rcond=None)[0]
    return float(a), float(b)


def line(points: Dict[float, float]) -> tuple:
    """``t, c`` of ``t + c * rate`` by least squares over ``{rate: busy share}``."""
    rates = np.array(sorted(points), dtype=float)
    busy = np.array([points[r] for r in sorted(points)])
    t, c = np.linalg.lstsq(np.vstack([np.ones_like(rates), rates]).T, busy, rcond=None)[0]
    return float(t), float(c)


def busy_points(rows: List[Dict[str, Any]], nodes: int, kind: str) -> Dict[float, float]:
    """``{rate: busy share}`` of a kind of process at ``nodes`` (the busiest node; the
    median over runs)."""
    out: Dict[float, float] = {}
    for rate in sorted({r["rate"] for r in rows if r["nodes"] == nodes}):
        per_run: Dict[int, float] = {}
        for r in rows:
            if r["nodes"] == nodes and r["rate"] == rate and r["kind"] == kind:
                per_run[r["run"]] = max(per_run.get(r["run"], 0.0), r["busy_share"])
        if per_run:
            out[rate] = statistics.median(per_run.values())
    return out


def summarize(rows: List[Dict[str, Any]], args) -> Dict[str, Any]:
    by: Dict[str, Any] = {}
    for n, rate, egress, source in sorted({(r["nodes"], r["rate"], r.get("egress", "driver"),
                                            r.get("source", "driver")) for r in rows}):
        mine = [r for r in rows if r["nodes"] == n and r["rate"] == rate
                and r.get("egress", "driver") == egress
                and r.get("source", "driver") == source
                and r["cpu_us_per_input"] is not None]
        kinds: Dict[str, Any] = {}
        for kind in ("driver", "driver-jvm", "ingress", "node", "node-jvm"):
            per_run: Dict[int, List[float]] = {}
            for r in mine:
                if r["kind"] == kind:
                    per_run.setdefault(r["run"], []).append(r["cpu_us_per_input"])
            if not per_run:
                continue
            # per run: the mean over that kind's processes (nodes) and the busiest of them
            means = [statistics.mean(v) for v in per_run.values()]
            tops = [max(v) for v in per_run.values()]
            kinds[kind] = {"median_us": round(statistics.median(means), 3),
                           "spread_us": [round(min(means), 3), round(max(means), 3)],
                           "busiest_us": round(statistics.median(tops), 3)}
        busiest = max(kinds.items(), key=lambda kv: kv[1]["busiest_us"])
        name = f"{n} nodes at {rate}/s" + ("" if egress == "driver" else ", egress on executors") \
            + ("" if source == "driver" else ", splits read on executors") \
            + (", their logs written" if source == "splits-logged" else "")
        by[name] = {
            "nodes": n, "rate": rate, "egress": egress, "source": source, "kinds": kinds,
            "busiest": busiest[0],
            "busiest_us": busiest[1]["busiest_us"],
            "input_rate": statistics.median(r["input_rate"] for r in mine)}
    # the model: of the egress where it was measured first (the driver, as before)
    def mode(r):
        return r.get("egress", "driver"), r.get("source", "driver")

    first = [r for r in rows if mode(r) == mode(rows[0])] if rows else []
    return {"settings": vars(args), "measured": by, "model": model(first)}


def model(rows: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fits of ``t + c * rate`` per kind and node count, their check, the nodes' ``c``
    as ``a / N + b``, and the ceiling they project."""
    counts = sorted({r["nodes"] for r in rows})
    if len({r["rate"] for r in rows}) < 2:
        return None
    fits: Dict[str, Dict[int, Any]] = {}
    for kind in ("driver", "ingress", "node"):
        for n in counts:
            points = busy_points(rows, n, kind)
            if len(points) < 2:
                continue
            t, c = line(points)
            entry = {"per_second": round(t, 4), "per_input_us": round(c * 1e6, 3)}
            if len(points) >= 3:  # fitted without the highest rate, it predicts it
                top = max(points)
                t1, c1 = line({r: b for r, b in points.items() if r != top})
                entry["check"] = {"rate": top, "measured": round(points[top], 4),
                                  "predicted": round(t1 + c1 * top, 4)}
            fits.setdefault(kind, {})[n] = entry
    if "node" not in fits or len(fits["node"]) < 2:
        return {"fits": fits}
    a, b = fit({n: f["per_input_us"] for n, f in fits["node"].items()})
    node_t = statistics.median(f["per_second"] for f in fits["node"].values())
    fixed = {k: (statistics.median(f["per_second"] for f in fits[k].values()),
                 statistics.median(f["per_input_us"] for f in fits[k].values()))
             for k in ("driver", "ingress") if k in fits}
    projection = {}
    for n in (2, 4, 8, 16, 32, 64):
        costs = {"node": (node_t, a / n + b), **fixed}
        # a cost per input the fit puts at or below zero limits nothing
        ceilings = {k: (1 - t) / (c / 1e6) if c > 0 else float("inf")
                    for k, (t, c) in costs.items()}
        worst = min(ceilings, key=ceilings.get)
        projection[n] = {"ceiling_inputs_per_s": _rounded(ceilings[worst]),
                         "limited_by": worst,
                         "without_driver_and_ingress": _rounded(ceilings["node"])}
    return {"fits": fits, "node_per_input_us": {"a": round(a, 3), "b": round(b, 3)},
            "node_per_second": round(node_t, 4), "projection": projection}


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _rounded(value: float) -> Optional[int]:
    return None if value == float("inf") else round(value)


@contextlib.contextmanager
def cluster(nodes: int, local: bool):
    """A Spark session with an executor per node, one for the standby and a spare."""
    if local:
        from flux.spark.session import local_cluster

        with local_cluster(nodes + 2) as spark:
            yield spark
        return
    from flux.testing.rig import Rig

    with Rig(nodes + 2) as rig:
        yield rig.session("flux-scale")


def main(argv=None) -> int:
    args = parse_args(argv)
    seconds = args.warmup + args.window + 30
    most = max(max(args.rates), FULL_RATE if 0 in args.rates else 0)
    records = packet_workload(int(most * seconds), seed=5, pairs=100_000,
                              apps=10, sources=1_000)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    if args.summarize:
        rows = [{k: _number(v) for k, v in r.items()}
                for r in csv.DictReader(open(out / "processes.csv"))]
    for run in range(0 if args.summarize else args.runs):
        order = args.nodes if run % 2 == 0 else args.nodes[::-1]  # alternated
        for k, nodes in enumerate(order):
            with cluster(nodes, args.local) as spark:
                rates = args.rates if (run + k) % 2 == 0 else args.rates[::-1]
                for j, rate in enumerate(rates):
                    modes = [(e, s) for e in args.egress for s in args.source]
                    for egress, source in modes if (run + k + j) % 2 == 0 else modes[::-1]:
                        print(f"run {run + 1}/{args.runs}: {nodes} nodes at {rate}/s, "
                              f"egress in the {egress}, source read by the {source} ...",
                              flush=True)
                        rows += [{"run": run, **r} for r in one_run(
                            spark, nodes, rate, args, records, egress, source)]
    with open(out / "processes.csv", "w", newline="") as f:  # again, if read
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(rows, args)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, v in summary["measured"].items():
        kinds = ", ".join(f"{k} {s['median_us']} us" for k, s in v["kinds"].items())
        print(f"{name}: {kinds}; busiest {v['busiest']} {v['busiest_us']} us")
    if summary["model"]:
        print("model:", json.dumps(summary["model"]))
    print(f"wrote {out}/processes.csv, summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
