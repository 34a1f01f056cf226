"""python -m experiments.scale: where a job's CPU goes as it grows, per process, and the
ceiling that projects (docs/design/parallel_io.md, step 5).

The paper's dataflow runs at one fixed total rate on ``--nodes`` nodes (2, 4 and 8 by
default) plus a standby, on the multi-host rig (a Spark standalone cluster of one host per
executor, each in a network namespace of its own; ``--local``: an embedded local-cluster).
Once the data has flowed for ``--warmup`` seconds, the CPU time of every process of the
job is read from ``/proc`` twice, ``--window`` seconds apart: the driver's Python and its
JVM, the ingress process, and each node's Python worker and executor JVM. Divided by the
inputs taken meanwhile: each process's CPU per input.

The model: the driver and the ingress process pay for every input whatever the number of
nodes (constants); a node pays for its share of the inputs and for every item it handles,
``a / N + b`` per input of the job. Fitted to the measured points, the job's ceiling on
``N`` machines is what the busiest single-threaded process allows:
``1 / max(driver, ingress, a / N + b)`` inputs per second. Each measured point is also
predicted from a fit to the others (leave one out), to show whether the model holds.

Writes ``processes.csv`` (one row per run and process), ``summary.json`` (per node
count: the medians over ``--runs`` of each kind of process's CPU per input, the busiest
process; the model, its check, and its projection).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import pathlib
import statistics
import time
from typing import Any, Dict, List, Optional

import numpy as np

from flux.connectors.sources import RateLimited
from flux.examples import paper_dataflow
from flux.testing.workloads import packet_workload

TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.scale",
                                 description="CPU per input of every process of a job at "
                                             "2, 4 and 8 nodes, and the ceiling it projects.")
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rate", type=int, default=3000, help="inputs per second, in total")
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=2, help="runs per node count, alternated")
    ap.add_argument("--local", action="store_true", help="an embedded local-cluster, no rig")
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
    found = {"driver": me, "ingress": job.ingress_pid}
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


def one_run(spark, nodes: int, args, records) -> List[Dict[str, Any]]:
    from flux.spark.job import FluxJob

    outputs = [0]

    def count(item) -> None:
        outputs[0] += 1

    job = FluxJob(spark, paper_dataflow(), RateLimited(records, args.rate), nodes=nodes,
                  standbys=1, sink=count)
    with job:
        rows = measure(job, args)
    return [{"nodes": nodes, **row} for row in rows]


def fit(points: Dict[int, float]) -> tuple:
    """``a, b`` of ``a / N + b`` by least squares over ``{N: cpu per input}``."""
    ns = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(n)] for n in ns])
    a, b = np.linalg.lstsq(np.vstack([1 / ns, np.ones_like(ns)]).T, ys, rcond=None)[0]
    return float(a), float(b)


def summarize(rows: List[Dict[str, Any]], args) -> Dict[str, Any]:
    by_nodes: Dict[int, Dict[str, Any]] = {}
    for n in sorted({r["nodes"] for r in rows}):
        mine = [r for r in rows if r["nodes"] == n and r["cpu_us_per_input"] is not None]
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
        by_nodes[n] = {"kinds": kinds, "busiest": busiest[0],
                       "busiest_us": busiest[1]["busiest_us"],
                       "input_rate": statistics.median(r["input_rate"] for r in mine)}
    model = None
    node_points = {n: v["kinds"]["node"]["busiest_us"] for n, v in by_nodes.items()
                   if "node" in v["kinds"]}
    if len(node_points) >= 2:
        a, b = fit(node_points)
        fixed = {k: statistics.median(v["kinds"][k]["median_us"] for v in by_nodes.values()
                                      if k in v["kinds"])
                 for k in ("driver", "ingress")}
        check = {}
        if len(node_points) >= 3:
            for n in node_points:
                a1, b1 = fit({m: y for m, y in node_points.items() if m != n})
                check[n] = {"measured_us": node_points[n], "predicted_us": round(a1 / n + b1, 3)}
        projection = {}
        for n in (2, 4, 8, 16, 32, 64):
            costs = {"node": a / n + b, **fixed}
            worst = max(costs, key=costs.get)
            projection[n] = {"ceiling_inputs_per_s": round(1e6 / costs[worst]),
                             "limited_by": worst}
        model = {"node_us": {"a": round(a, 3), "b": round(b, 3)},
                 "fixed_us": {k: round(v, 3) for k, v in fixed.items()},
                 "leave_one_out": check, "projection": projection}
    return {"settings": vars(args), "by_nodes": by_nodes, "model": model}


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
    records = packet_workload(int(args.rate * seconds), seed=5, pairs=100_000, apps=10,
                              sources=1_000)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    for run in range(args.runs):
        order = args.nodes if run % 2 == 0 else args.nodes[::-1]  # alternated
        for nodes in order:
            print(f"run {run + 1}/{args.runs}: {nodes} nodes ...", flush=True)
            with cluster(nodes, args.local) as spark:
                rows += [{"run": run, **r} for r in one_run(spark, nodes, args, records)]
    with open(out / "processes.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(rows, args)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for n, v in summary["by_nodes"].items():
        kinds = ", ".join(f"{k} {s['median_us']} us" for k, s in v["kinds"].items())
        print(f"{n} nodes at {v['input_rate']:.0f} inputs/s: {kinds}; busiest "
              f"{v['busiest']} {v['busiest_us']} us")
    if summary["model"]:
        print("model:", json.dumps(summary["model"]))
    print(f"wrote {out}/processes.csv, summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
