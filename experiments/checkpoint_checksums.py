"""python -m experiments.checkpoint_checksums: what verifying checkpoints costs.

A checkpoint's snapshot is packed on the data thread (``flux.state_codec``) and
written to the store by the node's writer thread; with checksums the writer also
hashes the bytes (SHA-256, ``flux.checksums``), and a restore reads every
file once more on the driver to verify it before it trusts the checkpoint. This
times, on a ``KeyedState`` of ``--keys`` keys (the paper's per-key statistics
shape), in ``--rounds`` rounds:

- **checkpoint**: pack the state and write the file (the store's ``write``), and apart
  from them the checksum of the packed bytes; the cost is the checksum's time over the
  checkpoint's, per round (timed apart in one round: a ratio of two whole runs would
  measure the machine's noise, several times the checksum's cost);
- **restore**: read the file and unpack it (what a node does), against reading and
  hashing it (what the driver's verification adds).

Prints the medians with their spread and writes ``checksums.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import tempfile
import time
from typing import Dict, List

from experiments.overhead import spread
from flux.keyed_state import KeyedState
from flux.runtime.checkpoint_store import CheckpointStore
from flux.checksums import digest
from flux.snapshot_chain import full_snapshot
from flux.state_codec import pack_state, unpack_state


def make_state(keys: int) -> dict:
    state = KeyedState()
    for i in range(keys):
        source = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        state[(f"app{i % 50}", source)] = [i % 97, i * 0.5, i]
    return full_snapshot(1, [state.snapshot()])


def checkpoint_once(store: CheckpointStore, state: dict, k: int) -> Dict[str, float]:
    """One checkpoint's pieces, timed apart: pack, checksum, write."""
    t0 = time.perf_counter()
    data = pack_state(state)
    t1 = time.perf_counter()
    digest(data)
    t2 = time.perf_counter()
    store.write(k, "stage1-part0-S.state", data)
    t3 = time.perf_counter()
    return {"pack_s": t1 - t0, "checksum_s": t2 - t1, "write_s": t3 - t2}


def restore_once(store: CheckpointStore, k: int) -> Dict[str, float]:
    """A restore's pieces: read and unpack (a node), read and hash (the driver's check)."""
    t0 = time.perf_counter()
    data = store.read(k, "stage1-part0-S.state")
    t1 = time.perf_counter()
    unpack_state(data)
    t2 = time.perf_counter()
    digest(data)
    t3 = time.perf_counter()
    return {"read_s": t1 - t0, "unpack_s": t2 - t1, "verify_hash_s": t3 - t2}


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.checkpoint_checksums",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="docs/results/checkpoint_checksums")
    args = ap.parse_args(argv)
    state = make_state(args.keys)
    folder = tempfile.mkdtemp(prefix="flux-checksums-")
    rows: List[Dict] = []
    try:
        store = CheckpointStore(folder, keep=1)
        nbytes = len(pack_state(state))
        for k in range(1, args.rounds + 1):
            row = {"round": k, **checkpoint_once(store, state, k), **restore_once(store, k)}
            row["checkpoint_s"] = row["pack_s"] + row["write_s"]
            row["checksum_cost"] = row["checksum_s"] / row["checkpoint_s"]
            # the driver reads each file once more and hashes it; a node reads and unpacks
            row["verify_vs_restore"] = ((row["read_s"] + row["verify_hash_s"])
                                        / (row["read_s"] + row["unpack_s"]))
            rows.append(row)
            shutil.rmtree(f"{folder}/ckpt-{k:010d}", ignore_errors=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = {"keys": args.keys, "snapshot_mb": round(nbytes / 1e6, 1), "rounds": args.rounds,
               **{f: spread([r[f] for r in rows], 4) for f in (
                   "pack_s", "write_s", "checkpoint_s", "checksum_s", "checksum_cost",
                   "read_s", "unpack_s", "verify_hash_s", "verify_vs_restore")},
               "rows": rows}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "checksums.json").write_text(json.dumps(summary, indent=1))
    c, v = summary["checksum_cost"], summary["verify_vs_restore"]
    print(f"snapshot {summary['snapshot_mb']} MB ({args.keys} keys), {args.rounds} rounds: "
          f"checkpoint (pack + write) {summary['checkpoint_s']['median']:.3f} s, its checksum "
          f"{summary['checksum_s']['median'] * 1000:.1f} ms: {c['median']:.2%} of it (min "
          f"{c['min']:.2%}, max {c['max']:.2%}); the driver's verification reads and hashes a "
          f"file in {v['median']:.3f} (min {v['min']:.3f}, max {v['max']:.3f}) of the time a "
          f"node reads and unpacks it")
    return summary


if __name__ == "__main__":
    main()
