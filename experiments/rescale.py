"""python -m experiments.rescale: a job restarted from its checkpoint at another count.

DESIGN 13; docs/results/rescale.md. One embedded local-cluster:

1. **build**: a one-stage dataflow keeping ``--value-bytes`` per key
   (``flux.testing.payload.KeyedPayload``, state keyed by the stage's key) reads
   ``--keys`` records of distinct keys on ``--old`` nodes, checkpointing every 0.25 s
   (the restore takes the last checkpoint before the source ended):
   about 100 MB of keyed state in all by default.
2. **restore**, ``--runs`` times each, alternated (``rescale`` first in rounds 0, 2, ...
   ``same`` first in rounds 1, 3, ...): a new ``FluxJob`` on a fresh copy of that checkpoint
   location and the same source followed by ``--then`` updates of those keys, with
   ``--new`` nodes (``rescale``: each new partition installs the key groups it owns of
   the old partitions' snapshots) or ``--old`` nodes (``same``: each partition its own
   chain). Measured: seconds from ``FluxJob(...)`` to ``start()`` returning (the nodes
   restored their state and the data flows) and to the first output, the megabytes of the checkpoint restored, and whether the outputs
   after the checkpoint's cut are the failure-free run's, none lost or twice.

Writes ``summary.json`` (medians with min-max per mode), ``runs.csv`` and
``rescale.png``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List

from flux.dataflow import Dataflow, Stage


def payload_dataflow(value_bytes: int) -> Dataflow:
    from functools import partial

    from flux.testing.counter import first_field
    from flux.testing.payload import KeyedPayload

    return Dataflow([Stage("payload", first_field,
                           (partial(KeyedPayload, value_bytes=value_bytes),))])


def checkpoint_bytes(location: str, manifest: dict) -> int:
    """The bytes of every file a restore of ``manifest`` reads (its partitions' chains)."""
    from flux.runtime.checkpoint_store import CheckpointStore

    store = CheckpointStore(location)
    return sum(store.fs.size(store.path(k, name))
               for p in range(manifest["partitions"] * manifest["stages"])
               for k, name in store.part_files(manifest, 1 + p // manifest["partitions"],
                                               p % manifest["partitions"]))


def build(spark, flow, records: list, nodes: int, location: str) -> Dict[str, Any]:
    from flux.spark.job import FluxJob

    started = time.monotonic()
    with FluxJob(spark, flow, records, nodes=nodes, standbys=0, checkpoint=location,
                 checkpoint_interval=0.25, keep_output=False, sink=lambda out: None) as job:
        job.wait(timeout=600)
        job.wait_until(lambda: job.checkpoints.completed, 30)
    from flux.runtime.checkpoint_store import CheckpointStore

    manifest = CheckpointStore(location).latest()
    return {"seconds": round(time.monotonic() - started, 2), "cut": manifest["cut"],
            "checkpoint": manifest["checkpoint"],
            "megabytes": round(checkpoint_bytes(location, manifest) / 1e6, 2)}


def restore(spark, flow, records: list, nodes: int, location: str, want: list) -> dict:
    """One restore of ``location`` at ``nodes``: its timings and whether it is exact."""
    from flux.spark.job import FluxJob

    t0 = time.monotonic()
    job = FluxJob(spark, flow, records, nodes=nodes, standbys=1, checkpoint=location,
                  checkpoint_interval=30.0, keep_output=True)
    cut = job.resumed_from["cut"]
    with job:
        started = time.monotonic()
        job.wait_until(lambda: len(job.delivered) > 0, 120)
        first = time.monotonic()
        job.wait(timeout=600)
    from flux.operator import wire_form

    return {"nodes": nodes, "from_partitions": job.resumed_from["partitions"], "cut": cut,
            "start_s": round(started - t0, 3), "first_output_s": round(first - t0, 3),
            "outputs": len(job.delivered),
            "exact": wire_form(job.delivered) == wire_form([o for o in want if o[0][0] > cut])}


def summarize(runs: List[dict], modes=("rescale", "same"),
              fields=("first_output_s", "start_s")) -> Dict[str, Any]:
    """Per mode: each field's median with min-max, and whether every run was exact."""
    out: Dict[str, Any] = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        for field in fields:
            values = [r[field] for r in mine]
            out[f"{mode}_{field}"] = {"median": round(statistics.median(values), 3),
                                      "min": min(values), "max": max(values)}
        out[f"{mode}_exact"] = all(r["exact"] for r in mine)
    return out


def plot(summary: dict, path: pathlib.Path, old: int, new: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{old} -> {old} nodes", f"{old} -> {new} nodes (rescale)"]
    stats = [summary["same_first_output_s"], summary["rescale_first_output_s"]]
    medians = [s["median"] for s in stats]
    errors = [[m - s["min"] for m, s in zip(medians, stats)],
              [s["max"] - m for m, s in zip(medians, stats)]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(labels, medians, yerr=errors, capsize=6, color=["#888888", "#3070b0"])
    ax.set_ylabel("seconds from FluxJob() to the first output")
    ax.set_title(f"restore of {summary['build']['megabytes']:.0f} MB of keyed state")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.rescale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=420_000)
    ap.add_argument("--value-bytes", type=int, default=240)
    ap.add_argument("--then", type=int, default=20_000)
    ap.add_argument("--old", type=int, default=4)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="docs/results/rescale")
    args = ap.parse_args(argv)
    from flux.reference import reference_output
    from flux.spark.session import local_cluster
    from flux.testing.payload import payload_records

    flow = payload_dataflow(args.value_bytes)
    records = payload_records(args.keys, args.then)
    want = reference_output(flow, records, 1)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="flux-rescale-") as tmp, \
            local_cluster(max(args.old, args.new) + 1) as spark:
        pristine = str(pathlib.Path(tmp) / "built")
        built = build(spark, flow, records[:args.keys], args.old, pristine)
        print(json.dumps({"build": built}), flush=True)
        for r in range(args.runs):
            modes = [("rescale", args.new), ("same", args.old)]
            for mode, nodes in modes if r % 2 == 0 else modes[::-1]:
                location = str(pathlib.Path(tmp) / f"run{r}-{mode}")
                shutil.copytree(pristine, location)
                run = {"round": r, "mode": mode,
                       **restore(spark, flow, records, nodes, location, want)}
                print(json.dumps(run), flush=True)
                runs.append(run)
                shutil.rmtree(location)
    summary = {"keys": args.keys, "value_bytes": args.value_bytes, "then": args.then,
               "old": args.old, "new": args.new, "runs": args.runs, "build": built,
               **summarize(runs)}
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, out / "rescale.png", args.old, args.new)
    print(json.dumps(summary, indent=2))
    return 0 if summary["rescale_exact"] and summary["same_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
