"""The least CPU an input costs a replicated job whose protocol item is a batch (DESIGN 11).

``experiments.throughput_floor``'s accounting for the per-tuple protocol, redone for
the design the library runs now, with its own pieces: an item of up to
``batch_rows`` inputs goes breadth-first through the stages exactly as a job's
replicas take it, and every piece of work on the data path is timed on one core:

- the driver's **hand-over** of the inputs to the ingress process (records pickled
  a read at a time, or a columnar source's Arrow batches as they are);
- the **ingress**: the inputs made an item (``PendingInputs``), put in stage 1's form
  and routed by its key (``exchange.routing.routed``), split into one sub-item per
  partition, each sub-item **encoded** in the wire format once for both replicas;
- in each stage, per partition and per item, in SN order: each sub-item that came
  from a producer **decoded**, the sub-items **merged** by row SN, the
  **operators** through the segment's own call (a chain's ``process_many`` or
  ``process_arrow``) and the outputs **numbered** per row, the outputs **routed** to the
  next stage and split, each sub-item **encoded**;
- the **egress**: decode, and the ``(sn, record)`` pairs a sink is given;
- each frame's **trip** through a ZeroMQ ``ipc://`` socket, both ends.

Each replica of a stage does that stage's work (counted twice); each producer
replica encodes what it sends its own consumer replica, the last stage's secondary
sends nothing while its primary lives (5.1); the ingress encodes once and sends to
both replicas. Merges, buffers, acks, credits, progress bounds, polling, liveness
and metrics count as free. Both the pipeline and the operators alone run with
the garbage collector's thresholds of a node process. The outputs are checked
against the reference, so the floor is known to do the job's work. The floor is
the sum; its ratio to the operators alone is the rate two cores allow it over the
operators' one-core rate.
"""
from __future__ import annotations

import gc
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable, Dict, List, Sequence, Tuple

import zmq

from exchange.routing import ToOne, router_for, routed
from exchange.rows import merge
from exchange.wire import decode, encode
from flux.addresses import Addr
from flux.data_messages import Batch
from flux.envelope import Envelope
from flux.protocol.pending_inputs import PendingInputs
from flux.runtime.gc_tuning import data_path_gc
from flux.runtime.ingress_feed import READ_LIMIT
from flux.runtime.ingress_process import RECORDS


class ItemPipeline:
    """One replica's worth of a dataflow's data path over items, timing each piece."""

    def __init__(self, dataflow, partitions: int):
        self.dataflow, self.partitions = dataflow, partitions
        stages = dataflow.stages
        self.routers = [router_for(stage.key, partitions, stage.schema) for stage in stages]
        self.routers.append(ToOne())  # the last stage's outputs: all to the egress
        self.chains = [[stage.build_chain() for _ in range(partitions)] for stage in stages]
        self.us: Dict[str, float] = defaultdict(float)
        self.frames: Dict[str, List[bytes]] = defaultdict(list)
        self.outputs: List[Tuple[Any, Any]] = []
        self._first = 1

    def run(self, runs: List[Any], batch_rows: int) -> None:
        """``runs``: what the driver hands over (lists of records, or Arrow batches), cut
        into items of at most ``batch_rows`` inputs as the ingress does."""
        pending = PendingInputs()
        for run in runs:
            if pending.count and pending.count + len(run) > batch_rows:
                self._item(pending)
            pending.add(run)
        if pending.count:
            self._item(pending)

    def _item(self, pending: PendingInputs) -> None:
        first, last = self._first, self._first + pending.count - 1
        sn = (last, 0)  # the ingress's connection SN: the item's last input, its index
        with self._timed("ingress_route"):
            rows, routes = routed(self.routers[0], pending.rows(first), self.partitions)
            subs = rows.split(routes, self.partitions)
        self._first = last + 1
        pending.clear()
        inbox = [[] if frame is None else [(sn, frame)]
                 for frame in self._encoded("ingress", sn, subs)]
        for s in range(len(self.chains)):
            inbox = self._stage(s, inbox)
        self._egress(inbox[0])

    def _stage(self, s: int, inbox: List[List[Tuple[tuple, bytes]]]) -> list:
        last = s == len(self.chains) - 1
        count = 1 if last else self.partitions
        out: List[List[Tuple[tuple, bytes]]] = [[] for _ in range(count)]
        for p, arrived in enumerate(inbox):
            chain = self.chains[s][p]
            for item, parts in _by_item(arrived):
                with self._timed(f"s{s}_decode"):
                    parts = [decode(frame).msg.items[0][1] for frame in parts]
                with self._timed(f"s{s}_merge"):
                    rows = merge(parts)
                with self._timed(f"s{s}_operators"):
                    if chain.columnar:
                        made = rows.outputs(*chain.process_arrow(rows.batch))
                    else:
                        rows = rows.as_records()
                        made = rows.outputs(chain.process_many(rows.records))
                if not len(made):
                    continue
                sn = item + (p,)
                with self._timed(f"s{s}_route"):
                    made, routes = routed(self.routers[s + 1], made, count)
                    subs = [made] if routes is None else made.split(routes, count)
                for i, frame in enumerate(self._encoded(f"s{s}", sn, subs)):
                    if frame is not None:
                        out[i].append((sn, frame))
        return out

    def _encoded(self, who: str, sn: tuple, subs: list) -> List[Any]:
        src, dst = Addr(0, 0, 0), Addr(1, 0, 0)
        frames = []
        with self._timed(f"{who}_encode"):
            for sub in subs:
                frames.append(None if sub is None else
                              encode(Envelope(src, dst, 1, Batch(((sn, sub),), sn))))
        self.frames[who].extend(f for f in frames if f is not None)
        return frames

    def _egress(self, arrived: List[Tuple[tuple, bytes]]) -> None:
        for _, parts in _by_item(arrived):
            with self._timed("egress"):
                pairs = merge([decode(frame).msg.items[0][1] for frame in parts]).pairs()
            self.outputs.extend(pairs)

    def _timed(self, name: str):
        return _Timer(self.us, name)


def _by_item(arrived: List[Tuple[tuple, bytes]]) -> List[Tuple[tuple, List[bytes]]]:
    """Sub-items in the merge's order, each item's (its connection SN less the producer's
    partition) together: a consumer releases an item whole, merged by row SN."""
    items: Dict[tuple, List[bytes]] = defaultdict(list)
    for sn, frame in sorted(arrived):
        items[sn[:-1]].append(frame)
    return list(items.items())


class _Timer:
    def __init__(self, into: Dict[str, float], name: str):
        self.into, self.name = into, name

    def __enter__(self) -> None:
        self.t = time.process_time()

    def __exit__(self, *exc) -> None:
        self.into[self.name] += 1e6 * (time.process_time() - self.t)


def handed_over(kind: str, records: List[Any]) -> List[Any]:
    """What the driver hands the ingress: a columnar source's Arrow batches (the
    vectorized runs of ``experiments.throughput``), or records a read at a time."""
    from experiments.throughput import as_batches

    if kind == "vectorized":
        return as_batches(records)
    return [records[i:i + READ_LIMIT] for i in range(0, len(records), READ_LIMIT)]


def hand_over_us(runs: List[Any]) -> float:
    """CPU microseconds of the driver's hand-over of ``runs`` to the ingress process:
    pickled, through an ``ipc://`` socket, unpickled (``flux.runtime.ingress_process``)."""
    return _through_socket([pickle.dumps((RECORDS, [run]), protocol=pickle.HIGHEST_PROTOCOL)
                            for run in runs], unpickle=True)


def trip_us(frames: List[bytes]) -> float:
    """CPU microseconds of ``frames``' trips through an ``ipc://`` socket, both ends."""
    return _through_socket(frames, unpickle=False)


def _through_socket(frames: List[bytes], unpickle: bool) -> float:
    folder = tempfile.mkdtemp(prefix="flux-floor-")
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        for s in (tx, rx):
            s.setsockopt(zmq.LINGER, 0)
        rx.bind(f"ipc://{os.path.join(folder, 'wire')}")
        tx.connect(f"ipc://{os.path.join(folder, 'wire')}")
        t = time.process_time()
        for frame in frames:  # a frame at a time: the pipe never fills
            tx.send(frame, copy=len(frame) < 65536)
            got = rx.recv()
            if unpickle:
                pickle.loads(got)
        return 1e6 * (time.process_time() - t)
    finally:
        tx.close()
        rx.close()
        ctx.term()
        shutil.rmtree(folder, ignore_errors=True)


def one_round(dataflow, runs: List[Any], inputs: int, partitions: int,
              batch_rows: int) -> Tuple[Dict[str, float], List[Tuple[Any, Any]]]:
    """Every piece's CPU microseconds per input, as the replicated job pays it, and the
    outputs (to check against the reference)."""
    pipe = ItemPipeline(dataflow, partitions)
    pipe.run(runs, batch_rows)
    stages = len(dataflow.stages)
    per = {name: us / inputs for name, us in pipe.us.items()}
    per["hand_over"] = hand_over_us(runs) / inputs
    for who, frames in pipe.frames.items():
        per[f"{who}_trip"] = trip_us(frames) / inputs
    paid = {"hand_over": 1.0, "ingress_route": 1.0, "ingress_encode": 1.0,
            "ingress_trip": 2.0, "egress": 1.0}
    for s in range(stages):
        last = s == stages - 1
        paid.update({f"s{s}_{piece}": 2.0 for piece in ("decode", "merge", "operators", "route")})
        paid.update({f"s{s}_encode": 1.0 if last else 2.0, f"s{s}_trip": 1.0 if last else 2.0})
    return {name: per.get(name, 0.0) * times for name, times in paid.items()}, pipe.outputs


def item_floor(kind: str, records: List[Any], partitions: int = 4, batch_rows: int = 16384,
               repeats: int = 5) -> Dict[str, Any]:
    """The floor of ``kind`` ("per-record" or "vectorized") operators: medians of
    ``repeats`` rounds, each timing the operators alone and the pipeline once, with
    their spread; ``outputs_exact``: the pipeline's outputs against the reference."""
    from experiments.overhead import spread
    from experiments.throughput import dataflow_of, operators_alone, vectorized_alone
    from flux.operator import wire_form
    from flux.reference import reference_output

    dataflow = dataflow_of(kind)
    vectorized = kind == "vectorized"
    runs = handed_over(kind, records)
    alone_work: Callable[[], int] = (vectorized_alone(records) if vectorized
                                     else operators_alone(dataflow, records))
    alone: List[float] = []
    pieces: Dict[str, List[float]] = defaultdict(list)
    outputs: List[Tuple[Any, Any]] = []
    for _ in range(repeats):  # alternated within a round, not in blocks
        outputs = []
        with data_path_gc():  # both as a node process collects, neither paying the other's
            gc.collect()
            t = time.process_time()
            alone_work()
            alone.append(1e6 * (time.process_time() - t) / len(records))
            gc.collect()
            paid, outputs = one_round(dataflow, runs, len(records), partitions, batch_rows)
        for name, us in paid.items():
            pieces[name].append(us)
        pieces["all"].append(sum(paid.values()))
    expected = reference_output(dataflow_of("per-record"), records, partitions)
    exact = [wire_form(x) for x in outputs] == [wire_form(x) for x in expected]
    floor_us = statistics.median(pieces["all"])
    alone_us = statistics.median(alone)
    ratios = [(2.0 / f) / (1.0 / a) for f, a in zip(pieces["all"], alone)]
    return {
        "kind": kind, "inputs": len(records), "partitions": partitions,
        "batch_rows": batch_rows, "repeats": repeats, "outputs_exact": exact,
        "operators_alone_us_per_input": spread(alone, 3),
        "us_per_input_as_paid": {name: spread(v, 3) for name, v in pieces.items()},
        "floor_us_per_input": round(floor_us, 3),
        "target_budget_us_per_input": round(2 * alone_us / (0.5 if kind == "per-record"
                                                            else 0.35), 3),
        "floor_rate_on_two_cores_tps": round(2e6 / floor_us),
        "floor_vs_operators_alone": spread(ratios, 3),
    }


def _floor_in_child(args: tuple, start: Any, answer: Any) -> None:
    dataflow, runs, inputs, partitions, batch_rows = args
    with data_path_gc():
        start.wait()
        paid, _ = one_round(dataflow, runs, inputs, partitions, batch_rows)
    answer.send(sum(paid.values()))
    answer.close()


def floor_at_once(kind: str, records: List[Any], copies: int, partitions: int = 4,
                  batch_rows: int = 16384) -> List[float]:
    """The floor's CPU microseconds per input in each of ``copies`` processes running it
    at once (forked, started together): what a process pays for sharing the cores and
    their caches with the others, as a job's nodes, ingress and driver do on a small
    machine. Every process is joined (or killed) before this returns."""
    import multiprocessing

    from experiments.throughput import dataflow_of

    runs = handed_over(kind, records)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(copies)
    pipes = [ctx.Pipe(duplex=False) for _ in range(copies)]
    args = (dataflow_of(kind), runs, len(records), partitions, batch_rows)
    procs = [ctx.Process(target=_floor_in_child, args=(args, start, w), daemon=True)
             for _, w in pipes]
    try:
        for proc in procs:
            proc.start()
        return [r.recv() for r, _ in pipes]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()


def shared_cores(kind: str, records: List[Any], copies: Sequence[int], partitions: int = 4,
                 batch_rows: int = 16384, repeats: int = 5) -> Dict[str, Any]:
    """``floor_at_once`` for one process and for each count in ``copies``, alternated in
    ``repeats`` rounds: per round, the median process's floor over the lone one's."""
    from experiments.overhead import spread

    counts = [1, *[c for c in copies if c != 1]]
    floors: Dict[int, List[float]] = defaultdict(list)
    for _ in range(repeats):
        for n in counts:
            floors[n].append(statistics.median(
                floor_at_once(kind, records, n, partitions, batch_rows)))
    return {"kind": kind, "cores": os.cpu_count(), "inputs": len(records),
            "floor_us_per_input": {str(n): spread(v, 3) for n, v in floors.items()},
            "over_one_process": {str(n): spread([a / b for a, b in zip(v, floors[1])], 3)
                                 for n, v in floors.items() if n != 1}}


def on_shared_cores(floor: Dict[str, Any], shared: Dict[str, Any]) -> Dict[str, Any]:
    """``shared`` (``shared_cores``) with the floor's ratio to the operators alone as it is
    in a process sharing the cores: ``floor``'s median ratio over the median inflation
    (the two from rounds of their own, so their medians, not per-round ratios)."""
    ratio = floor["floor_vs_operators_alone"]["median"]
    return {**shared, "floor_vs_operators_alone": {
        n: round(ratio / inflation["median"], 3)
        for n, inflation in shared["over_one_process"].items()}}
