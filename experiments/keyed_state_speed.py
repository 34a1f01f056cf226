"""python -m experiments.keyed_state_speed: a batch operator's state access per row,
``ColumnarKeyedState`` (slots and numpy columns) against ``KeyedState``
(``get_many``/``set_many`` of the batch's distinct keys), alternated.

Each batch of ``--rows`` int keys drawn from ``--keys`` adds a value per row to its
key's total (a read and a write of every distinct key of the batch), with no change
record (a run without checkpoints) and with both records on (a catch-up under way,
or incremental checkpoints). Prints and writes results/keyed_state_speed/summary.json:
ns per row, medians of ``--rounds`` alternated rounds with min-max.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Callable, Dict, List

import numpy as np
import pyarrow as pa

from flux.columnar_state import ColumnarKeyedState
from flux.keyed_state import KeyedState


def columnar(batches, values, track: bool) -> float:
    state = ColumnarKeyedState(total=np.int64)
    if track:
        state.clear_dirty()
        state.start_changes()
    started = time.perf_counter()
    for keys, x in zip(batches, values):
        slots = state.slots(keys)
        distinct, inverse = np.unique(slots, return_inverse=True)
        added = np.bincount(inverse, weights=x).astype(np.int64)
        state.put("total", distinct, state.get("total", distinct) + added)
    return time.perf_counter() - started


def keyed(batches, values, track: bool) -> float:
    state = KeyedState()
    if track:
        state.clear_dirty()
        state.start_changes()
    started = time.perf_counter()
    for keys, x in zip(batches, values):
        distinct, inverse = np.unique(keys.to_numpy(), return_inverse=True)
        added = np.bincount(inverse, weights=x).astype(np.int64)
        listed = distinct.tolist()
        before = np.array(state.get_many(listed, 0), np.int64)
        state.set_many(listed, (before + added).tolist())
    return time.perf_counter() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="results/keyed_state_speed")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    batches = [pa.array(rng.integers(0, args.keys, args.rows)) for _ in range(args.batches)]
    values = [rng.integers(0, 10, args.rows) for _ in range(args.batches)]
    rows = args.batches * args.rows
    stores: Dict[str, Callable] = {"columnar": columnar, "keyed_state": keyed}
    summary: Dict[str, dict] = {"rows_per_batch": args.rows, "keys": args.keys,
                                "batches": args.batches, "rounds": args.rounds}
    for track in (False, True):
        times: Dict[str, List[float]] = {name: [] for name in stores}
        for r in range(args.rounds):
            order = list(stores) if r % 2 == 0 else list(reversed(stores))
            for name in order:
                times[name].append(1e9 * stores[name](batches, values, track) / rows)
        figures = {name: {"ns_per_row_median": round(statistics.median(t), 1),
                          "min": round(min(t), 1), "max": round(max(t), 1)}
                   for name, t in times.items()}
        ratios = [k / c for k, c in zip(times["keyed_state"], times["columnar"])]
        figures["speed_columnar_over_keyed_state"] = round(statistics.median(ratios), 2)
        summary["recording_changes" if track else "not_recording"] = figures
        print("recording changes" if track else "not recording", figures, flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
