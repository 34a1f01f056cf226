"""Sources, sinks and metrics: what a user plugs in and reads out."""
from __future__ import annotations

import csv
import json

import pytest

from flux.runtime.metrics import TIMELINE_COLUMNS, Metrics
from flux.connectors.sinks import JsonLinesSink, read_json_lines
from flux.connectors.sources import NOT_YET, RateLimited

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_rate_limited_source_releases_records_as_they_arrive():
    clock = FakeClock()
    src = RateLimited(range(10), rate=100, clock=clock)  # one record per 10 ms
    assert next(src) == 0 and src.arrival == 100.0
    assert next(src) is NOT_YET
    clock.t += 0.025  # records 1 and 2 have arrived
    assert [next(src), next(src), next(src)] == [1, 2, NOT_YET]
    assert src.arrival == pytest.approx(100.02)
    assert src.due_in() == pytest.approx(0.005)
    clock.t += 1.0
    assert list(x for x in src if x is not NOT_YET) == list(range(3, 10))
    assert src.dropped == 0


def test_a_rate_limited_source_drops_what_waits_beyond_its_backlog_and_counts_it():
    clock = FakeClock()
    src = RateLimited(range(100), rate=1000, backlog=5, clock=clock)
    assert next(src) == 0  # the feed starts at the first pull
    clock.t += 0.0195  # records 1..19 have arrived; only 5 may wait
    assert next(src) == 15  # the 14 oldest were dropped
    assert src.dropped == 14 and src.arrival == pytest.approx(100.015)
    assert [next(src) for _ in range(4)] == [16, 17, 18, 19]
    assert next(src) is NOT_YET


def test_a_rate_limited_source_counts_drops_while_nobody_reads_it():
    """Back-pressure keeps the ingress from reading; it calls ``arrive`` meanwhile, so the
    drops show when they happen, not in one jump when reading resumes."""
    clock = FakeClock()
    src = RateLimited(range(100), rate=1000, backlog=5, clock=clock)
    src.arrive()
    assert src.dropped == 0 and src.read == 0  # nothing arrives before the first pull
    assert next(src) == 0
    clock.t += 0.0195
    src.arrive()
    assert src.dropped == 14 and len(src.waiting) == 5
    assert next(src) == 15


def test_a_rate_limited_source_ends_even_when_the_feed_ends_behind():
    clock = FakeClock()
    src = RateLimited(range(4), rate=1000, backlog=1, clock=clock)
    assert next(src) == 0
    clock.t += 10
    assert next(src) == 3 and src.dropped == 2
    with pytest.raises(StopIteration):
        next(src)


@pytest.mark.parametrize("rate, backlog", [(0, 10), (-5, 10), (10, 0)])
def test_a_rate_limited_source_refuses_bad_settings(rate, backlog):
    with pytest.raises(ValueError, match="rate|backlog"):
        RateLimited([], rate=rate, backlog=backlog)


def test_the_json_lines_sink_writes_every_output_in_order(tmp_path):
    path = str(tmp_path / "out.jsonl")
    items = [((1, 0), ("app", "src", 2.5)), ((1, 1), ["x", {"k": 1}]), ((3,), None)]
    with JsonLinesSink(path, flush_every=2) as sink:
        for item in items:
            sink(item)
    assert read_json_lines(path) == [((1, 0), ["app", "src", 2.5]), ((1, 1), ["x", {"k": 1}]),
                                     ((3,), None)]


def test_the_json_lines_sink_names_the_output_it_cannot_write(tmp_path):
    with JsonLinesSink(str(tmp_path / "out.jsonl")) as sink:
        with pytest.raises(TypeError, match=r"output \(4, 1\) cannot be written as JSON"):
            sink(((4, 1), b"\x00bytes"))


def test_metrics_count_per_interval_and_measure_latency_from_arrival():
    clock = FakeClock(10.0)
    m = Metrics(interval=0.1, clock=clock)
    m.begin()
    m.input_taken(arrival=9.99)  # input 1 arrived before it was taken
    clock.t = 10.05
    m.input_taken(arrival=None)  # input 2: as fast as possible, arrival = taken
    clock.t = 10.12
    m.output((1, 0))
    m.output((1, 1))
    m.output((2, 0))
    m.inputs_dropped(3)
    clock.t = 10.31
    m.inputs_dropped(3)  # a running total: nothing new
    m.output((2, 5))
    rows = m.timeline()
    assert [r["t_s"] for r in rows] == [0.0, 0.1, 0.2, 0.3]
    assert [(r["inputs"], r["dropped"], r["outputs"]) for r in rows] == [
        (2, 0, 0), (0, 3, 3), (0, 0, 0), (0, 0, 1)]
    # (130 + 130 + 70) / 3 ms, then 260 ms
    assert rows[1]["avg_latency_ms"] == pytest.approx(110.0)
    assert rows[0]["avg_latency_ms"] is None and rows[3]["avg_latency_ms"] == pytest.approx(260.0)
    summary = m.summary()
    assert (summary["inputs"], summary["outputs"], summary["dropped_inputs"]) == (2, 4, 3)
    assert summary["max_output_gap_s"] == pytest.approx(0.19)  # from 10.12 to 10.31
    assert summary["max_output_gap_end_s"] == pytest.approx(0.31)
    assert summary["max_output_gap_after_kill_s"] is None  # nothing was killed


def metrics_with_inputs(clock, inputs: int) -> Metrics:
    """Metrics begun at ``clock``, ``inputs`` inputs taken, the first one's output out."""
    m = Metrics(interval=0.1, clock=clock)
    m.begin()
    for _ in range(inputs):
        m.input_taken(arrival=None)
    m.output((1, 0))
    return m


def test_the_longest_output_gap_after_a_kill_is_kept_apart_from_the_start_ups():
    clock = FakeClock(10.0)
    m = metrics_with_inputs(clock, 5)
    clock.t = 10.5  # a long start-up gap
    m.output((2, 0))
    clock.t = 10.6
    m.output((3, 0))
    clock.t = 10.65
    m.killed("node1 (worker)")
    assert m.summary()["max_output_gap_after_kill_s"] is None  # no output after it yet
    clock.t = 10.8  # the gap around the kill: from the last output before it
    m.output((4, 0))
    clock.t = 10.85
    m.output((5, 0))
    summary = m.summary()
    assert summary["max_output_gap_s"] == pytest.approx(0.5)
    assert summary["max_output_gap_after_kill_s"] == pytest.approx(0.2)
    assert [(what, detail) for _, what, detail in m.relative_events()] == [
        ("killed", "node1 (worker)")]


def test_the_longest_gap_of_the_seconds_before_a_kill_is_the_failovers_yardstick():
    """Outputs come in steps even without a failure: the longest wait of the last
    BEFORE_KILL seconds before the first kill is kept, a start-up's long before apart."""
    from flux.runtime.metrics import BEFORE_KILL

    clock = FakeClock(0.0)
    m = metrics_with_inputs(clock, 100)
    clock.t = 1.0  # the start-up's wait, long before the kill
    m.output((2, 0))
    sn = 3
    while clock.t < 7.9:
        clock.t = round(clock.t + (0.3 if sn == 41 else 0.1), 6)  # one slow step at 4.9
        m.output((sn, 0))
        sn += 1
    assert m.summary()["max_output_gap_before_kill_s"] is None  # nothing was killed
    assert 1.0 < clock.t - BEFORE_KILL < 4.9
    m.killed("node1 (worker)")
    clock.t += 0.25
    m.output((sn, 0))
    summary = m.summary()
    assert summary["max_output_gap_before_kill_s"] == pytest.approx(0.3)
    assert summary["max_output_gap_after_kill_s"] == pytest.approx(0.25)
    assert summary["max_output_gap_s"] == pytest.approx(1.0)


def test_metrics_sum_state_movements_and_give_events_relative_times(tmp_path):
    clock = FakeClock(50.0)
    m = Metrics(clock=clock)
    m.begin()
    m.events.extend([(52.0, "take-over done", "A"), (51.5, "detected", "node1"),
                     (53.0, "state moved", ("A", 1000, 0.25)),
                     (53.5, "state moved", ("B", 500, 0.5))])
    assert [e[:2] for e in m.relative_events()] == [
        (1.5, "detected"), (2.0, "take-over done"), (3.0, "state moved"), (3.5, "state moved")]
    summary = m.summary()
    assert summary["state_bytes_moved"] == 1500 and summary["state_move_s"] == 0.75
    m.write_json(str(tmp_path / "s.json"))
    assert json.load(open(tmp_path / "s.json"))["state_bytes_moved"] == 1500
    m.input_taken(None)
    m.write_csv(str(tmp_path / "t.csv"))
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert tuple(rows[0]) == TIMELINE_COLUMNS and rows[0]["inputs"] == "1"


def run_metrics(m: Metrics, clock: FakeClock, inputs: int, start: int = 1, lag: int = 50) -> None:
    """``inputs`` inputs at 10K/s, each output ``lag`` inputs later, settled as the egress does."""
    for n in range(start, start + inputs):
        clock.t += 1e-4
        m.input_taken(None)
        if n > lag:
            m.output((n - lag, 1))
            m.settled(n - lag - 1)


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@pytest.mark.timeout(120)  # 5 s alone; tracemalloc is slow on a loaded machine
def test_metrics_hold_no_object_per_input_or_output():
    """What a job measures does not grow with its length (the arrivals array and
    the per-interval dicts grew ~40 bytes per input before)."""
    import tracemalloc

    clock = FakeClock(0.0)
    m = Metrics(interval=0.1, clock=clock, span=5.0)
    m.begin()
    tracemalloc.start()
    try:
        run_metrics(m, clock, 70_000)
        held = tracemalloc.get_traced_memory()[0]
        run_metrics(m, clock, 200_000, start=70_001)  # 20 s more, four spans
        grown = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert grown < 128 * 1024, f"{grown} bytes more after 200K more outputs"
    assert m.arrivals_kept < 2 ** 16 + 50
    assert len(m.timeline()) == 50  # the last 5 s
    s = m.summary()
    assert (s["inputs"], s["outputs"]) == (270_000, 270_000 - 50)
    assert s["latency_p50_ms"] == pytest.approx(5.0, rel=0.2)  # 50 inputs at 10K/s


def test_the_latency_histogram_gives_quantiles_within_a_bucket():
    import random

    clock = FakeClock(0.0)
    m = Metrics(clock=clock)
    m.begin()
    rnd = random.Random(3)
    latencies = sorted(rnd.expovariate(1 / 0.05) for _ in range(20_000))
    for n, lat in enumerate(latencies, start=1):
        clock.t = n * 10.0
        m.input_taken(arrival=clock.t - lat)
        m.output((n,))
    for q in (0.5, 0.9, 0.99):
        exact = latencies[int(q * len(latencies))]
        assert m.latency_quantile(q) == pytest.approx(exact, rel=0.19)
    assert m.latency_quantile(0.5, counts=[0] * len(m.latency_counts)) is None


def test_the_event_log_keeps_the_last_events_and_totals_of_all():
    from flux.runtime.metrics import EventLog

    log = EventLog(keep=3)
    for k in range(10):
        log.append((float(k), "state moved", (f"A{k}", 100, 0.5)))
        log.append((k + 0.5, "paused", (f"A{k}", 0.01 * k)))
    assert [e[0] for e in log] == [8.5, 9.0, 9.5]
    assert log.counts == {"state moved": 10, "paused": 10}
    assert (log.moved_bytes, log.moved_seconds) == (1000, 5.0)
    assert log.max_pause == pytest.approx(0.09)
