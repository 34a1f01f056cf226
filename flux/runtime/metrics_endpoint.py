"""A Prometheus endpoint on the driver: what an operator of the service
watches, read when scraped.

Nothing is pushed or copied as the job runs: a scrape reads the job's ``Metrics``
(driver-side counters and the latency histogram), the controller's view of the
pairs and nodes, and the counters every node reports about its segments each
second (``NodeStats``). Counters of a segment start again at zero on a rebuilt
replica; Prometheus's ``rate()`` takes counter resets in its stride.

The metric names and meanings are listed in docs/api.md (Prometheus metrics).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from controller.rebalance import routed_loads
from flux.addresses import P
from flux.control_messages import SegmentStats
from flux.runtime.metrics import LATENCY_EDGES, Metrics

log = logging.getLogger(__name__)

#: the histogram's exported edges: every other one of the metrics' (factor sqrt(2))
EXPORTED_EDGES = LATENCY_EDGES[1::2]

#: pair states, each exported (0 pairs included) so a dashboard's series never vanish
PAIR_STATES = ("whole", "catching-up", "degraded", "single", "dormant")

#: events counted as ``flux_events_total{event=...}`` (see Metrics.relative_events)
EVENTS = ("killed", "detected", "take-over done", "state moved", "paused", "catch-up done",
          "catch-up aborted", "stuck", "controller stalled", "fenced", "divergence",
          "late heartbeat")


class JobCollector:
    """A custom collector (prometheus_client's ``Collector`` protocol): one ``collect`` per
    scrape. ``controller`` is the job's ControllerService (read, never changed);
    ``driver_stats`` gives the ingress's and the egress's ``SegmentStats``."""

    def __init__(self, metrics: Metrics, controller, stage_names: Sequence[str],
                 driver_stats: Callable[[], List[SegmentStats]],
                 clock: Callable[[], float] = time.monotonic):
        self.metrics, self.controller = metrics, controller
        self.stage_names = list(stage_names)
        self.driver_stats, self.clock = driver_stats, clock

    def collect(self) -> Iterator[Metric]:
        yield from self._driver()
        yield from self._pairs_and_nodes()
        yield from self._segments()

    # -- the driver's own counters -----------------------------------------------------
    def _driver(self) -> Iterator[Metric]:
        m = self.metrics
        yield CounterMetricFamily("flux_inputs", "inputs the ingress took from the source",
                                  value=m.input_total)
        yield CounterMetricFamily("flux_inputs_dropped", "inputs a feed that cannot wait "
                                  "dropped while back-pressure held the ingress",
                                  value=m.dropped_total)
        yield CounterMetricFamily("flux_outputs", "outputs handed to the sink",
                                  value=m.output_total)
        counts = list(m.latency_counts)
        buckets, seen = [], 0
        for k, edge in enumerate(LATENCY_EDGES):
            seen += counts[k]
            if k % 2 == 1:  # EXPORTED_EDGES
                buckets.append((repr(edge), seen))
        buckets.append(("+Inf", seen + counts[-1]))
        yield HistogramMetricFamily(
            "flux_latency_seconds", "end-to-end latency: arrival at the source to the sink",
            buckets=buckets, sum_value=m.latency_sum)
        yield GaugeMetricFamily("flux_max_output_gap_seconds",
                                "the longest wait between two outputs so far",
                                value=m.max_output_gap)
        events = CounterMetricFamily("flux_events", "failures, take-overs, catch-ups and "
                                     "other events of the job", labels=["event"])
        counts_by_event = dict(m.events.counts)
        for what in sorted(set(EVENTS) | set(counts_by_event)):
            events.add_metric([what], counts_by_event.get(what, 0))
        yield events
        yield CounterMetricFamily("flux_state_moved_bytes", "state moved to new replicas",
                                  value=m.events.moved_bytes)
        yield CounterMetricFamily("flux_state_move_seconds", "time spent moving state",
                                  value=m.events.moved_seconds)
        yield GaugeMetricFamily("flux_catchup_pause_max_seconds", "the longest time a "
                                "catch-up held its partition's sources paused",
                                value=m.events.max_pause or 0.0)

    # -- the controller's view ------------------------------------------------------------
    def _pairs_and_nodes(self) -> Iterator[Metric]:
        c = self.controller
        recovery = getattr(c, "recovery", None)
        pairs = GaugeMetricFamily("flux_pairs", "partitions of every stage by the state of "
                                  "their pair of replicas", labels=["state"])
        states = list(recovery.pair_states().values()) if recovery is not None else []
        for state in PAIR_STATES:
            pairs.add_metric([state], states.count(state))
        yield pairs
        pair = GaugeMetricFamily("flux_pair_whole", "1 while both replicas of the pair live",
                                 labels=["stage", "partition"])
        for (stage, partition), state in (recovery.pair_states().items()
                                          if recovery is not None else ()):
            pair.add_metric([self._stage(stage), str(partition)], 1.0 if state == "whole" else 0.0)
        yield pair
        dead = set(c.dead)
        free = list(recovery.free) if recovery is not None else []
        nodes = GaugeMetricFamily("flux_nodes", "node tasks by state (live: watched by the "
                                  "controller, standbys included)", labels=["state"])
        watched = list(c.last_seen) if recovery is not None else list(c.registered)
        nodes.add_metric(["live"], sum(1 for n in watched if n not in dead))
        nodes.add_metric(["dead"], len(dead))
        nodes.add_metric(["standby"], len(free))
        yield nodes

    # -- the nodes' reports ---------------------------------------------------------------
    def _segments(self) -> Iterator[Metric]:
        now = self.clock()
        rows: List[Tuple[str, SegmentStats]] = [("driver", s) for s in self.driver_stats()]
        ages = GaugeMetricFamily("flux_node_report_age_seconds",
                                 "time since the node last reported its segments", labels=["node"])
        reports: Dict[str, tuple] = dict(self.controller.node_stats)
        for node, (when, stats) in sorted(reports.items()):
            ages.add_metric([node], now - when)
            rows.extend((node, s) for s in stats.segments)
        yield ages
        labels = ["stage", "partition", "replica", "node"]
        families = {
            "taken": CounterMetricFamily("flux_segment_inputs", "tuples a replica took from "
                                         "its merge (the ingress: inputs accepted; the "
                                         "egress: outputs delivered)", labels=labels),
            "emitted": CounterMetricFamily("flux_segment_outputs", "tuples a replica's "
                                           "operators produced", labels=labels),
            "queued": GaugeMetricFamily("flux_segment_queued", "tuples waiting in a "
                                        "replica's merge", labels=labels),
            "buffered": GaugeMetricFamily("flux_segment_buffered", "tuples in a replica's "
                                          "output buffers (sent or not, not yet acknowledged)",
                                          labels=labels),
            "in_flight": GaugeMetricFamily("flux_segment_in_flight", "tuples sent and not "
                                           "yet credited by their consumers", labels=labels),
            "blocked": GaugeMetricFamily("flux_segment_blocked_connections", "outgoing "
                                         "connections whose credit window is full "
                                         "(back-pressure)", labels=labels),
        }
        for node, s in rows:
            values = [self._stage(s.addr.stage), str(s.addr.partition),
                      "primary" if s.addr.replica == P else "secondary", node]
            for field, family in families.items():
                family.add_metric(values, getattr(s, field))
        yield from families.values()
        groups = CounterMetricFamily("flux_key_group_rows", "rows routed to each key group "
                                     "of a stage (a hot group shows here; the rebalancing "
                                     "policy reads the same counts)", labels=["stage", "group"])
        for stage, counts in sorted(routed_loads(s for _, s in rows).items()):
            name = self._stage(stage)
            for group, n in enumerate(counts):
                groups.add_metric([name, str(group)], n)
        yield groups

    def _stage(self, stage: int) -> str:
        if stage == 0:
            return "ingress"
        if stage == len(self.stage_names) + 1:
            return "egress"
        return self.stage_names[stage - 1]


class MetricsEndpoint:
    """An HTTP server answering Prometheus's scrapes at ``/metrics`` from a registry of its
    own (several jobs in one process do not mix), on a thread of its own."""

    def __init__(self, collector: JobCollector, port: int, addr: str = "0.0.0.0"):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.collector = collector  # a restarted job points it at its new controller
        self.port, self.addr = port, addr
        self._server = None
        self._thread = None

    def start(self) -> "MetricsEndpoint":
        try:
            self._server, self._thread = start_http_server(self.port, self.addr, self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"the metrics endpoint cannot listen on "
                                     f"{self.addr}:{self.port}: {exc.strerror}") from exc
        self.port = self._server.server_port
        log.info("metrics for Prometheus at %s", self.url)
        return self

    @property
    def url(self) -> Optional[str]:
        if self._server is None:
            return None
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None
