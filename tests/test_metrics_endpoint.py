"""The Prometheus endpoint: scraped over HTTP from a running cluster on
threads, the numbers an operator of the service watches are there and right."""
from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_runtime_failover import paced

from exchange.partitioner import HashPartitioner
from flux.testing.dataflows import counting_dataflow
from flux.reference import reference_output
from flux.runtime.metrics import Metrics
from flux.runtime.metrics_endpoint import JobCollector, MetricsEndpoint
from flux.testing.threads import ThreadCluster
from controller.topology import EGRESS_PROCESS, INGRESS_PROCESS
from flux.testing.workloads import keyed_workload

pytestmark = pytest.mark.timeout(120)


def scrape(url: str) -> dict:
    """{(sample name, sorted label pairs): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def series(samples: dict, name: str, **labels) -> dict:
    """The samples of ``name`` whose labels include ``labels``, by their other labels."""
    out = {}
    for (n, pairs), v in samples.items():
        d = dict(pairs)
        if n == name and all(d.get(k) == v2 for k, v2 in labels.items()):
            out[tuple(sorted((k, x) for k, x in d.items() if k not in labels))] = v
    return out


def endpoint_for(cluster: ThreadCluster, metrics: Metrics, dataflow) -> MetricsEndpoint:
    driver = [m for name in (INGRESS_PROCESS, EGRESS_PROCESS)
              for m in cluster.loops[name].host.machines.values()]
    collector = JobCollector(metrics, cluster.controller,
                             [s.name for s in dataflow.stages],
                             lambda: [m.stats() for m in driver])
    return MetricsEndpoint(collector, 0, "127.0.0.1").start()


def test_a_scrape_shows_every_replica_the_pairs_and_a_failure():
    records = keyed_workload(6000, seed=3, keys=40)
    expected = reference_output(counting_dataflow(2), records, 4)
    cluster = ThreadCluster(counting_dataflow(2), 4, paced(records), standbys=1)
    endpoint = endpoint_for(cluster, Metrics(), counting_dataflow(2))
    try:
        with cluster:
            assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 3, 60)
            first = scrape(endpoint.url)
            assert series(first, "flux_pairs") == {
                (("state", "whole"),): 8.0, (("state", "catching-up"),): 0.0,
                (("state", "degraded"),): 0.0, (("state", "single"),): 0.0,
                (("state", "dormant"),): 0.0}
            cluster.kill("node1")
            assert cluster.wait_until(lambda: cluster.recovery.missing, 30)
            during = scrape(endpoint.url)
            # node1 held a replica of partitions 0 and 1 of both stages
            pairs = series(during, "flux_pairs")
            assert pairs[(("state", "whole"),)] == 4.0
            assert pairs[(("state", "degraded"),)] + pairs[(("state", "catching-up"),)] == 4.0
            assert cluster.wait_until(lambda: len(cluster.delivered) == len(expected)
                                      and not cluster.recovery.pending(), 60)
            time.sleep(1.5)  # every node reports its segments each second
            after = scrape(endpoint.url)
    finally:
        endpoint.stop()
    assert series(after, "flux_pairs")[(("state", "whole"),)] == 8.0
    assert series(after, "flux_nodes") == {(("state", "live"),): 4.0, (("state", "dead"),): 1.0,
                                           (("state", "standby"),): 0.0}
    assert set(series(after, "flux_node_report_age_seconds")) == {
        (("node", n),) for n in ("node0", "node2", "node3", "standby0")}
    taken = series(after, "flux_segment_inputs_total")
    assert taken[(("node", "driver"), ("partition", "0"), ("replica", "primary"),
                  ("stage", "ingress"))] == len(records)
    assert taken[(("node", "driver"), ("partition", "0"), ("replica", "primary"),
                  ("stage", "egress"))] == len(expected)
    replicas = {(dict(k)["stage"], dict(k)["partition"], dict(k)["replica"]): v
                for k, v in taken.items() if dict(k)["node"] != "driver"}
    assert len(replicas) == 16  # 2 stages x 4 partitions x 2 replicas, the rebuilt ones too
    for stage in ("count1", "count2"):
        for p in ("2", "3"):  # pairs the failure did not touch: both replicas took the same
            assert replicas[stage, p, "primary"] == replicas[stage, p, "secondary"] > 0
    assert sum(replicas["count1", p, "primary"] for p in ("2", "3")) < len(records)
    # each record counted once in its stage-1 key group (partitions 0 and 1 lost a
    # replica each: their twins' counts stand), each stage-1 output in its stage-2 group
    partitioner = HashPartitioner(4)
    rows = series(after, "flux_key_group_rows_total", stage="count1")
    want = Counter(partitioner.group(counting_dataflow(2).stages[0].key(r)) for r in records)
    assert {int(dict(k)["group"]): v for k, v in rows.items() if v} == want
    stage2 = series(after, "flux_key_group_rows_total", stage="count2")
    emitted = {(dict(k)["partition"], dict(k)["replica"]): v for k, v in
               series(after, "flux_segment_outputs_total", stage="count1").items()}
    assert sum(stage2.values()) == sum(max(emitted[p, "primary"], emitted[p, "secondary"])
                                       for p in "0123") > len(records)
    assert all(v == 0 for v in series(after, "flux_segment_queued").values())
    assert all(v >= 0 for v in series(after, "flux_segment_in_flight").values())
    with pytest.raises(urllib.error.URLError):
        scrape(endpoint.url or "http://127.0.0.1:%d/metrics" % endpoint.port)


def test_the_latency_histogram_and_counters_come_from_the_jobs_metrics():
    clock = [0.0]
    m = Metrics(clock=lambda: clock[0])
    m.begin()
    for n, latency in enumerate((0.002, 0.004, 0.030, 0.5), start=1):
        clock[0] = 10.0 * n
        m.input_taken(arrival=clock[0] - latency)
        m.output((n, 1))
    m.inputs_dropped(7)
    m.events.append((1.0, "state moved", ("A", 1234, 0.5)))
    endpoint = MetricsEndpoint(JobCollector(m, _NoController(), ["s"], lambda: []), 0,
                               "127.0.0.1").start()
    try:
        got = scrape(endpoint.url)
    finally:
        endpoint.stop()
    assert got[("flux_inputs_total", ())] == 4 and got[("flux_outputs_total", ())] == 4
    assert got[("flux_inputs_dropped_total", ())] == 7
    assert got[("flux_latency_seconds_count", ())] == 4
    assert got[("flux_latency_seconds_sum", ())] == pytest.approx(0.536)
    buckets = series(got, "flux_latency_seconds_bucket")
    le = sorted((float(dict(k)["le"]), v) for k, v in buckets.items())
    assert le[-1] == (float("inf"), 4)
    assert [v for edge, v in le if 0.005 < edge < 0.02] and all(
        v == 2 for edge, v in le if 0.005 < edge < 0.02)  # 2 and 4 ms, not 30 ms
    assert got[("flux_state_moved_bytes_total", ())] == 1234
    assert got[("flux_events_total", (("event", "state moved"),))] == 1
    assert got[("flux_events_total", (("event", "detected"),))] == 0


class _NoController:
    """A controller before the job's start: nothing registered, no recovery yet."""
    dead, registered, node_stats, last_seen = set(), {}, {}, {}


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        endpoint = MetricsEndpoint(JobCollector(Metrics(), _NoController(), [], lambda: []),
                                   port, "127.0.0.1")
        with pytest.raises(OSError, match=f"metrics endpoint cannot listen on 127.0.0.1:{port}"):
            endpoint.start()
