"""The paper's session statistics in Spark Structured Streaming: what users would run instead.

Written as a Structured Streaming user would write it, with nothing from Flux
but the two operator classes (so both systems compute the very same thing):

- the packets arrive as CSV files dropped into a folder at a steady rate (the
  file source is replayable, which exactly-once recovery needs; there is no
  Kafka on these machines);
- session reconstruction is ``groupBy(src, dst).applyInPandasWithState``: the
  paper's operators keep custom per-key state, which no built-in aggregation
  expresses, and PySpark's arbitrary stateful operator is this one. It costs
  about 1 ms per group and micro-batch here (pandas frames per group), so by
  default the keys are hashed into a few groups ("buckets"), each keeping the
  operator's state for all of its keys: the same operator code, 3-4x faster;
  ``buckets=0`` groups by the key itself, as the documentation writes it;
- Spark refuses two ``applyInPandasWithState`` in one query, and
  ``transformWithStateInPandas`` (which may be chained) ran at ~550 packets/s
  here (a socket round trip per state access); so the query is split where a
  Spark user splits it, at the repartitioning: the sessions go to a parquet
  file sink (exactly-once), and a second query reads them as a stream and
  runs the statistics per ``(app, src)``;
- each query checkpoints to a local folder; the state store is Spark's
  default (HDFS-backed, in memory) or RocksDB with changelog checkpointing;
- the output goes to the driver through ``foreachBatch``, kept by batch id:
  a batch re-run after a failure replaces its first delivery (the idempotent
  sink Spark's exactly-once guarantee assumes).

Every packet carries its input number ``isn`` (Flux's ISN), so an output can
be compared with Flux's reference and its latency measured from the packet's
arrival, with the same ``Metrics`` as Flux's.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Sequence

from flux.examples.sessions import SessionReconstruction
from flux.examples.stats import WindowedDurationStats
from flux.runtime.metrics import Metrics
from flux.spark.node_task import executor_pid

PACKET_SCHEMA = "isn LONG, src INT, dst INT, app STRING, kind STRING, ts LONG"
SESSION_SCHEMA = "isn LONG, app STRING, src INT, duration LONG, ts_end LONG"
STATS_SCHEMA = ("isn LONG, app STRING, src INT, max_duration LONG, avg_duration DOUBLE, "
                "newest LONG, jvm INT")
STATE_SCHEMA = "state STRING"  # the operator's get_state(), as JSON
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _rows(frames, columns: Sequence[str], order: int) -> List[tuple]:
    """This key's rows of the batch as tuples, in event-time order (column ``order``):
    the order Flux processes them in, their input order."""
    rows: List[tuple] = []
    for pdf in frames:
        rows.extend(zip(*(pdf[c].tolist() for c in columns)))
    rows.sort(key=lambda r: r[order])
    return rows


def _restore(op, state) -> None:
    if state.exists:
        op.install_state(json.loads(state.get[0]))


def reconstruct_sessions(key, frames, state) -> Iterator:
    """Per (src, dst): ``SessionReconstruction`` with its state in the state store."""
    import pandas as pd

    op = SessionReconstruction()
    _restore(op, state)
    out = []
    for isn, src, dst, app, kind, ts in _rows(frames, ("isn", "src", "dst", "app", "kind", "ts"), 5):
        for app_, src_, duration, ts_end in op.process((src, dst, app, kind, ts)):
            out.append((isn, app_, src_, duration, ts_end))
    if op.open:
        state.update((json.dumps(op.get_state()),))
    elif state.exists:
        state.remove()  # no open session: keep the state store small
    if out:
        yield pd.DataFrame(out, columns=["isn", "app", "src", "duration", "ts_end"])


def duration_stats(key, frames, state) -> Iterator:
    """Per (app, src): ``WindowedDurationStats``; ``jvm`` tells the driver which executor
    holds this state (the one to kill)."""
    import pandas as pd

    op = WindowedDurationStats()
    _restore(op, state)
    out = []
    jvm = executor_pid()
    for isn, app, src, duration, ts_end in _rows(
            frames, ("isn", "app", "src", "duration", "ts_end"), 4):
        for record in op.process((app, src, duration, ts_end)):
            out.append((isn, *record, jvm))
    state.update((json.dumps(op.get_state()),))
    if out:
        yield pd.DataFrame(out, columns=["isn", "app", "src", "max_duration", "avg_duration",
                                         "newest", "jvm"])


class FileFeed:
    """Drops the records into ``folder`` as CSV files, one per ``every`` seconds, each
    holding the records that arrived meanwhile (record k arrives at k / rate): a feed at a
    steady rate. Files appear whole (written aside, then renamed), as the file source needs."""

    def __init__(self, records: Sequence[Sequence[Any]], rate: float, folder: str,
                 metrics: Metrics, every: float = 0.1):
        if not rate > 0 or not every > 0:
            raise ValueError("rate and every must be > 0")
        self.records, self.rate, self.folder, self.metrics = records, rate, folder, metrics
        self.every = every
        self.staging = tempfile.mkdtemp(prefix="feed-", dir=os.path.dirname(folder))
        self.written = 0
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guard, daemon=True)

    def start(self) -> "FileFeed":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        shutil.rmtree(self.staging, ignore_errors=True)

    def _guard(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the runner
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        m, n, files = self.metrics, len(self.records), 0
        t0 = m.t0
        while self.written < n and not self._stop.is_set():
            due = min(n, int((time.monotonic() - t0) * self.rate) + 1)
            if due > self.written:
                lines = []
                for k in range(self.written, due):
                    src, dst, app, kind, ts = self.records[k]
                    lines.append(f"{k + 1},{src},{dst},{app},{kind},{ts}\n")
                name = f"part-{files:06d}.csv"
                aside = os.path.join(self.staging, name)
                with open(aside, "w") as f:
                    f.writelines(lines)
                os.rename(aside, os.path.join(self.folder, name))
                for k in range(self.written, due):
                    m.input_taken(t0 + k / self.rate)
                self.written, files = due, files + 1
            self._stop.wait(self.every)


class StructuredStreamingRun:
    """Two chained queries over a file feed; outputs kept per batch id, with metrics."""

    def __init__(self, spark, records: Sequence[Sequence[Any]], rate: float, trigger_s: float,
                 partitions: int, state_store: str = "hdfs", workdir: Optional[str] = None,
                 feed_every: float = 0.1, interval: float = 0.1, buckets: int = 0):
        if state_store not in ("hdfs", "rocksdb"):
            raise ValueError(f"state_store must be 'hdfs' or 'rocksdb', got {state_store!r}")
        if buckets < 0:
            raise ValueError(f"buckets must be >= 0 (0: one group per key), got {buckets}")
        if trigger_s < 0:
            raise ValueError(f"trigger_s must be >= 0, got {trigger_s}")
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.spark, self.records, self.rate = spark, records, rate
        self.trigger_s, self.partitions, self.state_store = trigger_s, partitions, state_store
        self.feed_every = feed_every
        #: 0: one group (and state) per key, as the documentation writes it; B > 0: keys
        #: hashed into B groups, each keeping the operator's state for all its keys
        self.buckets = buckets
        self.workdir = workdir or tempfile.mkdtemp(prefix="flux-ss-")
        self.metrics = Metrics(interval)
        self.batches: Dict[int, list] = {}  # batch id -> its output rows
        self.replayed_batches = 0
        self.jvm_outputs: Counter = Counter()
        self.queries: list = []
        self.feed: Optional[FileFeed] = None

    # -- the queries ---------------------------------------------------------------------
    def _configure(self) -> None:
        conf = self.spark.conf
        conf.set("spark.sql.shuffle.partitions", str(self.partitions))
        conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # all, for finished()
        if self.state_store == "rocksdb":
            conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                     "true")
        else:
            conf.unset("spark.sql.streaming.stateStore.providerClass")

    def _deliver(self, df, batch_id: int) -> None:
        """foreachBatch, on the driver: an idempotent sink keyed by batch id."""
        rows = [tuple(r) for r in df.collect()]
        if batch_id in self.batches:
            self.replayed_batches += 1
            return  # the first delivery of this batch stands
        self.batches[batch_id] = rows
        for row in rows:
            self.metrics.output((row[0],))
            self.jvm_outputs[row[-1]] += 1

    def _grouped(self, df, *key: str):
        if not self.buckets:
            return df.groupBy(*key)
        from pyspark.sql import functions as F

        bucket = F.pmod(F.hash(*key), F.lit(self.buckets))
        return df.withColumn("bucket", bucket).groupBy("bucket")

    def start(self) -> "StructuredStreamingRun":
        from pyspark.sql.streaming.state import GroupStateTimeout

        self._configure()
        inbox, sessions = (os.path.join(self.workdir, d) for d in ("in", "sessions"))
        os.makedirs(inbox)
        trigger = {"processingTime": f"{int(self.trigger_s * 1000)} milliseconds"}
        spark = self.spark
        packets = spark.readStream.schema(PACKET_SCHEMA).csv(inbox)
        first = self._grouped(packets, "src", "dst").applyInPandasWithState(
            reconstruct_sessions, SESSION_SCHEMA, STATE_SCHEMA, "append",
            GroupStateTimeout.NoTimeout)
        self.queries.append(
            first.writeStream.format("parquet").option("path", sessions)
            .option("checkpointLocation", os.path.join(self.workdir, "checkpoint-sessions"))
            .trigger(**trigger).start())
        stats = self._grouped(spark.readStream.schema(SESSION_SCHEMA).parquet(sessions),
                              "app", "src").applyInPandasWithState(
            duration_stats, STATS_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
        self.queries.append(
            stats.writeStream.foreachBatch(self._deliver)
            .option("checkpointLocation", os.path.join(self.workdir, "checkpoint-stats"))
            .trigger(**trigger).start())
        self.metrics.begin()
        self.feed = FileFeed(self.records, self.rate, inbox, self.metrics, self.feed_every).start()
        return self

    # -- observing -----------------------------------------------------------------------
    def check(self) -> None:
        """Raise the error of a failed query or of the feed."""
        for q in self.queries:
            exc = q.exception()
            if exc is not None:
                raise RuntimeError(f"query {q.name or q.id} failed: {exc}")
        if self.feed is not None and self.feed.error is not None:
            raise self.feed.error

    def rows_read(self) -> tuple:
        """Input rows each query has read in its micro-batches (a task retried after a
        failure counts its rows again: an upper bound)."""
        return tuple(sum(p["numInputRows"] for p in q.recentProgress) for q in self.queries)

    def outputs(self) -> int:
        return sum(len(rows) for rows in list(self.batches.values()))

    def finished(self, expected_outputs: int) -> bool:
        """The feed wrote everything and every expected output was delivered."""
        return (self.feed is not None and self.feed.done.is_set()
                and self.outputs() >= expected_outputs)

    def output(self) -> List[tuple]:
        return [row for b in sorted(self.batches) for row in self.batches[b]]

    def busiest_jvm(self) -> Optional[int]:
        """The executor JVM that produced the most outputs: it holds statistics state.
        Before any output, the first executor: every executor runs stateful tasks."""
        ranked = [(n, jvm) for jvm, n in self.jvm_outputs.items() if jvm]
        if ranked:
            return max(ranked)[1]
        jvms = executor_jvms()
        return jvms[min(jvms)] if jvms else None

    def progress(self) -> List[Dict[str, Any]]:
        """(query, batch id, input rows, duration) of every micro-batch Spark still remembers."""
        out = []
        for name, q in zip(("sessions", "stats"), self.queries):
            for p in q.recentProgress:
                out.append({"query": name, "batch": p["batchId"], "rows": p["numInputRows"],
                            "ms": p["durationMs"].get("triggerExecution")})
        return out

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        for q in self.queries:
            try:
                q.stop()
            except Exception:  # noqa: BLE001 - a query that failed is stopped already
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)


def executor_jvms() -> Dict[int, int]:
    """Executor id -> PID of this machine's executor JVMs (local-cluster)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args \
                and b"--executor-id" in args:
            found[int(args[args.index(b"--executor-id") + 1])] = int(pid)
    return found


def matches_reference(output: Sequence[tuple], expected: Sequence[tuple]) -> bool:
    """Exactly-once: every reference output once, none else (Structured Streaming does
    not order across keys, so as a multiset of ``(isn, record)``)."""
    got = Counter((row[0], *row[1:6]) for row in output)
    want = Counter((sn[0], *record) for sn, record in expected)
    return got == want
