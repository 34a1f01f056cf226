"""Kafka in and out of a Flux job on Spark, exactly once (slow: Spark and a real
Kafka-protocol broker). A topic of several partitions fed at a steady rate, a transactional
KafkaSink; one node killed (Flux masks it), and both replicas of a partition killed (the job
restarts from its checkpoint, the input log replays the interleaving): a read_committed
reader sees exactly the failure-free output of the inputs in the order the job numbered
them, each output once, in SN order per partition."""
from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")
pytest.importorskip("noida_db")

from flux.addresses import Addr, P, S  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

INPUTS, RATE, TOPIC_PARTITIONS = 24_000, 4_000, 3


#: executors of this module's Spark session (the ``spark`` fixture, conftest)
SPARK_EXECUTORS = 5


@pytest.mark.parametrize("double,per_partition", [
    (False, False), (True, False), (True, True), (False, "on executors")],
    ids=["node-kill", "double-failure", "double-failure-sink-per-partition",
         "egress-node-kill-on-executors"])
def test_kafka_in_and_out_exactly_once_through_failures(spark, broker, tmp_path, double,
                                                        per_partition):
    """``per_partition``: an egress per partition (``ordered_output=False``), each with a
    transactional producer of its own into its own partition of the output topic; "on
    executors": each egress on the executor of its last-stage replica
    (``egress_on_executors``), and the node killed is the one running partition 1's."""
    from experiments.kafka_io import Feed, RecordedOrder, read_output
    from flux.testing.dataflows import counting_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.connector_api import SinkPerPartition
    from flux.connectors.kafka_sink import KafkaSink
    from flux.connectors.kafka_source import KafkaSource
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    name = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"in-{name}", f"out-{name}"
    broker.create_topic(topic_in, TOPIC_PARTITIONS)
    broker.create_topic(topic_out, 4 if per_partition else 2)
    records = keyed_workload(INPUTS, seed=3, keys=40)
    dataflow = counting_dataflow(2)
    # the feed waits at half way for the first checkpoint: on a slow day the job could
    # otherwise read everything and end before the kill lands
    feed = Feed(broker.bootstrap, topic_in, records, TOPIC_PARTITIONS, RATE,
                hold_at=INPUTS // 2).start()
    source = RecordedOrder(KafkaSource(broker.bootstrap, topic_in, group=f"g-{name}",
                                       ending=feed.ending))
    if per_partition:
        bootstrap = broker.bootstrap  # the open function goes to the executors: no broker
        sink = SinkPerPartition(lambda p: KafkaSink(bootstrap, topic_out,
                                                    f"flux-{name}-{p}", partition=p))
    else:
        sink = KafkaSink(broker.bootstrap, topic_out, f"flux-{name}", key=lambda r: r[0])
    try:
        job = FluxJob(spark, dataflow, source, nodes=4, standbys=1, sink=sink,
                      checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0,
                      ordered_output=not per_partition,
                      egress_on_executors=per_partition == "on executors")
        with job:
            assert job.wait_until(lambda: len(job.checkpoints.completed) >= 1, 60)
            feed.release()  # inputs past that checkpoint's cut, then the kill
            assert job.wait_until(lambda: job.metrics.input_total >= INPUTS // 2 + 2000, 60)
            where = job.topology.where
            stage = 2 if per_partition == "on executors" else 1  # there: with the egress
            for replica in ((P, S) if double else (P,)):
                job.kill_node(where[Addr(stage, 1, replica)])
            killed = time.monotonic()
            job.wait(timeout=240)
        assert not feed.error
        replays = [d for _, what, d in job.metrics.relative_events() if what == "input log replay"]
        if double:
            (when, restored, why), = job.restart_log
            assert restored is not None and "both replicas" in why and when - killed < 5
            # the restart replayed inputs past the checkpoint's cut in their logged order
            assert replays[-1][1] > replays[-1][0], replays
        else:
            assert not job.restart_log
        # the group heard a complete checkpoint's position (lag monitoring)
        committed = source.source.committed_offsets()
        assert sum(v or 0 for v in committed.values()) > 0
    finally:
        feed.stop()
        source.close()
    inputs = source.inputs
    assert sorted(r[1] for r in inputs) == list(range(1, INPUTS + 1))  # each input once
    reference = reference_output(dataflow, inputs, 4)
    expected = [wire_form(r) for _, r in reference]
    assert read_output(broker.bootstrap, topic_out) == expected
    if double:  # outputs lead back to their inputs, in the order the input log kept
        oldest = min(job.checkpoints.store.manifest(k)["cut"]
                     for k in job.checkpoints.store.complete_ids())
        later = [sn for sn, _ in reference if sn[0] > oldest]
        assert len(later) > 1000, (oldest, len(later))  # most of the run, restart included
        for sn in later[::max(1, len(later) // 40)]:
            fresh = KafkaSource(broker.bootstrap, topic_in, group=f"lineage-{name}",
                                ending=feed.ending)
            try:
                found = job.lineage(sn, fresh)
            finally:
                fresh.close()
            assert wire_form(found.record) == wire_form(inputs[sn[0] - 1]), sn
            assert found.partition is not None


def test_kafka_as_arrow_batches_through_a_double_failure(spark, broker, tmp_path):
    """``KafkaSource(schema=...)`` hands the vectorized paper dataflow Arrow batches of JSON
    objects from a topic of 3 partitions; both replicas of a partition die after a
    checkpoint: the job restarts, the input log replays the rows' interleaving (a
    partition per row), and the sink holds the per-record dataflow's failure-free output
    of the rows in the order the job numbered them."""
    import json

    from experiments.kafka_io import Feed, RecordedOrder
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.kafka_source import KafkaSource
    from flux.examples import paper_dataflow, vectorized_dataflow
    from flux.examples.vectorized import PACKET_SCHEMA
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.testing.workloads import packet_workload

    name = uuid.uuid4().hex[:8]
    topic = f"arrow-{name}"
    broker.create_topic(topic, TOPIC_PARTITIONS)
    records = packet_workload(INPUTS, seed=8, pairs=1500, apps=4, sources=40)
    fields = PACKET_SCHEMA.names
    feed = Feed(broker.bootstrap, topic, records, TOPIC_PARTITIONS, RATE, hold_at=INPUTS // 2,
                encode=lambda r: json.dumps(dict(zip(fields, r))).encode()).start()
    source = RecordedOrder(KafkaSource(broker.bootstrap, topic, group=f"g-{name}",
                                       ending=feed.ending, schema=PACKET_SCHEMA))
    out = str(tmp_path / "out")
    try:
        job = FluxJob(spark, vectorized_dataflow(), source, nodes=4, standbys=1,
                      sink=FileSink(out), checkpoint=str(tmp_path / "ckpt"),
                      checkpoint_interval=1.0)
        with job:
            assert job.wait_until(lambda: len(job.checkpoints.completed) >= 1, 60)
            feed.release()
            assert job.wait_until(lambda: job.metrics.input_total >= INPUTS // 2 + 2000, 60)
            where = job.topology.where
            for replica in (P, S):
                job.kill_node(where[Addr(2, 1, replica)])
            job.wait(timeout=240)
        assert not feed.error
        assert len(job.restart_log) == 1 and job.restart_log[0][1] is not None
        replays = [d for _, what, d in job.metrics.relative_events()
                   if what == "input log replay"]
        assert replays and replays[-1][1] > replays[-1][0], replays
    finally:
        feed.stop()
        source.close()
    inputs = source.inputs
    assert sorted(inputs) == sorted(records)  # each row once
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), inputs, 4)]
    assert [wire_form(x) for x in read_file_sink(out)] == expected
