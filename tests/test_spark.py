"""Flux on Spark: nodes as long-running tasks of an embedded local-cluster (slow)."""
from __future__ import annotations

import time
import urllib.error
from functools import partial

import pytest

from flux.examples import paper_dataflow
from test_metrics_endpoint import scrape, series
from flux.operator import wire_form
from flux.reference import reference_output
from flux.connectors.sinks import JsonLinesSink, read_json_lines
from flux.connectors.sources import RateLimited
from flux.testing.workloads import packet_workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_failure_free_run_on_spark_equals_the_reference(spark, tmp_path):
    from flux.spark.job import FluxJob

    records = packet_workload(20000, seed=4, pairs=2000, apps=4, sources=100)
    expected = reference_output(paper_dataflow(), records, 4)
    out = str(tmp_path / "out.jsonl")
    source = RateLimited(records, rate=10_000)  # a feed that does not wait
    job = FluxJob(spark, paper_dataflow(), source, nodes=4, standbys=1, sink=JsonLinesSink(out),
                  metrics_port=0, metrics_addr="127.0.0.1")
    with job:
        job.wait(timeout=240)
        time.sleep(1.5)  # every node reports its segments each second
        scraped = scrape(job.metrics_url)
        placement = job.placement()
    # where the tasks run: chained declustering, node k holds P of partition k, S of k-1
    assert placement["node1"]["replicas"] == ["stage 1 partition 0 S", "stage 1 partition 1 P",
                                              "stage 2 partition 0 S", "stage 2 partition 1 P"]
    assert len(placement) == 5 and all(p["host"] and p["pid"] > 0 for p in placement.values())
    assert len({p["executor"] for p in placement.values()}) == 5
    with pytest.raises(urllib.error.URLError):  # stop() closed the endpoint
        scrape(job.metrics_url or f"http://127.0.0.1:{job.endpoint.port}/metrics")
    assert scraped[("flux_inputs_total", ())] == len(records)
    assert scraped[("flux_outputs_total", ())] == len(expected)
    assert scraped[("flux_latency_seconds_count", ())] == len(expected)
    assert scraped[("flux_pairs", (("state", "whole"),))] == 8
    replicas = series(scraped, "flux_segment_inputs_total")
    nodes = {dict(k)["node"] for k in replicas}
    assert nodes == {"driver", "node0", "node1", "node2", "node3"}
    for stage in ("sessions", "stats"):  # a pair's replicas took the same tuples
        for p in map(str, range(4)):
            assert replicas[tuple(sorted({"stage": stage, "partition": p, "replica": "primary",
                                          "node": f"node{p}"}.items()))] == replicas[
                tuple(sorted({"stage": stage, "partition": p, "replica": "secondary",
                              "node": f"node{(int(p) + 1) % 4}"}.items()))] > 0
    assert job.delivered == []  # with a sink the job keeps no output
    assert read_json_lines(out) == [(sn, wire_form(r)) for sn, r in expected]
    summary = job.metrics.summary()
    assert (summary["inputs"], summary["dropped_inputs"]) == (len(records), 0)
    assert summary["outputs"] == len(expected)
    names = sorted(r[2] for r in job.task_results)
    assert names[:4] == ["node0", "node1", "node2", "node3"]
    assert len(names) == 5 and names[4].startswith("standby")
    assert all(r[3] == "job stopped" for r in job.task_results)


def paced(records, every=200, pause=0.01):
    import time

    for k, r in enumerate(records):
        if k % every == 0:
            time.sleep(pause)
        yield r


@pytest.mark.parametrize("how", ["worker", "executor"])
def test_kills_on_spark_change_nothing_in_the_output(spark, how, caplog):
    from flux.spark.job import FluxJob
    from flux.spark.session import TASK_FAILURE_LOGGERS

    caplog.set_level("WARNING", logger="flux")

    records = packet_workload(40000, seed=6, pairs=4000, apps=4, sources=200)
    expected = reference_output(paper_dataflow(), records, 4)
    job = FluxJob(spark, paper_dataflow(), paced(records), nodes=4, standbys=1)
    with job:
        rec = lambda: job.controller.recovery  # noqa: E731
        assert job.wait_until(lambda: len(job.delivered) > len(expected) // 4, 240)
        job.kill_node("node1", how)
        assert job.wait_until(lambda: rec().completed and not rec().pending(), 120), rec().missing
        # The former standby is a full member; now a node of another pair dies.
        assert job.wait_until(lambda: len(job.delivered) > len(expected) // 2, 240)
        job.kill_node("node3", how)
        assert job.wait_until(lambda: len(job.delivered) >= len(expected), 240), (
            len(job.delivered), len(expected))
    assert [wire_form(x) for x in job.delivered] == [wire_form(x) for x in expected]
    kinds = [what for _, what, _ in job.metrics.relative_events()]
    assert kinds.count("killed") == 2 and kinds.count("detected") == 2
    assert kinds.index("killed") < kinds.index("detected") < kinds.index("take-over done") \
        < kinds.index("state moved") < kinds.index("catch-up done")
    assert job.metrics.summary()["state_bytes_moved"] > 0
    # the library says what happened through logging; Spark's per-task stack traces are quiet
    said = caplog.text
    assert "killing node1" in said and "declaring node1 dead" in said, said
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    assert all(str(log4j.LogManager.getLogger(n).getLevel()) == "ERROR" for n in TASK_FAILURE_LOGGERS)


@pytest.mark.parametrize("replication", ["none", "cluster-pairs"])
def test_the_baselines_on_spark_give_the_reference_output(spark, replication):
    from flux.spark.job import FluxJob

    records = packet_workload(20000, seed=9, pairs=2000, apps=4, sources=100)
    expected = reference_output(paper_dataflow(), records, 4)
    with FluxJob(spark, paper_dataflow(), records, nodes=4, standbys=0,
                 replication=replication) as job:
        output = job.wait(timeout=240)
    assert [wire_form(x) for x in output] == [wire_form(x) for x in expected]


def test_a_task_that_fails_to_start_again_and_again_stops_the_job_with_its_error(spark):
    """SPARK_NOTES: with a high maxFailures Spark would retry this forever."""
    from flux.dataflow import Dataflow, Stage
    from flux.examples.sessions import session_key
    from flux.spark.job import FluxJob

    # an operator that cannot be built on the executors (here: on any machine; the
    # driver-side checks of Dataflow are skipped so that only the executors see it)
    dataflow = Dataflow.__new__(Dataflow)
    dataflow.stages = (Stage("boom", session_key, (partial(int, "cannot be built"),)),)
    job = FluxJob(spark, dataflow, [], nodes=2, standbys=0)
    with pytest.raises(RuntimeError, match="failed 3 times .*invalid literal .*cannot be built"):
        job.start(timeout=120)  # a TimeoutError here would mean the retries went on
    assert job.task_results == []  # the job's tasks were cancelled, not left running


def raise_on(bad, record):
    if list(record) == list(bad):
        raise ValueError("bad record")
    return record


def test_an_operator_that_raises_stops_the_job_with_the_operator_partition_and_record(spark):
    from flux.dataflow import Dataflow, Stage
    from flux.operator import Map
    from flux.examples.sessions import SessionReconstruction, session_key

    records = packet_workload(3000, seed=2, pairs=2000, apps=4, sources=100)
    check = partial(Map, partial(raise_on, records[499]))
    dataflow = Dataflow([Stage("sessions", session_key, (check, SessionReconstruction))])
    stops_with(spark, dataflow, records, r"operator Map failed in stage 1, partition \d, on the "
                                         r"record with sequence number \(500,\): ValueError: bad record")


def stops_with(spark, dataflow, records, match: str) -> None:
    """A job of ``dataflow`` over ``records`` stops with an ``OperatorError`` matching ``match``."""
    from flux.errors import OperatorError
    from flux.spark.job import FluxJob

    with FluxJob(spark, dataflow, records, nodes=4, standbys=1) as job:
        with pytest.raises(OperatorError, match=match):
            job.wait(timeout=120)


def key_raising_on(bad, record):
    from flux.examples.sessions import session_key

    if list(record) == list(bad):
        raise KeyError("no session for this packet")
    return session_key(record)


def test_a_first_stage_key_that_raises_stops_the_job_naming_the_input(spark):
    """The first stage's key runs in the ingress's process: past the source's first
    records (checked before the job starts), a key that raises stops the job with an
    ``OperatorError`` naming the input, as a segment's next-stage key does."""
    from flux.dataflow import Dataflow, Stage
    from flux.examples.sessions import SessionReconstruction

    records = packet_workload(3000, seed=2, pairs=2000, apps=4, sources=100)
    dataflow = Dataflow([Stage("sessions", partial(key_raising_on, records[1999]),
                               (SessionReconstruction,))])
    stops_with(spark, dataflow, records, r"the partition key of the next stage failed in stage 0, "
                                         r"partition 0, on the record with sequence number "
                                         r"\(2000,\): KeyError")


class CountingCheck:
    """A sink that keeps nothing: it checks every output of ``counting_dataflow(1)`` over
    ``keyed(n)`` against a model as it comes (in SN order, no loss, no duplicate)."""

    def __init__(self, keys: int):
        self.keys, self.counts, self.outputs = keys, {}, 0
        self.next_input, self.pending = 1, []

    def __call__(self, item) -> None:
        sn, (key, count, value) = item
        if not self.pending:  # the outputs of the next input, as KeyedCounter makes them
            n, k = self.next_input, f"k{self.next_input % self.keys}"
            c = self.counts[k] = self.counts.get(k, 0) + 1
            self.pending = [((n, 1), (k, c, n))] + ([((n, 2), (k, -c, n))] if c % 3 == 0 else [])
            self.next_input += 1
        want_sn, want = self.pending.pop(0)
        assert (tuple(sn), (key, count, value)) == (want_sn, want), (sn, want_sn, want)
        self.outputs += 1


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_a_long_run_with_a_sink_holds_no_memory_per_output(spark):
    """A million outputs through a counting sink; the driver's memory stays flat
    (before, it kept ~400 bytes per output and 40 per input)."""
    from flux.testing.dataflows import counting_dataflow
    from flux.spark.job import FluxJob

    inputs, keys = 750_000, 64
    source = ((f"k{n % keys}", n) for n in range(1, inputs + 1))
    sink = CountingCheck(keys)
    with FluxJob(spark, counting_dataflow(1), source, nodes=4, standbys=0, sink=sink) as job:
        assert job.wait_until(lambda: sink.outputs >= 250_000, 300)
        early = rss_mb()
        job.wait(timeout=400)
        late = rss_mb()
        kept = job.metrics.arrivals_kept
    assert sink.next_input == inputs + 1 and not sink.pending  # every input's outputs came
    assert sink.outputs > inputs
    assert late - early < 40, f"driver RSS {early:.0f} -> {late:.0f} MB over 750K outputs"
    assert job.delivered == [] and kept < 2 ** 16 + 50_000


def test_a_file_source_into_a_file_sink_and_a_rerun_duplicates_nothing(spark, tmp_path):
    """FileSource in, FileSink out (exactly-once by SN): running the same program again
    over the same folder regenerates the same SNs, and the sink keeps what it committed
    and adds nothing twice (the exactly-once sink, before checkpoints)."""
    import json

    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.file_source import FileSource
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    folder = tmp_path / "in"
    folder.mkdir()
    records = keyed_workload(3000, seed=5, keys=50)
    for i in range(3):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i * 1000:(i + 1) * 1000])
    as_read = list(FileSource(str(folder)))
    expected = [(sn, wire_form(r)) for sn, r in reference_output(counting_dataflow(2),
                                                                   as_read, 4)]
    out = str(tmp_path / "out")
    for run in range(2):
        sink = FileSink(out, commit_every=500)
        with FluxJob(spark, counting_dataflow(2), FileSource(str(folder)), nodes=4,
                     standbys=1, sink=sink) as job:
            job.wait(timeout=240)
        assert sink.skipped == (len(expected) if run else 0)
        assert read_file_sink(out) == expected


def test_a_per_key_handler_with_event_time_timers_keeps_its_output_through_a_kill(spark):
    """Click sessions (TransformWithStateInPandas, a timer per user) on Spark: a node
    killed mid-stream, the sessions still those of the failure-free run."""
    from flux.examples.click_sessions import click_sessions_dataflow, click_workload
    from flux.spark.job import FluxJob

    dataflow = click_sessions_dataflow(gap_ms=20_000)
    records = click_workload(8_000, users=60, seed=4)
    expected = reference_output(dataflow, records, 3)
    assert len(expected) > 200
    # ~1K clicks/s, well below what a pandas call per row takes on these cores: at 10K/s,
    # then (twice in CI) at 2K/s, every node's loop stalled a second at a time on the
    # shared 2-core machine and one was declared dead before the kill
    job = FluxJob(spark, dataflow, paced(records, every=10), nodes=3, standbys=1)
    with job:
        assert job.wait_until(lambda: len(job.delivered) > len(expected) // 3, 240)
        job.kill_node("node1")
        rec = lambda: job.controller.recovery  # noqa: E731
        assert job.wait_until(lambda: rec().completed and not rec().pending(), 120), \
            rec().missing
        assert job.wait_until(lambda: len(job.delivered) >= len(expected), 240), (
            len(job.delivered), len(expected))
    assert [wire_form(x) for x in job.delivered] == [wire_form(x) for x in expected]
    assert job.metrics.summary()["state_bytes_moved"] > 0


def test_an_egress_per_partition_on_spark_keeps_each_partitions_output_through_a_kill(spark):
    """ordered_output=False: every last-stage partition's outputs come out in SN order,
    those of the failure-free run, through a kill; no one order across partitions."""
    from flux.reference import ReferenceRun
    from flux.spark.job import FluxJob

    records = packet_workload(30000, seed=6, pairs=3000, apps=4, sources=200)
    run = ReferenceRun(paper_dataflow(), 4)
    expected = [o for r in records for o in run.feed(r)]
    partition_of = {tuple(sn): p for (sn, _), p in zip(expected, run.output_partitions)}
    job = FluxJob(spark, paper_dataflow(), paced(records), nodes=4, standbys=1,
                  ordered_output=False)
    with job:
        assert job.wait_until(lambda: len(job.delivered) > len(expected) // 3, 240)
        job.kill_node("node2")
        assert job.wait_until(lambda: len(job.delivered) >= len(expected), 240), (
            len(job.delivered), len(expected))
    got: dict = {}
    want: dict = {}
    for sn, record in job.delivered:
        got.setdefault(partition_of[tuple(sn)], []).append(wire_form((sn, record)))
    for sn, record in expected:
        want.setdefault(partition_of[tuple(sn)], []).append(wire_form((sn, record)))
    assert got == want and len(want) == 4
    assert [tuple(sn) for sn, _ in job.delivered] != [tuple(sn) for sn, _ in expected]
