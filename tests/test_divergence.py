"""Divergence detection (DESIGN 14): both replicas of a partition digest their states and
outputs at every cut they cross, and the controller compares the pair. Here: what a
digest depends on (the state, not the order keys went in), how the monitor pairs and
compares reports, and two segments fed the same items agreeing at a cut while a third
that skipped a record does not."""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.divergence import Divergence, DivergenceMonitor, compare, name_first_key
from exchange.columns import ArrowRows
from exchange.rows import Rows
from flux.addresses import Addr, P, S
from flux.digests import (
    GROUPS,
    Digest,
    KeyedSums,
    OutputDigest,
    first_differing_key,
    group_pairs,
    item_digest,
    keyed_digest,
    keyed_digest_after,
)
from flux.keyed_state import KeyedState
from flux.keys import MISSING

pytestmark = pytest.mark.timeout(60)


def test_a_keyed_state_digest_depends_on_its_pairs_not_on_their_insertion_order():
    pairs = [(f"k{i}", [i * 3, "x"]) for i in range(500)]
    one, other = KeyedState(), KeyedState()
    for key, value in pairs:
        one[key] = value
    for key, value in reversed(pairs):
        other[key] = tuple(value)  # a msgpack round trip gives lists: the same bytes
    assert keyed_digest(one.items()) == keyed_digest(other.items())
    other["k7"] = [22, "x"]
    assert keyed_digest(one.items()) != keyed_digest(other.items())
    del other["k7"]
    assert keyed_digest(one.items()) != keyed_digest(other.items())  # a key missing


def test_an_item_digest_covers_its_sn_its_rows_sns_and_their_values():
    rows = Rows(np.array([[1, 1], [2, 1]], dtype=np.int64), [("a", 1), ("b", 2)])
    same = Rows(np.array([[1, 1], [2, 1]], dtype=np.int64), [["a", 1], ["b", 2]])
    assert item_digest((5,), rows) == item_digest((5,), same)  # a msgpack round trip
    assert item_digest((5,), rows) != item_digest((6,), rows)
    assert item_digest((5,), rows) != item_digest(
        (5,), Rows(np.array([[1, 1], [2, 2]], dtype=np.int64), [("a", 1), ("b", 2)]))
    assert item_digest((5,), rows) != item_digest(
        (5,), Rows(np.array([[1, 1], [2, 1]], dtype=np.int64), [("a", 1), ("b", 3)]))
    batch = pa.record_batch({"k": ["a", "b"], "v": [1, 2]})
    columns = ArrowRows(rows.sns, batch)
    assert item_digest((5,), columns) == item_digest(
        (5,), ArrowRows(rows.sns.copy(), pa.record_batch({"k": ["a", "b"], "v": [1, 2]})))
    assert item_digest((5,), columns) != item_digest(
        (5,), ArrowRows(rows.sns, pa.record_batch({"k": ["a", "b"], "v": [1, 3]})))


def test_the_outputs_digest_does_not_depend_on_the_order_items_were_made():
    items = [((i,), Rows(np.array([[i, 1]], dtype=np.int64), [("k", i)])) for i in range(1, 9)]
    one, other = OutputDigest(), OutputDigest()
    for sn, rows in items:
        one.add(sn, rows)
    for sn, rows in reversed(items):
        other.add(sn, rows)
    assert one.crossed(8) == other.crossed(8)
    assert one.since == 8 and one.total == 0  # from the cut on, a new span


def test_a_replica_installed_from_its_twin_continues_the_twins_outputs_digest():
    active = OutputDigest()
    active.add((1,), Rows(np.array([[1, 1]], dtype=np.int64), [("k", 1)]))
    new = OutputDigest()
    new.install_state(active.to_state())
    for d in (active, new):
        d.add((2,), Rows(np.array([[2, 1]], dtype=np.int64), [("k", 2)]))
    assert active.crossed(2) == new.crossed(2)
    unknown = OutputDigest()
    unknown.install_state(None)  # a twin that did not digest: the span is incomplete
    assert unknown.crossed(3) == (None, -1)
    assert unknown.crossed(4) == (0, 3)  # the next span is whole


def digest(states, outputs=7, since=0, number=1, cut=10):
    return Digest(number, cut, tuple(states), outputs, since)


def test_the_monitor_pairs_reports_in_either_order_and_names_what_differs():
    monitor = DivergenceMonitor()
    assert monitor.report(Addr(1, 0, S), digest([1, 2])) is None
    assert monitor.report(Addr(1, 0, P), digest([1, 2])) is None  # equal
    assert monitor.report(Addr(2, 3, P), digest([1, 2, 3])) is None
    found = monitor.report(Addr(2, 3, S), digest([1, 9, 3], outputs=8))
    assert (found.stage, found.partition, found.number, found.cut) == (2, 3, 1, 10)
    assert found.operators == (1,) and found.outputs
    text = found.describe(["Sessions", "Stats", "Count"])
    assert "stage 2 partition 3" in text and "checkpoint 1 (cut 10)" in text
    assert "the state of Stats" in text and "not deterministic" in text
    assert (monitor.compared, monitor.diverged, monitor.waiting()) == (2, 1, 0)


def test_outputs_are_compared_only_over_the_same_whole_span():
    assert compare(1, 0, digest([1], 5, since=3), digest([1], 6, since=4)) is None
    assert compare(1, 0, digest([1], 5), digest([1], None, since=-1)) is None
    assert compare(1, 0, digest([1], 5), digest([1], 6)).operators == ()


def test_a_report_whose_twin_never_comes_is_forgotten_after_a_window_of_cuts():
    monitor = DivergenceMonitor(window=4)
    for k in range(1, 100):
        monitor.report(Addr(1, 0, P), digest([k], number=k, cut=k * 10))
    assert monitor.waiting() == 4
    # a successor's report of the same cut replaces its predecessor's
    monitor.report(Addr(1, 0, S), digest([5], number=99, cut=990))
    assert monitor.waiting() == 3 and monitor.diverged == 1
    # a checkpoint number again after a restart, with another cut: not paired with the old
    monitor.report(Addr(1, 1, P), digest([1], number=3, cut=30))
    assert monitor.report(Addr(1, 1, S), digest([2], number=3, cut=31)) is None


def test_two_replicas_fed_the_same_items_agree_at_a_cut_and_one_that_skipped_does_not():
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import counting_dataflow

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    segments = [builder.segment(Addr(1, 0, r)) for r in (P, S, S)]
    items = [Rows.of_inputs(1 + 3 * i, [(f"k{(3 * i + j) % 4}", j) for j in range(3)])
             for i in range(4)]
    for n, seg in enumerate(segments):
        for i, rows in enumerate(items):
            if n == 2 and i == 2:
                rows = rows.sliced(1, len(rows))  # a record this replica left out
            seg.outputs.add((3 * i + 3,), seg._operators(rows))  # item SN: its last input
        seg.cuts.learn((1, 12))
    snaps = []
    for seg in segments:
        seg.fcons.frontier = lambda: (12,)  # its merge has passed the cut
        snaps.append(seg.snapshot(keep=False)[0].digest)
    assert compare(1, 0, snaps[0], snaps[1]) is None
    found = compare(1, 0, snaps[0], snaps[2])
    assert found is not None and found.operators == (0,) and found.outputs


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["set", "del"]), st.integers(0, 300),
                          st.integers(-3, 3)), max_size=80),
       st.lists(st.integers(0, 300), max_size=200))
def test_a_keyed_digest_kept_from_the_changed_keys_is_the_whole_stores(ops, first):
    """The sum, and its groups, follow the changed keys; the groups add up to the sum."""
    state = KeyedState()
    for k in first:
        state[("k", k)] = [k, "v"]
    total, sums = keyed_digest(state.items()), KeyedSums.of(state.pairs())
    assert sums.total == total
    state.start_changes()
    for op, k, v in ops:
        if op == "set":
            state[("k", k)] = [v, "v"]
        else:
            state.pop(("k", k), None)
    assert keyed_digest_after(total, state.changed_pairs()) == keyed_digest(state.items())
    assert sums.after(state.changed_pairs()).groups() == KeyedSums.of(state.pairs()).groups()


def test_a_replicas_keyed_digests_across_cuts_equal_a_fresh_whole_pass():
    """A segment keeps its keyed digest from cut to cut by the changed keys; a replica
    whose state was installed from it passes over the whole store once: they agree."""
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import counting_dataflow

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, P))
    seg._operators(Rows.of_inputs(100, [(f"k{j}", 0) for j in range(40)]))
    for i in range(6):
        rows = Rows.of_inputs(1 + 4 * i, [(f"k{(5 * i + j) % 37}", j) for j in range(4)])
        seg._operators(rows)
        seg.cuts.learn((i + 1, 4 * i + 4))
        seg.fcons.frontier = lambda n=4 * i + 4: (n,)
        mine = seg.snapshot(keep=i % 2 == 0)[0].digest
        twin = builder.segment(Addr(1, 0, S))
        twin.chain.install_state(seg.chain.get_state())
        twin.cuts.learn((i + 1, 4 * i + 4))
        twin.fcons.frontier = lambda n=4 * i + 4: (n,)
        assert twin.snapshot(keep=False)[0].digest.states == mine.states
    assert seg._stores()[0].records_changes  # kept from the changes, not passed over


def test_a_store_most_of_whose_keys_change_between_cuts_records_no_changes_for_a_while():
    """Recording costs every write; where most keys change anyway, a whole pass is
    cheaper: the store records none for ``digest_hot_skip`` cuts, then tries again."""
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import counting_dataflow

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, P))
    store = seg._stores()[0]
    recorded = []
    for i in range(8):
        seg._operators(Rows.of_inputs(1 + 4 * i, [(f"k{j}", i) for j in range(4)]))
        seg.cuts.learn((i + 1, 4 * i + 4))
        seg.fcons.frontier = lambda n=4 * i + 4: (n,)
        digest = seg.snapshot(keep=False)[0].digest
        assert digest.states == (keyed_digest(store.pairs()),)
        recorded.append(store.records_changes)
    # cut 1: a whole pass (first), then records; cut 2: every key changed: none for 4 cuts
    assert recorded == [True, False, False, False, False, True, False, False]


def test_a_whole_pass_lets_the_nodes_other_threads_run_between_its_slices():
    """One C loop over every pair would hold the GIL for the whole pass, and a node's
    heartbeat thread with it: long enough, on a big store, for a false detection."""
    import threading

    state = KeyedState()
    for i in range(100 * 2048):
        state[("k", i)] = [i, "v"]
    turns, done = [], threading.Event()

    def other_thread():
        while not done.is_set():
            turns.append(1)
            time.sleep(0)  # give the GIL back at once

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        for _ in range(3):
            before = len(turns)
            keyed_digest(state.pairs())
            if len(turns) - before >= 5:  # it ran between the slices
                break
        else:
            pytest.fail("no other thread ran during three whole passes of 100 slices")
    finally:
        done.set()
        thread.join(timeout=10)


def test_the_groups_that_differ_hold_the_first_key_that_differs():
    """Two stores differing in a value, a key only one holds, and a key the other holds:
    the differing groups' pairs name the first of those keys in key order."""
    mine = {f"k{i:03}": i for i in range(500)}
    twins = dict(mine, k250=-1, k400=400.5)
    del twins["k100"]
    twins["k900"] = 9
    a, b = KeyedSums.of(mine.items()).groups(), KeyedSums.of(twins.items()).groups()
    groups = [g for g, (x, y) in enumerate(zip(a, b)) if x != y]
    assert 1 <= len(groups) <= 8  # two groups per changed value, one per added or gone key
    assert first_differing_key(group_pairs(mine.items(), groups),
                               group_pairs(twins.items(), groups)) == "k100"
    assert first_differing_key(group_pairs(mine.items(), groups),
                               group_pairs(mine.items(), groups)) is MISSING


def _crossed(seg, i: int, cut: int):
    seg.cuts.learn((i, cut))
    seg.fcons.frontier = lambda n=cut: (n,)
    return seg.snapshot(keep=False)[0].digest


def test_a_replica_says_its_pairs_as_at_the_cut_after_it_moved_on():
    """The controller asks after the comparison: a replica that took inputs since the
    cut answers from its changes' values at the cut; one that crossed the next cut, or
    took inputs without recording its changes, cannot say (None)."""
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import counting_dataflow

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4, digests=True)
    seg = builder.segment(Addr(1, 0, P))
    seg._operators(Rows.of_inputs(1, [(f"k{j}", 0) for j in range(40)]))
    digest = _crossed(seg, 1, 40)
    at_cut = dict(seg._stores()[0].pairs())
    everything = range(GROUPS)
    seg._operators(Rows.of_inputs(41, [("k3", 0), ("new", 0), ("k3", 0)]))
    seg.taken += 3
    answer = dict(seg.probe_keys(1, 40, 0, everything))
    assert answer == dict(group_pairs(at_cut.items(), everything))
    assert len(answer) == 40 and "new" not in answer
    assert seg.probe_keys(1, 39, 0, everything) is None  # another cut
    assert seg.probe_keys(1, 40, 5, everything) is None  # no such operator
    _crossed(seg, 2, 43)
    assert seg.probe_keys(1, 40, 0, everything) is None  # crossed the next one
    assert digest.groups[0] is not None and len(digest.groups[0]) == GROUPS
    store = seg._stores()[0]
    store.stop_changes()  # a store not recording: only while it took nothing since
    assert seg.probe_keys(2, 43, 0, everything) is not None
    seg._operators(Rows.of_inputs(44, [("k5", 0)]))
    seg.taken += 1
    assert seg.probe_keys(2, 43, 0, everything) is None


def test_a_divergence_names_the_first_differing_key_from_both_answers():
    mine = [("a", 1), ("b", 2), ("c", 3)]
    twins = [("a", 1), ("b", 5), ("c", 4)]
    found = Divergence(1, 2, 3, 40, (0,), False, ((0, (7,)),))
    named = name_first_key(found, mine, twins, 0)
    assert named.key == (0, "b")
    assert "a key whose value differs: 'b' in Counts" in named.describe(["Counts"])
    assert name_first_key(found, mine, None, 0) == found  # one replica could not say
