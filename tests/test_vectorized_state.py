"""The vectorized examples' state is a flux.KeyedStore (DESIGN 10): the runtime finds it, its
deltas and checkpoint changes are the per-record twin's given the same batches, and a
replica rebuilt from a snapshot, from bulk parts and a delta, or from a checkpoint chain
goes on exactly as its source (the outputs of further batches, the state after each)."""
from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux.addresses import Addr, S
from flux.examples import paper_dataflow, vectorized_dataflow
from flux.examples.vectorized import (
    PACKET_SCHEMA,
    VectorizedSessions,
    VectorizedStats,
    run_chain,
    to_batch,
)
from flux.examples.vectorized import stats as vectorized_stats
from flux.examples.vectorized import tables as vectorized_tables
from flux.expiry import WATERMARK_KEY
from flux.keyed_state import keyed_state_of
from flux.operator import OperatorChain, wire_form
from flux.reference import reference_output
from flux.snapshot_chain import delta_snapshot, full_snapshot, install, rebuild
from flux.state_codec import pack_part, unpack_part, unpack_state
from flux.testing.workloads import packet_workload
from test_vectorized_examples import SLOW, WORKLOADS, Pair, cut, params, sizes
from thread_runs import assert_exact_and_caught_up_in_parts, run

pytestmark = pytest.mark.timeout(300)

workloads = st.sampled_from(sorted(WORKLOADS))
seeds = st.integers(0, 2 ** 16)


@contextmanager
def small_tables(small: bool):
    """Key tables and windows rebuilt after a few dead slots (``small``): deletions seen
    by a record must outlive the rebuilds."""
    if not small:
        yield
        return
    with mock.patch.object(vectorized_tables, "_COMPACT_SLOTS", 4), \
            mock.patch.object(vectorized_stats, "_COMPACT_ENTRIES", 8):
        yield


def batches_of(workload: str, seed: int, sizes: list) -> list:
    knobs, most = WORKLOADS[workload]
    return cut(packet_workload(most, seed, **knobs), sizes)


def stores(pair: Pair) -> list:
    """Per operator, (the vectorized one's store, the per-record twin's KeyedState)."""
    return [(keyed_state_of(pair.vsessions), pair.sessions.state),
            (keyed_state_of(pair.vstats), pair.stats.state)]


def fresh_ops(params: dict) -> tuple:
    """A new replica's operators, with some other state in them first (what it gets
    installed must replace it)."""
    ops = (VectorizedSessions(params["ttl"]),
           VectorizedStats(params["window"], params["emit_every"], params["idle_ttl"]))
    run_chain(ops, to_batch(packet_workload(50, 99), PACKET_SCHEMA))
    return ops


def twin_states(pair: Pair) -> list:
    return wire_form([pair.sessions.get_state(), pair.stats.get_state()])


def go_on_with(states: list, ops: tuple, params: dict) -> Pair:
    """A ``Pair`` of ``ops`` (a rebuilt replica) beside per-record twins holding ``states``
    (``twin_states`` of its source): fed the same batches, the replica must give what
    they give."""
    other = Pair(**params)
    other.vsessions, other.vstats = ops
    other.sessions.install_state(states[0])
    other.stats.install_state(states[1])
    return other


def send_one_part_each(bulk: list, targets: list) -> bool:
    """Phase 1 of a catch-up: each store's next part (read now) over the wire; False once
    no part is left."""
    sent = False
    for i, (parts, target) in enumerate(zip(bulk, targets)):
        piece = next(parts, None)
        if piece is not None:
            _, keys, values = unpack_part(pack_part(i, *piece))
            target.install_part(keys, values)
            sent = True
    return sent


def test_the_runtime_finds_the_stores():
    ops = [VectorizedSessions(ttl=10), VectorizedStats(idle_ttl=10)]
    found = OperatorChain(ops).keyed_stores()
    assert found == [op.state for op in ops] and all(s is not None for s in found)
    assert [keyed_state_of(op) for op in ops] == found


@SLOW
@given(workload=workloads, seed=seeds, sizes=sizes, params=params, small=st.booleans(),
       marks=st.lists(st.sampled_from(["clear_dirty", "start_changes", "stop_tracking",
                                        "stop_changes", None, None]), min_size=1, max_size=8))
@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_the_same_batches_give_the_twins_deltas_and_changes(workload, seed, sizes, params,
                                                           small, marks):
    """Baselines set between batches at random, on both kinds: after every batch the
    vectorized store's net changes are the per-record ``KeyedState``'s, key for key."""
    pair = Pair(**params)
    with small_tables(small):
        for i, batch in enumerate(batches_of(workload, seed, sizes)):
            mark = marks[i % len(marks)]
            for store, twin in stores(pair):
                if mark is not None:
                    getattr(store, mark)(), getattr(twin, mark)()
            pair.feed(batch)
            for store, twin in stores(pair):
                assert store.tracking == twin.tracking
                assert store.records_changes == twin.records_changes
                if twin.tracking:
                    assert wire_form(store.delta()) == wire_form(twin.delta())
                if twin.records_changes:
                    assert wire_form(store.changes()) == wire_form(twin.changes())


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@SLOW
@given(workload=workloads, seed=seeds, sizes=sizes, params=params, at=st.integers(0, 6))
def test_a_snapshot_restored_goes_on_as_its_source(workload, seed, sizes, params, at):
    """A replica restored from the stores' snapshots (over msgpack) gives the twin's outputs
    for the batches after, and records the twin's changes since the restore."""
    batches = batches_of(workload, seed, sizes)
    pair = Pair(**params)
    for batch in batches[:at]:
        pair.feed(batch)
    replica = fresh_ops(params)
    for op, (store, _) in zip(replica, stores(pair)):
        keyed_state_of(op).restore(wire_form(store.snapshot()))
    rebuilt = go_on_with(twin_states(pair), replica, params)
    for store, twin in stores(rebuilt):
        store.start_changes(), twin.start_changes()
    for batch in batches[at:]:
        rebuilt.feed(batch)
        for store, twin in stores(rebuilt):
            assert wire_form(store.changes()) == wire_form(twin.changes())


@SLOW
@given(workload=workloads, seed=seeds, sizes=sizes, params=params, small=st.booleans(),
       at=st.integers(0, 4), during=st.integers(0, 5), part=st.integers(1, 40))
@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_replica_rebuilt_from_parts_and_a_delta_goes_on_as_its_source(
        workload, seed, sizes, params, small, at, during, part):
    """A catch-up's two phases: the parts taken while the source goes on with more batches
    (each part read as it is sent), then the delta of the keys changed since the parts
    began; the replica then holds the source's state and gives its outputs."""
    batches = batches_of(workload, seed, sizes)
    pair = Pair(**params)
    with small_tables(small):
        for batch in batches[:at]:
            pair.feed(batch)
        sources = [store for store, _ in stores(pair)]
        bulk = [store.parts(part) for store in sources]
        for store in sources:
            store.clear_dirty()
        replica = fresh_ops(params)
        targets = [keyed_state_of(op) for op in replica]
        for target in targets:
            target.restore(None)  # the standby drops what it had
        for batch in batches[at:at + during]:  # phase 1, the source goes on
            send_one_part_each(bulk, targets)
            pair.feed(batch)
        while send_one_part_each(bulk, targets):
            pass
        for source, target in zip(sources, targets):  # phase 2
            target.apply_delta(wire_form(source.delta()))
            source.stop_tracking()
            assert target.snapshot() == source.snapshot()
        rebuilt = go_on_with(twin_states(pair), replica, params)
        for batch in batches[at + during:]:
            pair.feed(batch)
            rebuilt.feed(batch)


@SLOW
@given(workload=workloads, seed=seeds, sizes=sizes, params=params, small=st.booleans(),
       every=st.integers(1, 3), full_every=st.integers(1, 4))
def test_a_checkpoint_chain_of_the_changes_restores_the_operators(
        workload, seed, sizes, params, small, every, full_every):
    """Checkpoints every ``every`` batches, whole once in ``full_every`` and otherwise the
    stores' changes since the one before (over msgpack, as stored): each chain rebuilds the
    state at its last checkpoint, and a replica restored from the last goes on as its
    source."""
    batches = batches_of(workload, seed, sizes)[:40]
    pair = Pair(**params)
    chain = OperatorChain([pair.vsessions, pair.vstats])
    snaps, last = [], None
    with small_tables(small):
        for i, batch in enumerate(batches):
            pair.feed(batch)
            if i % every:
                continue
            stores_now = chain.keyed_stores()
            if snaps and len(snaps) < full_every:
                snaps.append(wire_form(delta_snapshot(
                    i, snaps[-1]["checkpoint"], [None, None],
                    [[j, store.changes()] for j, store in enumerate(stores_now)])))
            else:
                snaps = [wire_form(full_snapshot(i, chain.get_state()))]
            for store in stores_now:
                store.start_changes()
            assert wire_form(rebuild(snaps)) == wire_form(chain.get_state())
            last = (list(snaps), chain.get_state(), twin_states(pair), i + 1)
        snaps, state, twins, after = last
        restored = OperatorChain(list(fresh_ops(params)))
        install(restored, snaps)
        assert restored.get_state() == state
        rebuilt = go_on_with(twins, tuple(restored.operators), params)
        for batch in batches[after:]:
            rebuilt.feed(batch)


def crossed(segment, k: int):
    """Checkpoint ``k`` made due at ``segment`` and snapshotted: its ``Snapshot``."""
    segment.cuts.learn((k, k))
    segment.fcons.frontier = lambda: (k + 1,)
    (snap,) = segment.snapshot()
    return snap


def test_an_incremental_checkpoint_after_a_batch_of_few_keys_holds_only_them():
    """The segments of the vectorized paper dataflow write their first checkpoint whole and
    the next, after a batch that touched three keys of thousands, as those keys alone;
    whole plus delta restore the operators, which go on as their source."""
    from flux.protocol.builder import MachineBuilder

    builder = MachineBuilder(vectorized_dataflow(session_ttl=10 ** 6), 1, capacity=8,
                             batch_size=4, full_every=4)
    segments = [builder.segment(Addr(stage, 0, S)) for stage in (1, 2)]
    ops = [segment.chain.operators[0] for segment in segments]
    packets = packet_workload(20_000, 7)
    for batch in cut(packets, [4096]):
        run_chain(ops, to_batch(batch, PACKET_SCHEMA))
    whole = [crossed(segment, 1) for segment in segments]
    assert [snap.base for snap in whole] == [None, None]
    (opened, (app, _)), (other, _) = [pair for pair in ops[0].get_state()
                                      if pair[0] != WATERMARK_KEY][:2]
    opened = [opened, other]
    ts = packets[-1][4] + 1
    few = [(*opened[0], "app0", "end", ts), (*opened[1], "app1", "start", ts + 1),
           (123_456, 7, "app2", "start", ts + 2)]
    rows, out = run_chain(ops, to_batch(few, PACKET_SCHEMA))
    assert len(rows) == 1  # one session closed: one stats key updated
    deltas = [crossed(segment, 2) for segment in segments]
    assert [snap.base for snap in deltas] == [1, 1]
    (_, sessions), = unpack_state(deltas[0].data)["changes"]
    (_, stats), = unpack_state(deltas[1].data)["changes"]
    assert sessions == wire_form({"set": [[WATERMARK_KEY, ops[0].state.watermark],
                                          [opened[1], ["app1", ts + 1]],
                                          [(123_456, 7), ["app2", ts + 2]]],
                                  "deleted": [opened[0]]})
    assert [key for key, _ in stats["set"]] == [[app, opened[0][0]]]
    assert stats["deleted"] == []
    for segment, op, full, delta in zip(segments, ops, whole, deltas):
        snaps = [unpack_state(full.data), unpack_state(delta.data)]
        assert wire_form(rebuild(snaps)) == wire_form([op.get_state()])
        fresh = builder.segment(segment.addr).chain
        install(fresh, snaps)
        assert fresh.get_state() == [op.get_state()]
        segment.chain = fresh  # the restored replica goes on as its source did
    more = packet_workload(3000, 8)
    restored = [segment.chain.operators[0] for segment in segments]
    for batch in cut(more, [1000]):
        source = run_chain(ops, to_batch(batch, PACKET_SCHEMA))
        again = run_chain(restored, to_batch(batch, PACKET_SCHEMA))
        assert source[0].tolist() == again[0].tolist() and source[1].equals(again[1])
    assert [op.get_state() for op in restored] == [op.get_state() for op in ops]


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_replica_of_the_vectorized_dataflow_catches_up_in_parts_through_a_kill():
    """On a running cluster: the rebuilt replicas install bulk parts and a delta, not a
    whole state, and the output is the per-record dataflow's."""
    records = packet_workload(12_000, seed=4, pairs=3000, apps=4, sources=40)
    cluster, _ = run(vectorized_dataflow(), records, partitions=2, kill="node1",
                     batch_rows=128)
    assert_exact_and_caught_up_in_parts(cluster, reference_output(paper_dataflow(), records, 2))


def test_the_speed_experiment_times_the_operators_checkpointed(tmp_path):
    import json

    from experiments import vectorized_operators

    assert vectorized_operators.main(["--inputs", "3000", "--batches", "512", "--rounds", "1",
                                      "--changes", "--checkpoint-every", "2",
                                      "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for mode in ("changes-512", "whole-512"):
        assert summary["us_per_input"][mode]["chain"]["median"] > 0
    assert summary["checkpoint_every"] == 2
