"""python -m experiments.vectorized_operators: the paper's operators per record vs on Arrow batches.

``SessionReconstruction`` and ``WindowedDurationStats`` fed record by record,
against ``VectorizedSessions`` and ``VectorizedStats`` fed whole
``pyarrow.RecordBatch``es (the columnar data plane, DESIGN 11) of ``--batches``
packets, on ``--inputs`` packets of ``packet_workload``. Each is timed alone
(sessions per packet, stats per session record, the stats fed the sessions'
outputs as they come) and as the two-operator chain (per packet), one process,
no runtime: the operators' own cost. The batches are built before the clock
starts, as the data plane hands them over. ``--rounds`` rounds, the modes'
order rotating from round to round (the machine's speed drifts); per mode the
median with its min-max. The outputs and states are checked equal once,
untimed. With ``--changes``, also the vectorized operators checkpointed every
``--checkpoint-every`` batches, the collector paused as a segment pauses it:
``changes-N`` while their stores record the changes since a checkpoint, read at each
(incremental checkpoints, DESIGN 10; 0: recorded, never read), ``whole-N`` with a whole
snapshot at each (how they were checkpointed before their state was a keyed store).
Writes ``docs/results/vectorized_operators/summary.json``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time
from typing import Any, Callable, Dict, List

from flux.examples.sessions import SessionReconstruction
from flux.examples.stats import DEFAULT_WINDOW, WindowedDurationStats
from flux.examples.vectorized import (
    PACKET_SCHEMA,
    VectorizedSessions,
    VectorizedStats,
    run_chain,
    to_batch,
    to_records,
)
from flux.keyed_state import keyed_state_of
from flux.state_codec import paused_gc
from flux.testing.workloads import packet_workload

PARTS = ("sessions", "stats", "chain")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.vectorized_operators",
                                 description="Per-record vs vectorized paper operators.")
    ap.add_argument("--inputs", type=int, default=200_000, help="packets")
    ap.add_argument("--batches", default="1024,8192", help="comma-separated batch sizes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    ap.add_argument("--emit-every", type=int, default=2)
    ap.add_argument("--changes", action="store_true",
                    help="also time the vectorized operators checkpointed (changes-N, whole-N)")
    ap.add_argument("--checkpoint-every", type=int, default=10,
                    help="with --changes: batches between checkpoints (0: never)")
    ap.add_argument("--out", default="docs/results/vectorized_operators")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.inputs < 1 or args.rounds < 1 or not args.batches or min(args.batches) < 1:
        ap.error("--inputs, --rounds and every batch size must be >= 1")
    if args.checkpoint_every < 0:
        ap.error("--checkpoint-every must be >= 0")
    return args


def timed(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


class Workload:
    """The packets, the sessions they give, and both cut into batches, made once."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.packets = packet_workload(args.inputs, args.seed)
        sessions = SessionReconstruction()
        self.sessions = [s for p in self.packets for s in sessions.process(p)]
        self.batches = {size: [to_batch(self.packets[i:i + size], PACKET_SCHEMA)
                               for i in range(0, len(self.packets), size)]
                        for size in args.batches}
        # the stats' batches: what the vectorized sessions give each packet batch
        self.session_batches = {}
        for size, batches in self.batches.items():
            op = VectorizedSessions()
            self.session_batches[size] = [op.process_arrow(b)[1] for b in batches]

    def stats(self) -> WindowedDurationStats:
        return WindowedDurationStats(self.args.window, self.args.emit_every)

    def vstats(self) -> VectorizedStats:
        return VectorizedStats(self.args.window, self.args.emit_every)


def per_record(w: Workload) -> Dict[str, float]:
    """Seconds of each part, record by record."""
    def sessions():
        op = SessionReconstruction()
        for p in w.packets:
            op.process(p)

    def stats():
        op = w.stats()
        for s in w.sessions:
            op.process(s)

    def chain():
        first, second = SessionReconstruction(), w.stats()
        for p in w.packets:
            for s in first.process(p):
                second.process(s)

    return {"sessions": timed(sessions), "stats": timed(stats), "chain": timed(chain)}


def checkpoints(ops: list, kind: str, every: int) -> Callable[[], None]:
    """What follows each batch of ``ops``: nothing (``kind`` "vectorized"), or a checkpoint
    every ``every`` batches (0: none), the collector paused: the changes since the last,
    read from stores that record them ("changes"), or a whole snapshot ("whole")."""
    if kind == "vectorized":
        return lambda: None
    stores = [keyed_state_of(op) for op in ops]
    if kind == "changes":
        for store in stores:
            store.start_changes()
    done = [0]

    def after_batch() -> None:
        done[0] += 1
        if every and done[0] % every == 0:
            with paused_gc():
                for store in stores:
                    if kind == "changes":
                        store.changes()
                        store.start_changes()
                    else:
                        store.snapshot()
    return after_batch


def vectorized(w: Workload, size: int, kind: str = "vectorized",
               every: int = 0) -> Dict[str, float]:
    """Seconds of each part, batch by batch (``kind``, ``every``: as ``checkpoints`` says)."""
    batches, session_batches = w.batches[size], w.session_batches[size]

    def sessions():
        op = VectorizedSessions()
        after = checkpoints([op], kind, every)
        for b in batches:
            op.process_arrow(b)
            after()

    def stats():
        op = w.vstats()
        after = checkpoints([op], kind, every)
        for b in session_batches:
            op.process_arrow(b)
            after()

    def chain():
        ops = [VectorizedSessions(), w.vstats()]
        after = checkpoints(ops, kind, every)
        for b in batches:
            run_chain(ops, b)
            after()

    return {"sessions": timed(sessions), "stats": timed(stats), "chain": timed(chain)}


def check(w: Workload, size: int) -> bool:
    """The vectorized chain's outputs and states are the per-record ones (untimed)."""
    first, second = SessionReconstruction(), w.stats()
    expected = [o for p in w.packets for s in first.process(p) for o in second.process(s)]
    ops = [VectorizedSessions(), w.vstats()]
    got: List[tuple] = []
    for b in w.batches[size]:
        got.extend(to_records(run_chain(ops, b)[1]))
    return (got == expected and ops[0].get_state() == first.get_state()
            and ops[1].get_state() == second.get_state())


def spread(values: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def main(argv=None) -> int:
    args = parse_args(argv)
    w = Workload(args)
    modes = ["per-record"] + [f"vectorized-{size}" for size in args.batches]
    if args.changes:
        modes += [f"{kind}-{size}" for kind in ("changes", "whole") for size in args.batches]
    inputs = {"sessions": len(w.packets), "stats": len(w.sessions), "chain": len(w.packets)}
    checked = {size: check(w, size) for size in args.batches}
    us: Dict[str, Dict[str, List[float]]] = {m: {part: [] for part in PARTS} for m in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            kind, _, size = mode.partition("-")
            seconds = (per_record(w) if mode == "per-record"
                       else vectorized(w, int(size), kind, args.checkpoint_every))
            for part in PARTS:
                us[mode][part].append(seconds[part] / inputs[part] * 1e6)
    summary = {
        "inputs": args.inputs, "session_records": len(w.sessions), "seed": args.seed,
        "window": args.window, "emit_every": args.emit_every, "rounds": args.rounds,
        "checkpoint_every": args.checkpoint_every if args.changes else None,
        "batches": args.batches, "python": platform.python_version(),
        "unit": "microseconds per input (sessions, chain: per packet; stats: per session record)",
        "outputs_and_states_equal": {str(size): ok for size, ok in checked.items()},
        "us_per_input": {m: {part: spread(v) for part, v in parts.items()}
                         for m, parts in us.items()},
    }
    base = summary["us_per_input"]["per-record"]
    summary["speedup_median"] = {
        m: {part: round(base[part]["median"] / summary["us_per_input"][m][part]["median"], 1)
            for part in PARTS} for m in modes[1:]}
    print(f"{args.inputs} packets, {len(w.sessions)} session records; us/input, median (min-max) "
          f"of {args.rounds} rounds")
    print(f"{'mode':<18}" + "".join(f"{part:>24}" for part in PARTS))
    for m in modes:
        cells = [summary["us_per_input"][m][part] for part in PARTS]
        print(f"{m:<18}" + "".join(f"{c['median']:>9.3f} ({c['min']:.3f}-{c['max']:.3f})"
                                   .rjust(24) for c in cells))
    print("outputs and states equal:", summary["outputs_and_states_equal"])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")
    return 0 if all(checked.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
