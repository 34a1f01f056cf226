"""A sink twenty times slower than the feed: back-pressure holds every queue to
its window, the feed that cannot wait drops and counts, and what was accepted comes
out exactly as the failure-free run of the accepted inputs (slow: Spark)."""
from __future__ import annotations

import time

import pytest
from test_metrics_endpoint import scrape, series

from experiments.soak import CheckingSink, RecordedFeed, outputs_per_input
from flux.examples import paper_dataflow
from flux.testing.workloads import PacketWorkload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: sub-items of items of at most BATCH_ROWS inputs: about what 64 and 128 tuples were
WINDOW, CAPACITY, BATCH_ROWS, NODES = 8, 16, 8, 4


#: executors of this module's Spark session (the ``spark`` fixture, conftest)
SPARK_EXECUTORS = NODES + 1


def test_a_slow_sink_slows_the_source_and_queues_stay_bounded(spark):
    from flux.spark.job import FluxJob

    rate, seconds = 4000.0, 10
    dataflow = paper_dataflow()
    # a twentieth of the feed: the sink stays the slowest part even on a loaded machine (at a
    # tenth, a shared machine once made the job itself slower than the sink)
    sink_rate = rate * outputs_per_input(dataflow, NODES, 3, n=40_000) / 20
    feed = RecordedFeed(PacketWorkload(int(rate * seconds), 3, 20_000, 10, 500), rate,
                        backlog=500)
    sink = CheckingSink(dataflow, NODES, feed, sink_rate)
    job = FluxJob(spark, dataflow, feed, nodes=NODES, standbys=0, sink=sink, window=WINDOW,
                  capacity=CAPACITY, batch_size=4, batch_rows=BATCH_ROWS, metrics_port=0,
                  metrics_addr="127.0.0.1")
    most: dict = {}
    progress = []  # (records the feed offered, inputs the ingress took)
    with job:
        deadline = time.monotonic() + 300
        while not job.finished() and time.monotonic() < deadline:
            progress.append((feed.read, job.metrics.input_total))
            for name in ("flux_segment_queued", "flux_segment_in_flight",
                         "flux_segment_buffered"):
                for labels, v in series(scrape(job.metrics_url), name).items():
                    most[name, labels] = max(v, most.get((name, labels), 0))
            time.sleep(0.3)
        job.wait(timeout=10)
        summary = job.metrics.summary()
    assert sink.mismatches == 0, sink.first_mismatch
    # every accepted input's outputs came: what is left of the feed's record made none
    assert not sink.expected and all(not sink.reference.feed(r) for r, _ in feed.taken)
    assert summary["inputs"] + summary["dropped_inputs"] == rate * seconds
    # once the queues filled, the sink set the pace: in the feed's last 3 s the ingress
    # took a fraction of what was offered and the feed dropped the rest. The fraction is the
    # sink's share scaled by how many outputs the inputs of those seconds make (sessions end
    # in bursts): 11% to 32% measured; without back-pressure it is all of it.
    late = [(o, t) for o, t in progress if rate * (seconds - 3) <= o < rate * seconds]
    offered, took = late[-1][0] - late[0][0], late[-1][1] - late[0][1]
    assert offered > rate and took < offered / 2, (offered, took)
    segments = {labels for _, labels in most}
    assert len(segments) == 2 + 2 * 2 * NODES  # ingress, egress, 2 stages x 4 pairs
    for (name, labels), v in most.items():
        where = dict(labels)
        if name == "flux_segment_queued":  # a merge holds at most a window per feed
            assert v <= 2 * WINDOW * NODES, (where, v)
        elif name == "flux_segment_in_flight":  # a window per consumer replica
            assert v <= WINDOW * 2 * NODES, (where, v)
        elif where["stage"] != "egress":  # a buffer per consumer partition
            assert v <= CAPACITY * NODES, (where, v)
    # the sink set the pace: the last stage's windows toward the egress filled
    assert max(v for (name, labels), v in most.items()
               if name == "flux_segment_in_flight" and dict(labels)["stage"] == "stats") >= WINDOW
