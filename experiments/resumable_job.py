"""A user's program that survives its driver's death: run it, kill it, run it again.

``python -m experiments.resumable_job --input DIR --sink DIR --checkpoint DIR`` reads
the JSON-lines files of ``--input`` (at ``--rate`` records per second), counts per key
(``counting_dataflow``), writes to an exactly-once sink (``--sink-format jsonl``,
``parquet`` or ``delta``) and checkpoints every ``--interval`` seconds. Run again with
the same checkpoint location after the driver was killed, it resumes from the last
complete checkpoint, as Structured Streaming does with its ``checkpointLocation``.
With ``--splits K`` the records are read on the executors, dealt by key to ``K``
splits (``flux.ListSplits.by_key``): no input through the driver. With ``--kafka
BOOTSTRAP``, ``--input`` and ``--sink`` name topics: the input topic's partitions are
read on the executors (``flux.KafkaSplits``, up to ``--ending``) and each last-stage
partition's outputs go to the sink topic's partition of that number through a
transactional producer on an executor: no record through the driver. It prints one JSON line per second (``started``, then ``progress``, then ``done``) for
whoever watches it (``tests/test_driver_kill.py``, ``experiments.restart``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_sink(fmt: str, path: str, commit_every: int = 100_000):
    if fmt == "delta":
        from flux.connectors.delta_sink import DeltaSink

        return DeltaSink(path, commit_every=commit_every)
    from flux.connectors.file_sink import FileSink

    return FileSink(path, format=fmt, commit_every=commit_every)


def kafka_sink(bootstrap: str, topic: str, commit_every: int = 100_000):
    """A transactional producer per last-stage partition, on the executors, each into
    ``topic``'s partition of its number."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.kafka_sink import KafkaSink

    return SinkPerPartition(lambda p: KafkaSink(bootstrap, topic, f"flux-{topic}-{p}",
                                                partition=p, commit_every=commit_every))


def read_sink(fmt: str, path: str) -> list:
    if fmt == "delta":
        from flux.connectors.delta_sink import read_delta_sink

        return read_delta_sink(path)
    from flux.connectors.file_sink import read_file_sink

    return read_file_sink(path)


def per_key(rows) -> dict:
    """The records of ``(sn, record)`` rows by key, each key's in SN order. With
    ``--splits`` the job numbers the splits' inputs in an order of its own, but each
    key's inputs lie in one split, in order: its outputs are the same key by key."""
    out: dict = {}
    for _, record in sorted(rows, key=lambda row: tuple(row[0])):
        out.setdefault(record[0], []).append(record)
    return out


def write_inputs(folder: Path, n: int, files: int = 4, seed: int = 5) -> list:
    """``n`` keyed records in ``files`` JSON-lines files of ``folder``; returns the
    failure-free output of this program's dataflow over its 4 partitions, as its sink reads
    it back: what every run, killed or not, must end with."""
    from flux.testing.dataflows import counting_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.connectors.file_source import FileSource
    from flux.testing.workloads import keyed_workload

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = keyed_workload(n, seed=seed, keys=50)
    per = -(-n // files)
    for i in range(files):
        with open(folder / f"part-{i:03d}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i * per:(i + 1) * per])
    as_read = list(FileSource(str(folder)))
    return [(sn, wire_form(r)) for sn, r in reference_output(counting_dataflow(2), as_read, 4)]


def say(kind: str, **fields) -> None:
    print(json.dumps({"kind": kind, "t": time.time(), **fields}), flush=True)


class Program:
    """``experiments.resumable_job`` in a process group of its own (its JVMs included),
    its JSON lines read by a thread."""

    def __init__(self, args, log: Path):
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.resumable_job", *args], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        self.lines: "queue.Queue[dict]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
                self.log.write(line)  # beside its stderr: where the job stood, when
                self.log.flush()

    def next_line(self, timeout: float) -> dict:
        return self.lines.get(timeout=timeout)

    def wait_for(self, predicate, timeout: float) -> dict:
        """The first line that satisfies ``predicate``; a clear error if the program ends
        first or ``timeout`` passes (naming the last line it printed)."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                line = self.next_line(min(1.0, max(0.05, deadline - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"the program ended (exit {self.proc.returncode}) "
                                       f"before the line awaited: see {self.log.name}")
                continue
            if predicate(line):
                return line
            last = line
        raise TimeoutError(f"no line awaited from the program within {timeout:.0f}s (the "
                           f"last: {json.dumps(last)}): see {self.log.name}")

    def kill(self) -> None:
        """SIGKILL the driver, then everything it started (its process group)."""
        for how in (lambda: os.kill(self.proc.pid, signal.SIGKILL),
                    lambda: os.killpg(self.proc.pid, signal.SIGKILL)):
            try:
                how()
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self.log.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--sink-format", default="jsonl", choices=["jsonl", "parquet", "delta"])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--full-every", type=int, default=10,
                   help="a whole snapshot once in this many checkpoints, else the keyed "
                        "stores' changes (1: every checkpoint whole)")
    p.add_argument("--rate", type=float, default=4000.0, help="input records per second")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--standbys", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--commit-every", type=int, default=100_000,
                   help="the sink commits at every checkpoint's cut and every this many "
                        "outputs (ahead of the cuts: a restart must give them their SNs "
                        "again)")
    p.add_argument("--splits", type=int, default=0,
                   help="read the inputs on the executors as this many splits by key "
                        "(flux.ListSplits.by_key, each paced at rate/splits): no input "
                        "through the driver; 0: the driver's ingress reads the files")
    p.add_argument("--kafka", default=None, metavar="BOOTSTRAP",
                   help="Kafka in and out: --input and --sink are topics of this broker, "
                        "read and written on the executors (--rate, --splits and "
                        "--sink-format do not apply)")
    p.add_argument("--ending", default=None,
                   help="with --kafka: where the input ends, JSON {partition: offset} "
                        "(default: the topic's end when the job starts)")
    p.add_argument("--state-mb", type=float, default=0.0,
                   help="extra keyed state per partition (MB, Ballast in the first stage)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")

    from flux.testing.dataflows import counting_dataflow, with_ballast
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob
    from flux.spark.session import local_cluster

    egresses: dict = {}
    if args.kafka:  # nothing through the driver: splits in, a producer per partition out
        sink = kafka_sink(args.kafka, args.sink, args.commit_every)
        egresses = dict(ordered_output=False, egress_on_executors=True)
    else:
        sink = make_sink(args.sink_format, args.sink, args.commit_every)

    def committed():
        """The last output's SN the sink committed; with Kafka, the furthest partition's
        (read from the sinks' state topic: the sinks are on the executors). None when not
        known: a broker too slow to answer on a loaded machine must not end the job this
        line only reports on."""
        if args.kafka:
            from confluent_kafka import KafkaException

            from experiments.kafka_io import last_committed

            try:
                return list(last_committed(args.kafka, args.sink) or ()) or None
            except (KafkaException, TimeoutError) as e:
                print(f"the sinks' committed SN not read: {e}", file=sys.stderr, flush=True)
                return None
        return list(sink.committed() or ()) or None

    with local_cluster(args.nodes + args.standbys) as spark:
        say("spark")  # Spark is up: what follows is Flux's own start
        dataflow = counting_dataflow(2)
        if args.state_mb:
            dataflow = with_ballast(dataflow, args.state_mb)
        if args.kafka:
            from flux.connectors.kafka_splits import KafkaSplits

            source = KafkaSplits(args.kafka, args.input, ending=json.loads(args.ending)
                                 if args.ending else "latest")
        elif args.splits:  # the same records every run: the files', dealt by key
            source = ListSplits.by_key(list(FileSource(args.input)), args.splits,
                                       key=lambda r: r[0], rate=args.rate / args.splits)
        else:
            source = Paced(FileSource(args.input), args.rate)
        job = FluxJob(spark, dataflow, source,
                      nodes=args.nodes, standbys=args.standbys, sink=sink,
                      checkpoint=args.checkpoint, checkpoint_interval=args.interval,
                      checkpoint_full_every=args.full_every, **egresses)
        restored = job.resumed_from
        with job:
            say("started", checkpoint=restored["checkpoint"] if restored else None,
                cut=restored["cut"] if restored else 0, committed=committed())
            deadline = time.monotonic() + args.timeout
            if job.wait_until(lambda: job.metrics.output_total > 0 or job.finished(), 60):
                say("first_output", outputs=job.metrics.output_total)
            while not job.finished() and time.monotonic() < deadline:
                job.wait_until(job.finished, 1.0)
                done = job.checkpoints.latest
                say("progress", inputs=job.metrics.input_total, outputs=job.metrics.output_total,
                    checkpoint=done.number if done else None, cut=done.cut if done else None,
                    committed=committed())
            job.wait(timeout=10)
        say("done", outputs=job.metrics.output_total, restarts=len(job.restart_log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
