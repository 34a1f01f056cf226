"""The paper's operators on Arrow batches (flux.examples.vectorized) give exactly what the
per-record operators give, batch after batch: the same outputs, produced by the same input
rows, in the same order, and the same ``get_state()`` after every batch, so a replica can
catch up from either kind (DESIGN 5, 11)."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux.examples.sessions import SessionReconstruction
from flux.examples.stats import DEFAULT_WINDOW, WindowedDurationStats
from flux.examples.vectorized import stats as vectorized_stats
from flux.examples.vectorized import tables as vectorized_tables
from flux.examples.vectorized import (
    PACKET_SCHEMA,
    SESSION_SCHEMA,
    STATS_SCHEMA,
    ArrowOperator,
    VectorizedSessions,
    VectorizedStats,
    run_chain,
    to_batch,
    to_records,
)
from flux.operator import wire_form
from flux.testing.workloads import packet_workload

pytestmark = pytest.mark.timeout(120)

#: packet_workload's knobs: the paper's 100K pairs (keys seldom repeat in a batch), four
#: pairs (every batch repeats keys, sessions restart), many "end"s without a "start"
WORKLOADS = {
    "many keys": ({}, 700),
    "few keys": (dict(pairs=4, apps=2, sources=2, concurrent=2), 1200),
    "stray ends": (dict(pairs=200, apps=5, sources=10, concurrent=20, stray_ends=0.3), 1200),
}
SLOW = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def cut(records: list, sizes: list) -> list:
    """``records`` in consecutive batches of ``sizes[0]``, ``sizes[1]``, ... (cycling)."""
    batches, i, k = [], 0, 0
    while i < len(records):
        batches.append(records[i:i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return batches


def per_record(op, records: list) -> list:
    """``(row, output)`` of ``op.process`` on each record in turn."""
    return [(i, out) for i, record in enumerate(records) for out in op.process(record)]


def arrow_pairs(rows: np.ndarray, batch: pa.RecordBatch) -> list:
    assert rows.dtype == np.int64 and bool(np.all(np.diff(rows) >= 0))
    return list(zip(rows.tolist(), to_records(batch)))


class Pair:
    """Both kinds of the two operators, fed the same batches and compared after each."""

    def __init__(self, ttl=None, window=DEFAULT_WINDOW, emit_every=2, idle_ttl=None,
                 chain=False):
        """``chain``: also run a third pair of vectorized operators through ``run_chain``."""
        self.sessions, self.stats = SessionReconstruction(ttl), WindowedDurationStats(
            window, emit_every, idle_ttl)
        self.vsessions = VectorizedSessions(ttl)
        self.vstats = VectorizedStats(window, emit_every, idle_ttl)
        self.chain = ([VectorizedSessions(ttl), VectorizedStats(window, emit_every, idle_ttl)]
                      if chain else None)

    def feed(self, packets: list) -> None:
        """One batch through both kinds, each operator's outputs and state compared."""
        expected_sessions = per_record(self.sessions, packets)
        records = [record for _, record in expected_sessions]
        expected_stats = per_record(self.stats, records)
        rows, sessions = self.vsessions.process_arrow(to_batch(packets, PACKET_SCHEMA))
        assert arrow_pairs(rows, sessions) == expected_sessions
        assert sessions.schema == SESSION_SCHEMA
        stats_rows, stats = self.vstats.process_arrow(sessions)
        assert arrow_pairs(stats_rows, stats) == expected_stats
        assert stats.schema == STATS_SCHEMA
        assert self.vsessions.get_state() == self.sessions.get_state()
        assert self.vstats.get_state() == self.stats.get_state()
        if self.chain is not None:  # the rows compose: each output names its packet
            rows, chain = run_chain(self.chain, to_batch(packets, PACKET_SCHEMA))
            assert arrow_pairs(rows, chain) == [(expected_sessions[j][0], out)
                                                for j, out in expected_stats]


params = st.fixed_dictionaries({
    "ttl": st.sampled_from([None, None, 1, 20, 100, 1000, 2.5]),
    "window": st.sampled_from([DEFAULT_WINDOW, 1, 40, 300]),
    "emit_every": st.sampled_from([1, 2, 3]),
    "idle_ttl": st.sampled_from([None, None, 7, 50, 500]),
})
sizes = st.lists(st.integers(1, 300) | st.just(1), min_size=1, max_size=6)


@SLOW
@given(workload=st.sampled_from(sorted(WORKLOADS)), seed=st.integers(0, 2 ** 16),
       fraction=st.floats(0.05, 1.0), sizes=sizes, params=params)
@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_the_vectorized_chain_gives_the_per_record_outputs_and_states(
        workload, seed, fraction, sizes, params):
    knobs, most = WORKLOADS[workload]
    packets = packet_workload(max(1, int(most * fraction)), seed, **knobs)
    pair = Pair(**params, chain=True)
    for batch in cut(packets, sizes):
        pair.feed(batch)


@pytest.mark.parametrize("size", [1024, 8192])
def test_the_paper_workload_in_big_batches(size):
    """20K packets of the paper's workload, default window: keys repeat across batches, and
    the key tables are rebuilt (more dead slots than live) along the way."""
    pair = Pair()
    for batch in cut(packet_workload(20_000, 7), [size]):
        pair.feed(batch)


def shuffled_time(rng: random.Random, n: int) -> list:
    """Event times that go back as well as forth, with ties."""
    ts, out = 0, []
    for _ in range(n):
        ts += rng.randint(-12, 10)
        out.append(ts)
    return out


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@SLOW
@given(seed=st.integers(0, 2 ** 16), sizes=sizes, params=params)
def test_event_time_out_of_order_and_any_kind_sequence(seed, sizes, params):
    """Each operator alone, on records the chain never makes: event time out of order
    within a key, ties, negative durations, ends and restarts in any order."""
    rng = random.Random(seed)
    stats_records = [(rng.choice(["a", "b"]), rng.randint(-1, 1), rng.randint(-5, 40), t)
                     for t in shuffled_time(rng, 400)]
    packets = [(rng.randint(0, 2), rng.randint(0, 2), f"app{rng.randint(0, 2)}",
                rng.choice(["start", "end", "end"]), t) for t in shuffled_time(rng, 400)]
    pair = Pair(**params)
    for batch in cut(stats_records, sizes):
        rows, out = pair.vstats.process_arrow(to_batch(batch, SESSION_SCHEMA))
        assert arrow_pairs(rows, out) == per_record(pair.stats, batch)
        assert pair.vstats.get_state() == pair.stats.get_state()
    for batch in cut(packets, sizes):
        rows, out = pair.vsessions.process_arrow(to_batch(batch, PACKET_SCHEMA))
        assert arrow_pairs(rows, out) == per_record(pair.sessions, batch)
        assert pair.vsessions.get_state() == pair.sessions.get_state()


@SLOW
@given(seed=st.integers(0, 2 ** 16), at=st.integers(0, 8), sizes=sizes, params=params,
       workload=st.sampled_from(sorted(WORKLOADS)))
@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_replica_catches_up_from_either_kind(seed, at, sizes, params, workload):
    """A state taken from one kind after ``at`` batches, sent through msgpack and installed
    in the other kind (install replaces what was there), goes on exactly as its source."""
    knobs, most = WORKLOADS[workload]
    batches = cut(packet_workload(most, seed, **knobs), sizes)
    pair = Pair(**params)
    for batch in batches[:at]:
        pair.feed(batch)
    junk = VectorizedSessions(params["ttl"]), VectorizedStats(
        params["window"], params["emit_every"], params["idle_ttl"])
    run_chain(junk, to_batch(packet_workload(50, seed + 1), PACKET_SCHEMA))
    if seed % 2:  # per-record -> vectorized
        junk[0].install_state(wire_form(pair.sessions.get_state()))
        junk[1].install_state(wire_form(pair.stats.get_state()))
        pair.vsessions, pair.vstats = junk
    else:  # vectorized -> per-record
        pair.sessions.install_state(wire_form(pair.vsessions.get_state()))
        pair.stats.install_state(wire_form(pair.vstats.get_state()))
    assert pair.vsessions.get_state() == pair.sessions.get_state()
    assert pair.vstats.get_state() == pair.stats.get_state()
    for batch in batches[at:]:
        pair.feed(batch)


def test_no_outputs_is_an_empty_batch_of_the_output_schema():
    sessions, stats = VectorizedSessions(), VectorizedStats()
    starts = [(1, 2, "app0", "start", 10), (3, 4, "app1", "start", 11)]
    for batch in (to_batch(starts, PACKET_SCHEMA), to_batch([], PACKET_SCHEMA)):
        rows, out = sessions.process_arrow(batch)
        assert rows.dtype == np.int64 and len(rows) == 0
        assert out.num_rows == 0 and out.schema == SESSION_SCHEMA
        rows, out = stats.process_arrow(out)
        assert rows.dtype == np.int64 and len(rows) == 0
        assert out.num_rows == 0 and out.schema == STATS_SCHEMA
    one = to_batch([("app0", 1, 5, 10)], SESSION_SCHEMA)  # a first update of emit_every=2
    rows, out = stats.process_arrow(one)
    assert len(rows) == 0 and out.schema == STATS_SCHEMA
    assert isinstance(sessions, ArrowOperator) and isinstance(stats, ArrowOperator)


@pytest.mark.parametrize("spread", ["wide ints", "strings"])
def test_keys_that_fill_no_small_rectangle(spread, monkeypatch):
    """Keys far apart (a hash table instead of the rectangle of ids), or strings, in tables
    rebuilt often (few dead slots are let pile up)."""
    monkeypatch.setattr(vectorized_tables, "_COMPACT_SLOTS", 8)
    monkeypatch.setattr(vectorized_stats, "_COMPACT_ENTRIES", 16)
    rng = random.Random(3)
    wide = {v: rng.randrange(-2 ** 62, 2 ** 62) for v in range(1000)}
    name = (lambda v: wide[v]) if spread == "wide ints" else (lambda v: f"host-{v}")
    schema = pa.schema([(f.name, pa.string() if f.name in ("src", "dst") and spread == "strings"
                         else f.type) for f in PACKET_SCHEMA])
    packets = [(name(s), name(d), app, kind, ts) for s, d, app, kind, ts in
               packet_workload(4000, 5, pairs=3000, apps=3, sources=100, concurrent=300)]
    pair = Pair(ttl=400, window=300, emit_every=1, idle_ttl=600)
    for batch in cut(packets, [700, 1, 333]):
        expected = per_record(pair.sessions, batch)
        rows, out = pair.vsessions.process_arrow(to_batch(batch, schema))
        assert list(zip(rows.tolist(), to_records(out))) == expected
        expected_stats = per_record(pair.stats, [r for _, r in expected])
        rows, out = pair.vstats.process_arrow(out)
        assert list(zip(rows.tolist(), to_records(out))) == expected_stats
        assert pair.vsessions.get_state() == pair.sessions.get_state()
        assert pair.vstats.get_state() == pair.stats.get_state()


def test_event_times_far_apart_take_the_ranked_path():
    """Times near the ends of int64 (the shifted running max and search would overflow)."""
    big = 2 ** 61
    records = [("a", k, 1 + i, big * (1 if i % 2 else -1) + 10 * i + k)
               for i in range(60) for k in range(3)]
    reference, vec = WindowedDurationStats(window=2 ** 62, emit_every=1), VectorizedStats(
        window=2 ** 62, emit_every=1)
    for batch in cut(records, [50, 7]):
        rows, out = vec.process_arrow(to_batch(batch, SESSION_SCHEMA))
        assert arrow_pairs(rows, out) == per_record(reference, batch)
        assert vec.get_state() == reference.get_state()


def test_a_bad_row_raises_before_the_state_changes():
    sessions = VectorizedSessions(ttl=10)
    sessions.process_arrow(to_batch([(1, 2, "app0", "start", 5)], PACKET_SCHEMA))
    before = sessions.get_state()
    with pytest.raises(ValueError, match="'start' or 'end'"):
        sessions.process_arrow(to_batch([(1, 2, "app0", "end", 6), (1, 3, "app0", "stop", 7)],
                                        PACKET_SCHEMA))
    assert sessions.get_state() == before
    with pytest.raises(ValueError, match="column 'ts'"):
        sessions.process_arrow(to_batch([(1, 2, "app0", "end", 6)], PACKET_SCHEMA).drop_columns(
            ["ts"]))
    with pytest.raises(ValueError, match="nulls"):
        sessions.process_arrow(pa.RecordBatch.from_arrays(
            [pa.array([1]), pa.array([None], pa.int64()), pa.array(["app0"]), pa.array(["end"]),
             pa.array([6])], schema=PACKET_SCHEMA))
    with pytest.raises(ValueError, match="held ints, now strs"):
        sessions.process_arrow(to_batch([("1", 2, "app0", "end", 6)], pa.schema(
            [("src", pa.string())] + list(PACKET_SCHEMA)[1:])))
    assert sessions.get_state() == before


def test_sums_past_two_to_the_53_are_divided_as_python_divides():
    """Durations near 2**52: a window's sum is no longer a float64 integer; the average is
    still Python's correctly rounded int / int."""
    records = [("a", 1, 2 ** 52 + 3 * i + 1, 10 * i) for i in range(40)]
    reference = WindowedDurationStats(window=10 ** 6, emit_every=1)
    vec = VectorizedStats(window=10 ** 6, emit_every=1)
    rows, out = vec.process_arrow(to_batch(records, SESSION_SCHEMA))
    assert arrow_pairs(rows, out) == per_record(reference, records)
    assert any(float(sum(r[2] for r in records[:k])) != sum(r[2] for r in records[:k])
               for k in range(2, 40))


def test_more_keys_than_a_16_bit_sort_can_group():
    """70K sessions open at once: slots past 2**16 are grouped by a comparison sort."""
    opened = [(i % 1000, i // 1000, f"app{i % 7}", "start", i) for i in range(70_000)]
    rng = random.Random(9)
    mixed = [(s, d, app, rng.choice(["start", "end"]), 70_000 + i) for i, (s, d, app, _, _)
             in enumerate(rng.choices(opened, k=8192))]
    reference, vec = SessionReconstruction(), VectorizedSessions()
    for batch in (opened, mixed):
        rows, out = vec.process_arrow(to_batch(batch, PACKET_SCHEMA))
        assert arrow_pairs(rows, out) == per_record(reference, batch)
    assert vec.state.size > 1 << 16
    assert vec.get_state() == reference.get_state()


def test_the_parameters_are_checked_as_the_per_record_operators_check_them():
    with pytest.raises(ValueError, match="ttl must be > 0"):
        VectorizedSessions(ttl=0)
    with pytest.raises(ValueError, match="window must be > 0"):
        VectorizedStats(window=0)
    with pytest.raises(ValueError, match="emit_every must be >= 1"):
        VectorizedStats(emit_every=0)
    with pytest.raises(ValueError, match="ttl must be > 0"):
        VectorizedStats(idle_ttl=-1)
