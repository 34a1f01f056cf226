"""python -m experiments.throughput_floor: the least CPU an input can cost a replicated job.

By default the design the library runs, whose protocol item is a batch, for both kinds
of operators (``experiments.item_floor``; writes ``floor_items.json``). With
``--design per-tuple``, the accounting below, of the per-tuple protocol the library
ran before items (writes ``floor.json``), kept so its figures can be measured again.

The throughput target (DESIGN 9) asks the replicated job for 0.5 of the operators-alone rate on
two cores, i.e. at most ``4 x t_alone`` of CPU per input in all (``t_alone``: the
two operators' time per input on one core). This measures, on one core, what
any design of this library's shape must spend per input whatever else it does:

- the **reference**'s time per input (``flux.reference``: the operators, the
  partitioner and the SNs, depth first, no merge, no buffer, no socket), paid
  by each of the two replicas, less the routing of the input to the first
  stage, which the ingress does once for both;
- every **crossing of a process boundary**: a batch of tuples encoded in the wire
  format (``exchange.wire``), sent and received on a ZeroMQ socket over ``ipc://``,
  decoded; and the driver's hand-over of the records to the ingress process
  (``flux.runtime.ingress_process``: pickled, the same socket kind);
- how many crossings an input makes, counted from the reference run: the input
  handed to the ingress, into both replicas of the first stage, each stage's
  outputs into both replicas of the next (each producer replica encodes its
  own), the final outputs into the egress once.

Batches are the largest the job sends (``batch_size``), so the crossing's cost per
tuple is its least. The floor is ``2 x t_ref - t_route + crossings``: a framework that spent
nothing on merges, buffers, acks, credits, polling or liveness would still spend it.
Prints the figures and writes ``floor.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List

import zmq

from exchange.partitioner import HashPartitioner
from exchange.wire import decode, encode
from experiments.item_floor import item_floor, on_shared_cores, shared_cores
from experiments.overhead import spread
from flux.addresses import Addr
from flux.data_messages import Batch
from flux.dataflow import BATCH_ROWS
from flux.envelope import Envelope
from flux.examples import paper_dataflow
from flux.reference import ReferenceRun, reference_output
from flux.testing.workloads import packet_workload


class CountingRun(ReferenceRun):
    """The reference run, counting the tuples that enter each stage (and the end)."""

    def __init__(self, dataflow, partitions: int):
        super().__init__(dataflow, partitions)
        self.entered = [0] * (len(dataflow.stages) + 1)

    def _push(self, s: int, sn, record, out: list, came_from: int = 0) -> None:
        self.entered[s] += 1
        super()._push(s, sn, record, out, came_from)


def tuples_per_stage(dataflow, records: List[Any], partitions: int) -> List[float]:
    """Per input: tuples into each stage, and final outputs (last)."""
    run = CountingRun(dataflow, partitions)
    for record in records:
        run.feed(record)
    return [n / len(records) for n in run.entered]


def _pipe(ctx: zmq.Context, path: str):
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    rx.bind(f"ipc://{path}")
    tx.connect(f"ipc://{path}")
    for s in (tx, rx):
        s.setsockopt(zmq.LINGER, 0)
    return tx, rx


def crossing_us(records: List[Any], batch: int, repeats: int) -> Dict[str, List[float]]:
    """CPU microseconds per tuple, each measured ``repeats`` times on one core: a wire
    batch's encode (``encode``), its trip through the socket, both ends (``transport``),
    its decode (``decode``), and the driver's hand-over of records to the ingress
    process: pickled, through the socket, unpickled (``hand_over``)."""
    src, dst = Addr(0, 0, 0), Addr(1, 0, 0)
    envelopes = [Envelope(src, dst, 1, Batch(tuple(((i + j + 1,), r) for j, r in
                                                   enumerate(records[i:i + batch])), (i + batch,)))
                 for i in range(0, len(records) - batch + 1, batch)]
    tuples = batch * len(envelopes)
    chunks = [records[i:i + 1000] for i in range(0, len(records), 1000)]
    out: Dict[str, List[float]] = {"encode": [], "transport": [], "decode": [], "hand_over": []}
    folder = tempfile.mkdtemp(prefix="flux-floor-")
    ctx = zmq.Context()
    tx, rx = _pipe(ctx, os.path.join(folder, "wire"))
    try:
        for _ in range(repeats):
            t = time.process_time()
            frames = [encode(env) for env in envelopes]
            out["encode"].append(1e6 * (time.process_time() - t) / tuples)
            t = time.process_time()
            for frame in frames:  # a frame at a time: the pipe never fills
                tx.send(frame)
                rx.recv()
            out["transport"].append(1e6 * (time.process_time() - t) / tuples)
            t = time.process_time()
            for frame in frames:
                decode(frame)
            out["decode"].append(1e6 * (time.process_time() - t) / tuples)
            t = time.process_time()
            for chunk in chunks:
                tx.send(pickle.dumps(("records", chunk), protocol=pickle.HIGHEST_PROTOCOL))
                pickle.loads(rx.recv())
            out["hand_over"].append(1e6 * (time.process_time() - t) / len(records))
    finally:
        tx.close()
        rx.close()
        ctx.term()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def first_routing(dataflow, records: List[Any], partitions: int):
    key, route = dataflow.stages[0].key, HashPartitioner(partitions)

    def run() -> None:
        for record in records:
            route(key(record))
    return run


def per_input_us(work, n: int, repeats: int) -> List[float]:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        work()
        times.append(1e6 * (time.process_time() - t) / n)
    return times


def floor(records: List[Any], partitions: int = 4, batch: int = 256,
          repeats: int = 5) -> Dict[str, Any]:
    """The figures of the module's docstring: medians of ``repeats`` rounds, each taking
    every measurement once, with their spread."""
    from experiments.throughput import operators_alone

    dataflow = paper_dataflow()
    n = len(records)
    works = {"alone": operators_alone(dataflow, records),
             "ref": lambda: reference_output(dataflow, records, partitions),
             "route": first_routing(dataflow, records, partitions)}
    samples: Dict[str, List[float]] = {}
    for _ in range(repeats):  # each measurement once a round: alternated, not in blocks
        for name, work in works.items():
            samples.setdefault(name, []).extend(per_input_us(work, n, 1))
        for name, values in crossing_us(records, batch, 1).items():
            samples.setdefault(name, []).extend(values)
    alone, ref, route = samples.pop("alone"), samples.pop("ref"), samples.pop("route")
    cross = samples
    entered = tuples_per_stage(dataflow, records, partitions)
    med = {k: statistics.median(v) for k, v in
           {"alone": alone, "ref": ref, "route": route, **cross}.items()}
    stages = len(entered) - 1
    receives = 2 * sum(entered[:stages]) + entered[stages]
    encodes = 1 + 2 * sum(entered[1:stages]) + entered[stages]  # the ingress encodes once
    half_trip = med["transport"] / 2  # each end's share of a tuple's trip
    crossing = (med["hand_over"] + receives * (med["decode"] + half_trip)
                + encodes * (med["encode"] + half_trip))
    least = 2 * med["ref"] - med["route"] + crossing
    budget = 4 * med["alone"]  # two cores at 0.5 x the one-core rate of the operators
    return {
        "inputs": n, "partitions": partitions, "batch": batch, "repeats": repeats,
        "us_per_input": {k: spread(v, 3) for k, v in
                         {"operators_alone": alone, "reference": ref,
                          "routing_to_the_first_stage": route}.items()},
        "us_per_tuple": {k: spread(v, 3) for k, v in cross.items()},
        "tuples_per_input": {"into_stages": [round(x, 3) for x in entered[:stages]],
                             "final_outputs": round(entered[stages], 3)},
        "receives_per_input": round(receives, 3), "encodes_per_input": round(encodes, 3),
        "crossings_us_per_input": round(crossing, 2),
        "floor_us_per_input": round(least, 2),
        "target_budget_us_per_input": round(budget, 2),
        "floor_rate_on_two_cores_tps": round(2e6 / least),
        "floor_vs_operators_alone": round((2e6 / least) / (1e6 / med["alone"]), 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.throughput_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--design", choices=("items", "per-tuple"), default="items")
    ap.add_argument("--inputs", type=int, default=200_000, help="packets (as experiments.throughput)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256, help="per-tuple: tuples per wire batch")
    ap.add_argument("--batch-rows", type=int, default=BATCH_ROWS,
                    help="items: inputs per item (the default FluxJob's)")
    ap.add_argument("--kinds", default="per-record,vectorized",
                    help="items: the operators' kinds, comma-separated")
    ap.add_argument("--copies", default="4,6",
                    help="items: the floor also run in this many processes at once "
                         "(6: a 4-node job's nodes, its ingress and its driver; 4: a 2-node job's); '' for none")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="results/throughput")
    args = ap.parse_args(argv)
    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    if args.design == "per-tuple":
        summary: Any = floor(records, args.partitions, args.batch, args.repeats)
        name = "floor.json"
    else:
        summary = {kind: item_floor(kind, records, args.partitions, args.batch_rows,
                                    args.repeats) for kind in args.kinds.split(",")}
        copies = [int(c) for c in args.copies.split(",") if c]
        for kind, figures in summary.items():
            if copies:
                figures["shared_cores"] = on_shared_cores(
                    figures, shared_cores(kind, records, copies, args.partitions,
                                          args.batch_rows, args.repeats))
        name = "floor_items.json"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if args.design == "items":
        for kind, figures in summary.items():
            print(f"{kind}: floor {figures['floor_us_per_input']} us an input, "
                  f"{figures['floor_vs_operators_alone']['median']} of the operators alone "
                  f"(the target's budget {figures['target_budget_us_per_input']} us), "
                  f"outputs exact: {figures['outputs_exact']}")
            for n, ratio in figures.get("shared_cores", {}).get(
                    "floor_vs_operators_alone", {}).items():
                print(f"  in each of {n} processes at once: {ratio} of the operators alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
