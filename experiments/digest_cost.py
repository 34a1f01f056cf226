"""python -m experiments.digest_cost: what comparing the replicas costs (DESIGN 14).

At every checkpoint cut each replica digests its operators' states and the outputs it
made since the cut before (``flux.digests``). Measured in one run:

1. **per cut, one process** (``--keys`` keys of the paper's per-key statistics shape,
   ``--rounds`` rounds, the pieces alternated): a whole pass over a ``KeyedState``
   (what a replica does after its state was installed), the incremental digest from the
   changed keys (``--changed`` of them, as fractions), against what the checkpoint
   itself does at that cut: pack the same changes as a delta, or the whole state.
2. **per output row, one process**: an output item's digest (1024 rows) as records and
   as an Arrow batch.
3. **one partition's segments, one process**: the paper's two stages over
   ``--segment-inputs`` packets with a cut every ``--segment-cut-every`` inputs, with
   digests and without, alternated: CPU seconds (what the digests add to a replica's
   work, with none of a job's noise).
4. **a job** (``--runs`` pairs on one embedded local cluster, the two orders
   alternating): the paper's dataflow at full rate with checkpoints every
   ``--interval`` seconds, ``on_divergence="fail"`` (digests) against ``"off"`` (none);
   per pair the ratio of input rates, medians with min-max; outputs checked against
   the reference. ``--no-job`` skips it.

Prints the figures and writes ``summary.json`` (and ``runs.csv``) under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import random
import statistics
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
import pyarrow as pa

from flux.digests import item_digest, keyed_digest, keyed_digest_after
from flux.keyed_state import KeyedState
from flux.state_codec import pack_state


def spread(values: List[float], digits: int = 4) -> Dict[str, float]:
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits),
            "n": len(values)}


def make_state(keys: int) -> KeyedState:
    state = KeyedState()
    for i in range(keys):
        state[(f"app{i % 50}", f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}")] = \
            [i % 97, i * 0.5, i]
    return state


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def per_cut(keys: int, changed: List[float], rounds: int) -> Dict[str, Any]:
    """Seconds per cut of each piece, over ``rounds`` rounds."""
    state = make_state(keys)
    all_keys = state.keys()
    rng = random.Random(1)
    out: Dict[str, Any] = {"keys": keys}
    whole = [timed(lambda: keyed_digest(state.pairs())) for _ in range(rounds)]
    packed = [timed(lambda: pack_state(state.snapshot())) for _ in range(rounds)]
    out["whole_pass_s"], out["whole_snapshot_s"] = spread(whole), spread(packed)
    total = keyed_digest(state.items())
    for share in changed:
        inc, delta = [], []
        for r in range(rounds):
            state.start_changes()
            for key in rng.sample(all_keys, int(keys * share)):
                state[key] = [r, 0.25, -1]
            changes = state.changed_pairs()
            t_inc = timed(lambda: keyed_digest_after(total, changes))
            t_delta = timed(lambda: pack_state(state.changes()))
            inc.append(t_inc)
            delta.append(t_delta)
            total = keyed_digest_after(total, changes)
        out[f"changed_{share}"] = {"incremental_s": spread(inc), "delta_snapshot_s": spread(delta),
                                   "incremental_over_delta": spread(
                                       [a / b for a, b in zip(inc, delta)], 3)}
    assert total == keyed_digest(state.items())  # kept from the changes, equal to a pass
    return out


def per_row(rounds: int) -> Dict[str, Any]:
    """Microseconds per output row of an item's digest, 1024 rows."""
    from exchange.columns import ArrowRows
    from exchange.rows import Rows

    n = 1024
    sns = np.stack([np.arange(n), np.ones(n, dtype=np.int64)], axis=1).astype(np.int64)
    records = [(f"app{i % 10}", f"10.0.{i % 256}.{i % 7}", i, i * 0.5) for i in range(n)]
    rows = Rows(sns, records)
    batch = pa.record_batch({"app": [r[0] for r in records], "src": [r[1] for r in records],
                             "n": [r[2] for r in records], "x": [r[3] for r in records]})
    columns = ArrowRows(sns, batch)
    result = {}
    for name, item in (("records", rows), ("arrow", columns)):
        times = [timed(lambda: [item_digest((7,), item) for _ in range(100)]) / (100 * n) * 1e6
                 for _ in range(rounds)]
        result[f"{name}_us_per_row"] = spread(times, 3)
    return result


def segments_alone(inputs: int, cut_every: int, rounds: int) -> Dict[str, Any]:
    """The paper's two stages as one partition's segments, the items of 1024 inputs through
    both (as ``Segment.process`` runs them, routing and buffers aside), a cut every
    ``cut_every`` inputs crossed by both, with digests and without, alternated: the CPU the
    digests add to a replica's work (tracking changes, outputs, the cuts' digests)."""
    from exchange.rows import Rows
    from flux.addresses import Addr, P
    from flux.examples import paper_dataflow
    from flux.protocol.builder import MachineBuilder
    from flux.testing.workloads import packet_workload

    records = packet_workload(inputs, seed=1, pairs=100_000, apps=10, sources=1_000)

    def run(digests: bool) -> float:
        builder = MachineBuilder(paper_dataflow(), 1, capacity=8, batch_size=4, digests=digests)
        segments = [builder.segment(Addr(s, 0, P)) for s in (1, 2)]
        cuts = 0
        started = time.process_time()
        for i in range(0, len(records), 1024):
            rows = Rows.of_inputs(i + 1, records[i:i + 1024])
            for seg in segments:  # what Segment.process does with an item, routing aside
                out = seg._operators(rows.as_records())
                if seg.outputs is not None and len(out):
                    seg.outputs.add((i + 1024,), out)
                rows = out
            if (i + 1024) // cut_every > cuts:
                cuts += 1
                for seg in segments:
                    seg.cuts.learn((cuts, i + 1024))
                    seg.fcons.frontier = lambda n=i + 1024: (n,)
                    seg.snapshot(keep=False)
        return time.process_time() - started

    on, off = [], []
    for r in range(rounds):
        for digests in ((True, False) if r % 2 == 0 else (False, True)):
            (on if digests else off).append(run(digests))
    return {"inputs": inputs, "cut_every_inputs": cut_every,
            "with_s": spread(on), "without_s": spread(off),
            "ratio_with_over_without": spread([a / b for a, b in zip(on, off)], 3)}


def job_runs(args) -> List[Dict[str, Any]]:
    from flux.examples import paper_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.spark.session import local_cluster
    from flux.testing.workloads import packet_workload

    records = packet_workload(args.inputs, seed=1, pairs=100_000, apps=10, sources=1_000)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, args.nodes)]
    runs = []
    with local_cluster(args.nodes + 1) as spark:
        for r in range(args.runs):
            for policy in (("fail", "off") if r % 2 == 0 else ("off", "fail")):
                with tempfile.TemporaryDirectory() as folder:
                    job = FluxJob(spark, paper_dataflow(), records, nodes=args.nodes,
                                  standbys=0, checkpoint=folder,
                                  checkpoint_interval=args.interval, on_divergence=policy)
                    with job:
                        job.wait_until(lambda: job.controller.started, 120)
                        started = time.perf_counter()
                        output = job.wait(3600)
                        elapsed = time.perf_counter() - started
                        checkpoints = len(job.checkpoints.completed)
                        compared = job.controller.divergence.compared
                runs.append({"pair": r, "on_divergence": policy, "inputs": len(records),
                             "seconds": round(elapsed, 3),
                             "input_rate_tps": round(len(records) / elapsed, 1),
                             "checkpoints": checkpoints, "digest_pairs_compared": compared,
                             "output_matches_reference":
                                 [wire_form(x) for x in output] == expected})
                print(runs[-1], flush=True)
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.digest_cost",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--changed", default="0.01,0.1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inputs", type=int, default=300_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=4, help="alternated pairs of job runs")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    ap.add_argument("--segment-inputs", type=int, default=1_200_000)
    ap.add_argument("--segment-cut-every", type=int, default=600_000,
                    help="inputs between cuts: the one partition holds every key, so a job's "
                         "10 s at 60K inputs/s")
    ap.add_argument("--no-job", action="store_true")
    ap.add_argument("--out", default="results/digest_cost")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: Dict[str, Any] = {
        "per_cut": per_cut(args.keys, [float(x) for x in args.changed.split(",")], args.rounds),
        "per_row": per_row(args.rounds),
        "segments": segments_alone(args.segment_inputs, args.segment_cut_every, args.rounds)}
    print(json.dumps(summary, indent=2), flush=True)
    ok = True
    if not args.no_job:
        runs = job_runs(args)
        with (out / "runs.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(runs[0]))
            writer.writeheader()
            writer.writerows(runs)
        ratios = []
        for r in range(args.runs):
            rate = {x["on_divergence"]: x["input_rate_tps"] for x in runs if x["pair"] == r}
            ratios.append(rate["fail"] / rate["off"])
        ok = all(x["output_matches_reference"] for x in runs)
        summary["job"] = {
            "inputs": args.inputs, "interval_s": args.interval,
            "with_digests_tps": spread([x["input_rate_tps"] for x in runs
                                        if x["on_divergence"] == "fail"], 1),
            "without_tps": spread([x["input_rate_tps"] for x in runs
                                   if x["on_divergence"] == "off"], 1),
            "rate_ratio_with_over_without": spread(ratios, 3),
            "digest_pairs_compared": sum(x["digest_pairs_compared"] for x in runs),
            "output_matches_reference": ok}
        print(json.dumps(summary["job"], indent=2))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
