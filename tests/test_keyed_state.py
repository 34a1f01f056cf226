"""KeyedState (DESIGN 5): key order, normalised keys, dirty keys, snapshots, chunks and deltas."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux.keyed_state import DELETED, KeyedOperator, KeyedState, keyed_state_of
from flux.operator import KeyedAggregate, keyed_state, wire_form
from flux.testing.counter import KeyedCounter
from flux.examples.sessions import SessionReconstruction
from flux.examples.stats import WindowedDurationStats


def test_dict_like_access():
    s = KeyedState()
    s["b"] = 2
    s["a"] = 1
    assert s["a"] == 1 and s.get("b") == 2 and s.get("zz") is None and s.get("zz", 0) == 0
    assert "a" in s and "zz" not in s and len(s) == 2 and s
    assert s.setdefault("c", 3) == 3 and s.setdefault("c", 9) == 3
    assert s.pop("c") == 3 and s.pop("c", None) is None
    del s["b"]
    assert list(s) == ["a"] and not KeyedState()
    with pytest.raises(KeyError):
        s["zz"]  # noqa: B018
    with pytest.raises(KeyError):
        del s["zz"]
    with pytest.raises(KeyError):
        s.pop("zz")


def test_iteration_is_in_key_order_and_the_order_is_cached_until_a_key_changes():
    s = KeyedState()
    for key in (3, 1, 2):
        s[key] = str(key)
    assert s.keys() == [1, 2, 3] and s.items() == [(1, "1"), (2, "2"), (3, "3")]
    order = s.keys()
    s[2] = "two"  # a new value, no new key: the order stands
    assert s.keys() is order and s.values() == ["1", "two", "3"]
    s[0] = "0"
    assert s.keys() == [0, 1, 2, 3]
    s.pop(1)
    assert s.keys() == [0, 2, 3]


def test_mixed_type_keys_are_ordered_by_msgpack_bytes_like_keyed_state():
    table = {1: "x", "a": "y", (2, 3): "z", 0: "w"}
    s = KeyedState()
    for key, value in table.items():
        s[key] = value
    assert s.snapshot() == keyed_state(table)


def test_list_keys_are_the_same_key_as_tuples():
    s = KeyedState()
    s[[1, [2, 3]]] = "v"
    assert s[(1, (2, 3))] == "v" and [1, [2, 3]] in s and s.get([1, [2, 3]]) == "v"
    s[(1, (2, 3))] = "w"
    assert len(s) == 1 and s.keys() == [(1, (2, 3))]
    assert s.pop([1, [2, 3]]) == "w" and len(s) == 0


def test_dirty_keys_are_tracked_from_clear_dirty_with_deletions_as_tombstones():
    s = KeyedState()
    assert not s.tracking
    with pytest.raises(RuntimeError, match="clear_dirty"):
        s.dirty()
    s["a"], s["b"], s["c"] = 1, 2, 3
    s.clear_dirty()
    assert s.tracking and s.dirty() == []
    s["b"] = 20                  # changed
    del s["c"]                   # deleted: was there at the baseline
    s["d"] = 4                   # created
    s["e"] = 5
    del s["e"]                   # created and deleted since: no net change
    s["c"] = 30
    del s["c"]                   # re-created and deleted again: still deleted
    assert s.dirty() == [("b", 20), ("c", DELETED), ("d", 4)]
    assert s.dirty_keys() == ["b", "c", "d"]
    assert s.delta() == {"set": [["b", 20], ["d", 4]], "deleted": ["c"]}
    s.clear_dirty()
    assert s.delta() == {"set": [], "deleted": []}
    s.stop_tracking()
    s["x"] = 1
    assert not s.tracking


def test_a_store_tracking_from_creation_reports_every_live_key():
    s = KeyedState(track_dirty=True)
    s[2], s[1], s[3] = "b", "a", "c"
    del s[3]
    assert s.delta() == {"set": [[1, "a"], [2, "b"]], "deleted": []}


def test_snapshot_chunks_restore_and_install_chunk_round_trip_through_msgpack():
    s = KeyedState()
    for i in range(10):
        s[(i % 3, i)] = [i, "v"]
    snap = s.snapshot()
    assert snap == keyed_state({key: value for key, value in s.items()})
    chunks = list(s.chunks(4))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert [pair for chunk in chunks for pair in chunk] == snap

    restored = KeyedState()
    restored.restore(wire_form(snap))
    assert restored == s and restored.snapshot() == snap

    received = KeyedState()
    for chunk in chunks:
        received.install_chunk(wire_form(chunk))
    assert received == s and received.snapshot() == snap
    with pytest.raises(ValueError):
        s.chunks(0)


def test_chunks_are_a_snapshot_taken_when_called():
    s = KeyedState()
    for i in range(6):
        s[i] = i
    pieces = s.chunks(2)
    s.clear_dirty()
    s[0] = "changed"
    del s[5]
    s[9] = 9
    assert [pair for chunk in pieces for pair in chunk] == [[i, i] for i in range(6)]


def test_two_phase_move_chunks_then_delta():
    sender = KeyedState()
    for i in range(20):
        sender[("k", i)] = i
    pieces = sender.chunks(7)  # t0
    sender.clear_dirty()
    receiver = KeyedState(track_dirty=True)
    for i, piece in enumerate(pieces):
        receiver.install_chunk(wire_form(piece))
        sender[("k", i)] = -i      # the partition keeps processing meanwhile
        sender.pop(("k", 19 - i), None)
        sender[("new", i)] = i
    receiver.apply_delta(wire_form(sender.delta()))
    assert receiver == sender and receiver.snapshot() == sender.snapshot()
    assert receiver.dirty() == []  # after apply, nothing is dirty


def test_restore_and_apply_delta_leave_nothing_dirty_and_decode_values():
    s = KeyedState(decode=tuple)
    s.clear_dirty()
    s["x"] = ("a", 1)
    s.restore([["k", ["a", 1]]])
    assert s["k"] == ("a", 1) and s.dirty() == []
    s["y"] = ("b", 2)
    s.apply_delta({"set": [["z", ["c", 3]]], "deleted": ["k"]})
    assert s.items() == [("y", ("b", 2)), ("z", ("c", 3))] and s.dirty() == []
    s.restore(None)
    assert len(s) == 0


def test_keyed_operator_gets_state_methods_and_the_framework_finds_the_store():
    class Last(KeyedOperator):
        def __init__(self):
            self.state = KeyedState()

        def process(self, record):
            self.state[record[0]] = record[1]
            return []

    op = Last()
    op.process(("b", 1))
    op.process(("a", 2))
    assert op.get_state() == [["a", 2], ["b", 1]]
    copy = Last()
    copy.install_state(wire_form(op.get_state()))
    assert copy.state == op.state and keyed_state_of(op) is op.state
    for lib_op in (SessionReconstruction(), WindowedDurationStats(), KeyedCounter(),
                   KeyedAggregate(key=lambda r: r, fold=lambda old, r: r)):
        assert isinstance(keyed_state_of(lib_op), KeyedState), type(lib_op).__name__
    assert keyed_state_of(object()) is None


# --- property: a KeyedState is a dict in key order, and snapshot + delta rebuild it ---

KEYS = st.one_of(st.integers(-5, 5), st.tuples(st.integers(0, 3), st.integers(0, 3)))
VALUES = st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=3),
                   st.lists(st.integers(-100, 100), max_size=3))  # msgpack-safe
OPS = st.lists(st.tuples(st.sampled_from(["set", "del"]), KEYS, VALUES), max_size=60)


def apply_ops(store, table, ops, as_lists=False):
    """The same operations on both; the store may get the keys as msgpack gives them (lists)."""
    for op, key, value in ops:
        store_key = wire_form(key) if as_lists else key
        if op == "set":
            store[store_key] = value
            table[key] = value
        else:
            assert store.pop(store_key, "absent") == table.pop(key, "absent")


@settings(max_examples=200, deadline=None)
@given(before=OPS, after=OPS, as_lists=st.booleans(), chunk=st.integers(1, 8))
def test_matches_a_dict_and_snapshot_plus_delta_rebuilds_the_state(before, after, as_lists, chunk):
    store, table = KeyedState(), {}
    apply_ops(store, table, before)
    snapshot_t0 = wire_form(store.snapshot())
    chunks_t0 = [wire_form(c) for c in store.chunks(chunk)]
    store.clear_dirty()  # t0
    apply_ops(store, table, after, as_lists)

    assert store.snapshot() == keyed_state(table)
    assert store.items() == [(key, value) for key, value in keyed_state(table)]
    assert len(store) == len(table) and all(key in store for key in table)

    delta = wire_form(store.delta())
    rebuilt = KeyedState()
    rebuilt.restore(snapshot_t0)
    rebuilt.apply_delta(delta)
    assert rebuilt == store and wire_form(rebuilt.snapshot()) == wire_form(store.snapshot())

    streamed = KeyedState()
    for piece in chunks_t0:
        streamed.install_chunk(piece)
    streamed.apply_delta(delta)
    assert streamed == store


@settings(max_examples=200, deadline=None)
@given(before=OPS, during=st.lists(OPS, max_size=4), as_lists=st.booleans(),
       size=st.integers(1, 8))
def test_parts_read_while_the_store_changes_plus_the_delta_rebuild_it(before, during, as_lists,
                                                                       size):
    """Catch-up's phase 1: parts are not a snapshot, the partition goes on
    changing the store between them; the delta of everything since the call fixes it."""
    from flux.state_codec import pack_part, unpack_part

    store, table = KeyedState(), {}
    apply_ops(store, table, before)
    pieces = store.parts(size)
    store.clear_dirty()  # t0, with the call
    received = KeyedState()
    for ops in during + [[]] * 20:  # keeps changing while parts go, then drains the rest
        piece = next(pieces, None)
        if piece is not None:
            received.install_part(*unpack_part(pack_part(0, *piece))[1:])
        apply_ops(store, table, ops, as_lists)
    received.apply_delta(wire_form(store.delta()))
    assert received == store and wire_form(received.snapshot()) == wire_form(keyed_state(table))


def test_a_part_is_keys_then_values_and_its_keys_come_back_hashable():
    from flux.state_codec import StateCodecError, pack_part, unpack_part

    index, keys, values = unpack_part(pack_part(3, [("a", 1), 7], [[1, (2, 3)], "x"]))
    assert (index, keys, values) == (3, (("a", 1), 7), [[1, [2, 3]], "x"])
    s = KeyedState()
    s.install_part(keys, values)
    assert s[("a", 1)] == [1, [2, 3]] and s[7] == "x"
    s.install_part([["b", 2]], [0])  # lists as keys still work (the slow path)
    assert s[("b", 2)] == 0
    with pytest.raises(ValueError):
        s.install_part([1, 2], [1])
    for bad in (b"", b"\x93\x01\x02\x03", msgpack.packb([1, b"\x91\x01", b"\x90"])):
        with pytest.raises(StateCodecError):
            unpack_part(bad)


def test_every_method_of_the_one_class_it_was_is_still_keyed_states():
    """KeyedState is split into its access, its change records and its transfers
    (flux.keyed_changes, flux.keyed_transfer): users and the runtime still see one class."""
    documented = {
        "get", "pop", "setdefault", "expire", "keys", "items", "values", "decode",
        "__getitem__", "__setitem__", "__delitem__", "__contains__", "__len__", "__bool__",
        "__iter__", "__eq__", "__repr__",
        "tracking", "dirty", "dirty_keys", "clear_dirty", "stop_tracking", "delta",
        "records_changes", "start_changes", "changes", "stop_changes",
        "snapshot", "chunks", "parts", "restore", "install_chunk", "install_part", "apply_delta"}
    assert documented <= set(dir(KeyedState))
    s = KeyedState([[["a", 1], 1]], track_dirty=True)
    s.start_changes()
    s[("b", 2)] = 2
    assert s.delta() == s.changes() == {"set": [[("b", 2), 2]], "deleted": []}
    assert repr(s) == "KeyedState(2 keys, 1 dirty, 1 changed since a checkpoint)"
