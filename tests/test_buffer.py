"""Property tests for flux/protocol/buffer.py against a naive model of the paper's marks.

The model (``MarksModel``) follows section 3.1.3 of the Flux paper literally:
it keeps an explicit set of marks (PROD, PRIM, SEC) for every SN of a small
finite universe, applies a cumulative ack to every SN at or below it
(produced or not, i.e. dangling), and evicts a produced SN once its marks hold
PROD plus every destination in ``delete``. It knows nothing about high-water
marks; the real ``Buffer`` is compared with it after every step.
"""
from __future__ import annotations

from itertools import product

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from flux.protocol.buffer import DESTS, PRIM, PROD, SEC, Buffer, BufferMisuse
from flux.sequence import NO_SN

OTHER = {PRIM: SEC, SEC: PRIM}

# Small SN universes: one-component (ingress), two-component (outputs of
# inputs), and mixed lengths (all SNs are compared lexicographically).
UNIVERSES = {
    "flat": [(i,) for i in range(1, 13)],
    "pairs": [(i, k) for i, k in product(range(1, 5), range(1, 4))],
    "mixed": sorted([(i,) for i in range(1, 5)] + [(i, k) for i in range(1, 5) for k in (1, 2)]),
}


def item_of(sn):
    return ("tuple", sn)


class ModelMisuse(Exception):
    pass


class MarksModel:
    """Explicit per-SN marks over a finite universe (paper 3.1.3, 3.2.2, 3.3.2)."""

    def __init__(self, universe, capacity, delete):
        self.universe = sorted(universe)
        self.capacity = capacity
        self.delete = set(delete)
        # marks[sn] is a set of marks, or None once sn was evicted (gone for good).
        self.marks = {sn: set() for sn in self.universe}
        self.items = {}
        self.produced = []  # SNs put, in order
        self.sent = {PRIM: None, SEC: None}  # last SN sent to d (None: nothing)

    # -- helpers -------------------------------------------------------
    def last_put(self):
        return self.produced[-1] if self.produced else None

    def is_produced(self, sn):
        return sn in self.produced

    def is_skipped(self, sn):
        """Never put, and can no longer be put (SNs increase)."""
        last = self.last_put()
        return not self.is_produced(sn) and last is not None and sn < last

    def is_future(self, sn):
        """Not put yet but may still be put."""
        last = self.last_put()
        return last is None or sn > last

    def live(self):
        return [sn for sn in self.universe if self.marks[sn] is not None and PROD in self.marks[sn]]

    def evict(self):
        needed = {PROD} | self.delete
        for sn in self.universe:
            m = self.marks[sn]
            if m is not None and needed <= m:
                self.marks[sn] = None
                del self.items[sn]

    # -- operations ----------------------------------------------------
    def put(self, sn, item):
        last = self.last_put()
        if last is not None and sn <= last:
            raise ModelMisuse
        self.produced.append(sn)
        self.marks[sn].add(PROD)
        self.items[sn] = item
        self.evict()

    def ack(self, sn, d):
        for u in self.universe:
            if u <= sn and self.marks[u] is not None:
                self.marks[u].add(d)
        self.evict()

    def ack_all(self, d):
        for u in self.universe:
            m = self.marks[u]
            if m is None:
                continue
            if PROD in m:
                m.add(d)
            else:
                m.discard(d)
        self.evict()

    def reset(self, d):
        o = OTHER[d]
        for u in self.universe:
            m = self.marks[u]
            if m is None:
                continue
            if o in m:
                m.add(d)
            else:
                m.discard(d)
        self.sent[d] = None
        self.evict()

    def set_delete(self, delete):
        self.delete = set(delete)
        self.evict()

    def peek(self, d):
        for sn in self.live():
            if d in self.marks[sn]:
                continue
            if self.sent[d] is not None and sn <= self.sent[d]:
                continue
            return sn
        return None

    def advance(self, d):
        sn = self.peek(d)
        if sn is None:
            raise ModelMisuse
        self.sent[d] = sn
        return sn

    def take(self, d, n):
        out = []
        while len(out) < n:
            sn = self.peek(d)
            if sn is None:
                break
            self.advance(d)
            out.append((sn, self.items[sn]))
        return out

    def dangling(self, d):
        return any(
            self.marks[u] is not None and d in self.marks[u] and self.is_future(u)
            for u in self.universe
        )

    def expected_marks(self, sn):
        m = self.marks[sn]
        return None if m is None else frozenset(m)


dest_st = st.sampled_from(DESTS)
delete_st = st.sampled_from([frozenset(), frozenset({PRIM}), frozenset({SEC}), frozenset({PRIM, SEC})])


class BufferVsModel(RuleBasedStateMachine):
    """Drives the real Buffer and the marks model side by side."""

    @initialize(
        universe=st.sampled_from(sorted(UNIVERSES)),
        capacity=st.integers(1, 6),
        delete=delete_st,
        compact_at=st.sampled_from([1, 2, 3, Buffer._COMPACT_AT]),
        skipping=st.booleans(),
    )
    def setup(self, universe, capacity, delete, compact_at, skipping):
        self.universe = UNIVERSES[universe]
        self.skipping = skipping
        self.buffer = Buffer(capacity, delete)
        # Exercise the list compaction path with small thresholds.
        self.buffer._COMPACT_AT = compact_at
        self.model = MarksModel(self.universe, capacity, delete)

    def remaining(self):
        last = self.model.last_put()
        return [sn for sn in self.universe if last is None or sn > last]

    # -- rules ---------------------------------------------------------
    @precondition(lambda self: self.remaining())
    @rule(data=st.data())
    def put_next(self, data):
        rest = self.remaining()
        if self.skipping:
            # Strictly increasing, but may skip SNs (an input with no output).
            sn = rest[data.draw(st.integers(0, min(2, len(rest) - 1)), label="skip")]
        else:
            sn = rest[0]
        self.model.put(sn, item_of(sn))
        self.buffer.put(sn, item_of(sn))

    @rule(data=st.data())
    def put_non_increasing(self, data):
        last = self.model.last_put()
        stale = [NO_SN] + [sn for sn in self.universe if last is not None and sn <= last]
        sn = data.draw(st.sampled_from(stale), label="stale")
        with pytest.raises(BufferMisuse):
            self.buffer.put(sn, item_of(sn))

    @rule(data=st.data(), d=dest_st)
    def ack(self, data, d):
        sn = data.draw(st.sampled_from([NO_SN] + self.universe), label="ack_sn")
        self.model.ack(sn, d)
        self.buffer.ack(sn, d)

    @rule(d=dest_st)
    def ack_all(self, d):
        self.model.ack_all(d)
        self.buffer.ack_all(d)

    @rule(d=dest_st)
    def reset(self, d):
        self.model.reset(d)
        self.buffer.reset(d)

    @rule(d=dest_st)
    def advance(self, d):
        expected = self.model.peek(d)
        if expected is None:
            with pytest.raises(BufferMisuse):
                self.buffer.advance(d)
        else:
            assert self.buffer.advance(d) == expected
            self.model.advance(d)

    @rule(d=dest_st, n=st.integers(0, 5))
    def take(self, d, n):
        expected = self.model.take(d, n)
        assert list(self.buffer.take(d, n)) == expected

    @rule(delete=delete_st)
    def set_delete(self, delete):
        self.model.set_delete(delete)
        self.buffer.set_delete(delete)

    # -- checks --------------------------------------------------------
    @invariant()
    def agrees_with_model(self):
        b, m = self.buffer, self.model
        b.check_invariants()
        live = m.live()
        assert len(b) == len(live)
        assert b.entries() == [(sn, m.items[sn]) for sn in live]
        assert b.full() == (len(live) >= m.capacity)
        for d in DESTS:
            exp = m.peek(d)
            assert b.first_unsent(d) == exp, f"first_unsent({d})"
            assert b.peek(d) == (None if exp is None else (exp, item_of(exp))), f"peek({d})"
            assert b.dangling(d) == m.dangling(d), f"dangling({d})"
        for sn in self.universe:
            got = b.marks(sn)
            if m.is_skipped(sn):
                # Never put and never puttable: it is not an entry of the buffer.
                assert got is None or PROD not in got, sn
                continue
            assert got == m.expected_marks(sn), f"marks({sn})"


BufferVsModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBufferVsModel = BufferVsModel.TestCase


# -- named examples ------------------------------------------------------

def test_duplicate_filter_dangling_sec_ack_skips_and_evicts_on_put():
    b = Buffer(10, delete={PRIM, SEC})
    b.ack((2,), SEC)  # SEC got (1,) and (2,) from the other replica
    assert b.dangling(SEC) and not b.dangling(PRIM)
    assert b.marks((2,)) == frozenset({SEC})
    b.put((1,), "a")
    b.put((2,), "b")
    b.put((3,), "c")
    # SEC never gets (1,) or (2,) again; PRIM still needs everything.
    assert b.peek(SEC) == ((3,), "c")
    assert b.peek(PRIM) == ((1,), "a")
    assert b.marks((1,)) == frozenset({PROD, SEC})
    assert len(b) == 3
    assert list(b.take(SEC, 10)) == [((3,), "c")]
    assert b.peek(SEC) is None
    # PRIM now holds (1,),(2,): they carry all three marks and go.
    b.ack((2,), PRIM)
    assert b.entries() == [((3,), "c")]
    assert b.marks((1,)) is None and b.marks((2,)) is None
    b.check_invariants()


def test_duplicate_filter_put_of_sn_held_by_both_is_evicted_at_once():
    b = Buffer(10, delete={PRIM, SEC})
    b.ack((2,), PRIM)
    b.ack((3,), SEC)
    for i in (1, 2):
        b.put((i,), i)
        assert len(b) == 0, f"({i},) has PROD, PRIM, SEC: must be evicted on put"
        assert b.peek(SEC) is None and b.peek(PRIM) is None
        assert b.marks((i,)) is None
    b.put((3,), 3)  # SEC holds it, PRIM does not: kept, only PRIM gets it
    assert b.entries() == [((3,), 3)]
    assert b.peek(SEC) is None
    assert b.peek(PRIM) == ((3,), 3)
    assert not b.dangling(SEC) and not b.dangling(PRIM)
    b.check_invariants()


def test_eviction_needs_every_mark_in_delete():
    b = Buffer(10, delete={PRIM, SEC})
    b.put((1,), "a")
    b.ack((1,), PRIM)
    assert b.entries() == [((1,), "a")]
    assert b.marks((1,)) == frozenset({PROD, PRIM})
    b.ack((1,), SEC)
    assert b.entries() == []
    assert b.marks((1,)) is None
    # A later ack does not resurrect an evicted SN.
    b.ack((1,), PRIM)
    assert b.marks((1,)) is None

    b = Buffer(10, delete={PRIM})
    b.put((1,), "a")
    b.ack((1,), SEC)  # SEC is not in delete: no eviction
    assert b.entries() == [((1,), "a")]
    b.ack((1,), PRIM)
    assert b.entries() == []

    b = Buffer(10, delete={PRIM, SEC})
    b.put((1,), "a")
    b.put((2,), "b")
    b.set_delete(set())  # only PROD needed: everything produced goes
    assert len(b) == 0
    b.put((3,), "c")
    assert len(b) == 0
    b.check_invariants()


def test_ack_all_marks_produced_and_drops_dangling_acks_of_that_dest():
    b = Buffer(10, delete={PRIM, SEC})
    b.put((1,), "a")
    b.put((2,), "b")
    b.ack((5,), SEC)
    b.ack((4,), PRIM)
    assert b.dangling(SEC)
    assert b.marks((4,)) == frozenset({PRIM, SEC})
    b.ack_all(SEC)
    assert not b.dangling(SEC)
    assert b.dangling(PRIM)  # PRIM's dangling acks are untouched
    assert b.marks((4,)) == frozenset({PRIM})
    assert b.marks((5,)) == frozenset()
    # (1,),(2,) had PRIM and now SEC too: evicted.
    assert len(b) == 0
    b.set_delete({PRIM})
    b.put((3,), "c")  # PRIM acked (3,) already: evicted at once
    assert len(b) == 0
    b.put((5,), "e")
    assert b.entries() == [((5,), "e")]
    assert b.marks((5,)) == frozenset({PROD})  # SEC's dangling (5,) is gone
    assert b.peek(SEC) == ((5,), "e")
    b.check_invariants()


def test_ack_all_is_an_assignment_not_a_max():
    b = Buffer(10, delete={PRIM})
    b.put((1,), "a")
    b.ack((3,), SEC)
    b.ack_all(SEC)
    b.put((2,), "b")
    b.put((3,), "c")
    assert b.marks((2,)) == frozenset({PROD})
    assert b.first_unsent(SEC) == (2,)


def test_reset_moves_the_cursor_backwards():
    b = Buffer(10, delete={PRIM, SEC})
    for i in range(1, 5):
        b.put((i,), i)
    assert [sn for sn, _ in b.take(SEC, 10)] == [(1,), (2,), (3,), (4,)]
    assert b.peek(SEC) is None
    b.ack((1,), PRIM)
    b.reset(SEC)  # SEC gets PRIM's marks: (1,) goes, SEC restarts at (2,)
    assert b.marks((1,)) is None
    assert b.first_unsent(SEC) == (2,)
    assert b.peek(SEC) == ((2,), 2)


def test_reset_moves_marks_backwards_at_fold_in():
    # Ingress after take-over: SEC was dead (delete = {PRIM}), a standby folds in.
    b = Buffer(10, delete={PRIM, SEC})
    for i in range(1, 5):
        b.put((i,), i)
    b.ack((4,), SEC)  # the old SEC acked everything before it died
    b.ack_all(SEC)
    b.set_delete({PRIM})
    b.ack((2,), PRIM)
    assert b.entries() == [((3,), 3), ((4,), 4)]
    b.reset(SEC)
    b.set_delete({PRIM, SEC})
    assert b.marks((3,)) == frozenset({PROD})  # the new SEC holds only the checkpoint
    assert b.peek(SEC) == ((3,), 3)
    assert b.peek(PRIM) == ((3,), 3)
    b.check_invariants()


def test_full_respects_capacity():
    b = Buffer(2, delete={PRIM})
    assert not b.full()
    b.put((1,), 1)
    assert not b.full()
    b.put((2,), 2)
    assert b.full()
    b.ack((1,), PRIM)
    assert not b.full()
    b.ack((1,), SEC)
    assert not b.full()
    with pytest.raises(ValueError):
        Buffer(0)


def test_put_of_non_increasing_sn_raises():
    b = Buffer(5)
    b.put((2,), "x")
    for bad in [(2,), (1,), (1, 9), NO_SN]:
        with pytest.raises(BufferMisuse):
            b.put(bad, "y")
    assert b.entries() == [((2,), "x")]
    b.put((2, 1), "z")  # (2,1) > (2,)
    assert b.entries() == [((2,), "x"), ((2, 1), "z")]
    b.check_invariants()


def test_advance_with_nothing_to_send_raises():
    b = Buffer(5)
    with pytest.raises(BufferMisuse):
        b.advance(PRIM)
    b.put((1,), 1)
    assert b.advance(PRIM) == (1,)
    with pytest.raises(BufferMisuse):
        b.advance(PRIM)
    assert b.advance(SEC) == (1,)


# --- state movement (5.3): the buffer travels as msgpack and installs reversed ---

def _moved(buffer, reverse):
    import msgpack

    state = msgpack.unpackb(msgpack.packb(buffer.to_state(), use_bin_type=True), raw=False)
    return Buffer.from_state(state, buffer.capacity, reverse=reverse)


def _sample_buffer():
    b = Buffer(8)
    for n in range(1, 6):
        b.put((n, 1), f"t{n}")
    b.take(PRIM, 3)            # sent (1,1)..(3,1) to PRIM
    b.ack((2, 1), PRIM)
    b.ack((1, 1), SEC)         # (1,1) now has every mark: evicted
    b.ack((7, 1), SEC)         # dangling ack from SEC... then a lower one is ignored
    return b


def test_state_round_trip_keeps_entries_marks_and_cursors():
    b = _sample_buffer()
    copy = _moved(b, reverse=False)
    copy.check_invariants()
    assert copy.entries() == b.entries()
    assert (copy.hwm, copy.sent, copy.delete, copy.last_put) == (b.hwm, b.sent, b.delete, b.last_put)
    for d in DESTS:
        assert copy.peek(d) == b.peek(d)


def test_reversed_install_swaps_marks_and_cursors():
    b = _sample_buffer()
    b.set_delete({PRIM})
    r = _moved(b, reverse=True)
    r.check_invariants()
    assert r.hwm == [b.hwm[SEC], b.hwm[PRIM]]
    assert r.sent == [b.sent[SEC], b.sent[PRIM]]
    assert r.delete == {SEC}
    for sn, _ in b.entries():
        swapped = {({PRIM: SEC, SEC: PRIM}.get(m, m)) for m in b.marks(sn)}
        assert r.marks(sn) == frozenset(swapped)
    assert r.peek(SEC) == b.peek(PRIM)


def test_rewind_restarts_the_cursor_after_what_the_destination_holds():
    b = Buffer(8)
    for n in range(1, 5):
        b.put((n,), n)
    b.take(SEC, 3)
    b.ack((1,), SEC)
    b.rewind(SEC)
    assert b.peek(SEC) == ((2,), 2)


def test_buffer_misuse_is_a_local_protocol_error():
    from flux.errors import LocalProtocolError
    assert issubclass(BufferMisuse, LocalProtocolError)


def test_the_same_tuples_taken_for_both_destinations_are_one_object():
    """A batch sent to both replicas of a pair is encoded once: the second take
    of the same range returns the first's tuples; any other range is taken afresh."""
    b = Buffer(8)
    for n in (1, 2, 3):
        b.put((n,), f"r{n}")
    first = b.take(PRIM, 2)
    assert b.take(SEC, 2) is first and list(first) == [((1,), "r1"), ((2,), "r2")]
    b.put((4,), "r4")
    assert list(b.take(PRIM, 5)) == [((3,), "r3"), ((4,), "r4")]
    assert list(b.take(SEC, 5)) == [((3,), "r3"), ((4,), "r4")]
