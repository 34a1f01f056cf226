"""Incremental checkpoints of ``KeyedState`` (DESIGN 10, docs/design/checkpoints.md): a replica's
snapshots are a whole one and then the changes since, the chain rebuilds exactly the state
at each cut, every file a restore reads stays in the store, and a gap in a chain makes the
next snapshot whole instead of a checkpoint that cannot be restored."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.checkpoints import CheckpointCoordinator
from flux.addresses import Addr, P, S
from flux.control_messages import SnapshotWritten
from flux.effects import Snapshot
from flux.keyed_state import KeyedState
from flux.operator import keyed_state, wire_form
from flux.runtime.checkpoint_service import CheckpointService
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.snapshot_writer import SnapshotWriter
from flux.sim.schedule import OK, VIOLATION, SimParams, format_trace, run_schedule
from flux.sim.__main__ import crash_window
from flux.snapshot_chain import BrokenChain, delta_snapshot, full_snapshot, rebuild

pytestmark = pytest.mark.timeout(300)

KEYS = st.one_of(st.integers(-5, 5), st.tuples(st.integers(0, 3), st.integers(0, 3)))
OPS = st.lists(st.tuples(st.sampled_from(["set", "del"]), KEYS, st.integers(0, 9)),
               max_size=30)


def apply_ops(store, table, ops):
    for op, key, value in ops:
        if op == "set":
            store[key] = table[key] = value
        else:
            assert store.pop(key, "absent") == table.pop(key, "absent")


# -- the store's record of changes since a checkpoint ------------------------------------

def test_the_changes_since_a_checkpoint_are_kept_apart_from_a_catch_ups_dirty_keys():
    store = KeyedState([[1, "a"], [2, "b"], [3, "c"]])
    assert not store.records_changes
    with pytest.raises(RuntimeError, match="start_changes"):
        store.changes()
    store.start_changes()
    store[1] = "A"
    store.clear_dirty()  # a catch-up starts: its own baseline
    del store[2]
    store[4] = "d"
    store[5] = "e"
    del store[5]  # created and deleted since the checkpoint: no change
    assert store.changes() == {"set": [[1, "A"], [4, "d"]], "deleted": [2]}
    assert store.delta() == {"set": [[4, "d"]], "deleted": [2]}
    store.stop_tracking()  # the catch-up ends; the checkpoint's record goes on
    store[3] = "C"
    assert store.changes()["set"] == [[1, "A"], [3, "C"], [4, "d"]]
    store.install_part([9], ["z"])  # state from elsewhere: no checkpoint baseline holds
    assert not store.records_changes


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=6), st.integers(1, 4))
def test_a_chain_of_a_whole_snapshot_and_deltas_rebuilds_the_state_at_every_checkpoint(
        rounds, full_every):
    """The segment's rule in small: a whole snapshot, then the changes since the last
    one, whole again every ``full_every``; each chain, through msgpack, rebuilds the
    state at its checkpoint."""
    store, table, chain = KeyedState(), {}, []
    for k, ops in enumerate(rounds, 1):
        apply_ops(store, table, ops)
        if chain and len(chain) < full_every:
            snap = delta_snapshot(k, k - 1, [None, "whole %d" % k], [[0, store.changes()]])
            chain.append(snap)
        else:
            chain = [full_snapshot(k, [store.snapshot(), "whole %d" % k])]
        store.start_changes()
        wired = [msgpack.unpackb(msgpack.packb(s), strict_map_key=False) for s in chain]
        ops_state = rebuild(wired)
        assert wire_form(ops_state[0]) == wire_form(keyed_state(table))
        assert ops_state[1] == "whole %d" % k


def test_a_chain_with_a_gap_or_out_of_order_is_refused():
    whole = full_snapshot(1, [[[1, 1]]])
    d2 = delta_snapshot(2, 1, [None], [[0, {"set": [[2, 2]], "deleted": []}]])
    d3 = delta_snapshot(3, 2, [None], [[0, {"set": [], "deleted": [1]}]])
    assert rebuild([whole, d2, d3]) == [[[2, 2]]]
    with pytest.raises(BrokenChain, match="over checkpoint 2, the chain is at 1"):
        rebuild([whole, d3])
    with pytest.raises(BrokenChain, match="starts with a delta"):
        rebuild([d2, d3])
    with pytest.raises(BrokenChain, match="inside a chain"):
        rebuild([whole, whole])


# -- a segment's snapshots -----------------------------------------------------------------

def segment_with_counter(full_every: int):
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import counting_dataflow

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4,
                             full_every=full_every)
    return builder.segment(Addr(1, 0, S))


def crossed(seg, k: int, n: int):
    """Make checkpoint ``k`` (cut ``n``) due at ``seg`` and snapshot it."""
    seg.cuts.learn((k, n))
    seg.fcons.frontier = lambda: (n + 1,)
    return seg


def test_a_segment_writes_whole_then_deltas_and_whole_again_after_a_gap():
    seg = segment_with_counter(full_every=3)
    counter = seg.chain.operators[0]
    kinds = []
    for k in range(1, 8):
        counter.process(("key%d" % k, k))
        if k == 5:
            seg.snapshot_lost()  # the write of checkpoint 4 failed
        (snap,) = crossed(seg, k, k).snapshot(keep=(k != 3))
        kinds.append("skip" if snap.data is None else ("delta" if snap.base else "whole"))
    # whole, delta, crossed by its twin, whole, delta (over 4)... lost: whole, delta
    assert kinds == ["whole", "delta", "skip", "whole", "whole", "delta", "delta"]


# -- the runtime: the writer, the store, the service ---------------------------------------

def write_all(writer, snaps):
    for snap in snaps:
        writer.write(snap)
    writer.stop()
    return writer.done()


def test_the_writer_reports_each_chain_and_refuses_a_delta_over_what_it_did_not_write(tmp_path):
    store = CheckpointStore(str(tmp_path))
    (tmp_path / "ckpt-0000000004").write_text("a file where the folder should be")
    a, b = Addr(1, 0, S), Addr(1, 1, S)
    done = write_all(SnapshotWriter(store, "r"), [
        Snapshot(1, 10, a, b"whole"), Snapshot(2, 20, a, b"d2", base=1),
        Snapshot(3, 30, a, b"d3", base=2),
        Snapshot(2, 20, b, b"d", base=1),  # b never wrote checkpoint 1
        Snapshot(4, 40, a, b"d4", base=3),  # cannot be written
        Snapshot(5, 50, a, b"d5", base=4),  # over the one that failed
        Snapshot(6, 60, a, b"whole6")])
    name = "stage1-part0-S-r.state"
    assert [d.chain for d in done if d.addr == a and not d.error] == [
        ((1, name),), ((1, name), (2, name)), ((1, name), (2, name), (3, name)), ((6, name),)]
    errors = {(d.addr.partition, d.number): d.error for d in done if d.error}
    assert "did not write" in errors[1, 2] and "did not write" in errors[0, 5]
    assert errors[0, 4]


def test_the_writer_writes_whole_when_its_chain_lost_a_file(tmp_path):
    store = CheckpointStore(str(tmp_path))
    a = Addr(1, 0, P)
    writer = SnapshotWriter(store)
    writer.write(Snapshot(1, 10, a, b"whole"))
    while not writer.done():
        pass
    store.fs.rm(store._dir(1), recursive=True)  # pruned while this replica was quiet
    (done,) = write_all(writer, [Snapshot(2, 20, a, b"d2", base=1)])
    assert "lost the files of checkpoints [1]" in done.error


def complete_checkpoints(tmp_path, keep, chains_by_k):
    """A service that completes checkpoints of one partition, written as ``chains_by_k``
    says (checkpoint -> the chain of the snapshot that counts)."""
    store = CheckpointStore(str(tmp_path), keep=keep)
    service = CheckpointService(store, CheckpointCoordinator(1, 1, "fp"))
    try:
        for k, chain in chains_by_k.items():
            service.cut_chosen(k, 10 * k, k)
            for j, name in chain:
                if not store.exists(j, name):
                    store.write(j, name, b"%d" % j)
            service.snapshot_written(SnapshotWritten(k, Addr(1, 0, S), chain[-1][1], 1, 0.0,
                                                     chain=tuple(chain)))
            service.sink_committed(k, None)
            service.settle()
    finally:
        service.stop()
    assert not service.errors, service.errors
    return store


def test_pruning_keeps_every_folder_a_kept_chain_reads(tmp_path):
    f = "stage1-part0-S.state"
    store = complete_checkpoints(tmp_path, keep=2, chains_by_k={
        1: [(1, f)], 2: [(1, f), (2, f)], 3: [(1, f), (2, f), (3, f)], 4: [(4, f)],
        5: [(4, f), (5, f)], 6: [(4, f), (5, f), (6, f)]})
    assert store.ids() == [4, 5, 6]  # 4 is older than the last two, but 5 and 6 read it
    manifest = store.latest("fp", 1)
    assert manifest["chains"] == [[[4, f], [5, f], [6, f]]]
    assert store.read_part(manifest, 1, 0) == [b"4", b"5", b"6"]


def test_a_manifest_without_chains_still_reads_its_one_file(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.write(3, "a.state", b"old")
    store.complete(3, {"fingerprint": "fp", "partitions": 1, "files": ["a.state"]})
    assert store.read_part(store.latest(), 1, 0) == [b"old"]


def write_checkpoints(seg, store, numbers) -> dict:
    """Checkpoints ``numbers`` of a job of one stage and two partitions, as the runtime
    makes them: ``seg`` (partition 0, counting three records a checkpoint) snapshots at
    each cut, partition 1 writes an empty state, the node's writer writes, the driver's
    service completes them. Returns partition 0's operator state at each checkpoint."""
    from flux.state_codec import pack_state

    counter = seg.chain.operators[0]
    writer = SnapshotWriter(store)
    service = CheckpointService(store, CheckpointCoordinator(1, 2, "fp"))
    states = {}
    try:
        for k in numbers:
            for record in [("a", k), ("b", k), ("c%d" % k, k)]:
                counter.process(record)
            (snap,) = crossed(seg, k, k).snapshot()
            states[k] = seg.chain.get_state()
            writer.write(snap)
            service.cut_chosen(k, k, k)
            service.sink_committed(k, None)
            writer.write(Snapshot(k, k, Addr(1, 1, S), pack_state(full_snapshot(k, [[]]))))
        writer.stop()
        for written in writer.done():
            assert not written.error, written.error
            service.snapshot_written(written)
        service.settle()
    finally:
        service.stop()
    assert service.latest.number == numbers[-1]
    return states


def test_restore_rebuilds_each_partition_from_its_chain(tmp_path):
    """What a node does at a restart (flux.runtime.restore.restore_operators) over a
    store holding a whole snapshot and deltas."""
    from flux.runtime.restore import restore_operators

    seg = segment_with_counter(full_every=4)
    store = CheckpointStore(str(tmp_path))
    write_checkpoints(seg, store, (1, 2, 3))
    assert len(store.latest()["chains"][0]) == 3  # whole, delta, delta
    fresh = segment_with_counter(full_every=4)
    restore_operators(store, 3, {Addr(1, 0, P): fresh})
    assert fresh.chain.get_state() == seg.chain.get_state()


# -- the simulator ------------------------------------------------------------------------

def test_quick_incremental_checkpoints_through_crashes_and_restarts():
    params = SimParams(checkpoints=3, crashes=2, standbys=1, restarts=1, full_every=3)
    window = crash_window(params)
    deltas = 0
    for seed in range(1, 9):
        r = run_schedule(seed, params, window)
        assert r.status == OK, f"seed {seed}: {r.reason}\n{format_trace(r, last=20)}"
        deltas += r.snapshot_deltas
    assert deltas > 0


def test_a_delta_that_forgets_a_change_is_caught():
    params = SimParams(checkpoints=3, variant="forgotten-change", full_every=3)
    window = crash_window(params)
    assert any(run_schedule(seed, params, window).status == VIOLATION for seed in range(1, 11))


def test_pruning_keeps_what_a_replica_still_writing_builds_on_though_its_twin_counted(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=1)
    service = CheckpointService(store, CheckpointCoordinator(1, 1, "fp"))
    p_file, s_file = "stage1-part0-P.state", "stage1-part0-S.state"
    s_chain = ()
    try:
        for k in (1, 2, 3):
            service.cut_chosen(k, k, k)
            service.sink_committed(k, None)
            store.write(k, p_file, b"P")  # P (S thought dead a while) reports first
            service.snapshot_written(SnapshotWritten(k, Addr(1, 0, P), p_file, 1, 0.0,
                                                     chain=((k, p_file),)))
            s_chain += ((k, s_file),)
            store.write(k, s_file, b"S")
            service.snapshot_written(SnapshotWritten(k, Addr(1, 0, S), s_file, 1, 0.0,
                                                     chain=s_chain))
            service.settle()
    finally:
        service.stop()
    assert store.latest()["chains"] == [[[3, p_file]]]
    assert store.ids() == [1, 2, 3]  # S's next delta reads all three
