"""Exact transitions of a segment (flux/protocol/segment.py; DESIGN 4.1 numbering, 4.3 bounds,
11 items: a segment processes an item whole and sends one sub-item per consumer partition
that gets rows, under the connection SN ``item + (its partition,)``)."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM
from flux.control_messages import TakeoverDone
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Send
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.ingress import INGRESS
from flux.operator import Map, OperatorChain
from flux.protocol.segment import Segment
from flux.sequence import covers
from items import by, inputs, plain, rows


class Chain:
    """Emits, for a record r: nothing if r < 0, else [r, r + 1] (or [r] when single)."""

    columnar = False  # operators on records

    def keyed_stores(self):
        return []  # no KeyedState: state moves whole

    def __init__(self, single=False):
        self.single = single
        self.seen = []

    def process(self, record):
        self.seen.append(record)
        if isinstance(record, int) and record < 0:
            return []
        return [record] if self.single else [record, record + 1]

    def process_many(self, records):
        return [self.process(r) for r in records]


def entries(seg, i):
    """Consumer partition i's buffer: (connection SN, the sub-item's pairs) per sub-item."""
    return plain(seg.fprod.out.buffers[i].entries())


# Stage 1 of 2, partition 0, replica P; it routes outputs by parity.
X = Addr(1, 0, P)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)


def stage_one(capacity=8, batch_size=16):
    fcons = FluxConsumer(X, [(INGRESS, INGRESS)])
    fprod = FluxProducer(X, [(C0P, C0S), (C1P, C1S)], capacity, batch_size)
    return Segment(X, fcons, Chain(), fprod, by(lambda out: out % 2))


def item(x, first, *records):
    """The ingress's sub-item for item ``x``: inputs numbered from ``first``."""
    return ((x, 0), inputs(first, *records))


def test_batch_is_acked_and_queued():
    seg = stage_one()
    assert seg.idle()
    assert seg.on_message(INGRESS, Batch((item(2, 1, 10, 20),), (4,))) == [
        Send(X, INGRESS, Ack((2, 0)))
    ]
    assert not seg.idle()
    assert seg.can_process()


def test_process_numbers_outputs_and_routes_them():
    seg = stage_one()
    seg.on_message(INGRESS, Batch((item(2, 1, 10, 20), item(3, 3, 30)), (4,)))
    # one call takes the whole item: both of its inputs
    assert seg.process() == 4
    assert seg.chain.seen == [10, 20]
    # the k-th output of row s is s + (k,); one sub-item per partition, SN (item, 0)
    assert entries(seg, 0) == [((2, 0), (((1, 1), 10), ((2, 1), 20)))]
    assert entries(seg, 1) == [((2, 0), (((1, 2), 11), ((2, 2), 21)))]
    assert seg.process() == 2
    assert entries(seg, 0) == [((2, 0), (((1, 1), 10), ((2, 1), 20))), ((3, 0), (((3, 1), 30),))]
    assert entries(seg, 1) == [((2, 0), (((1, 2), 11), ((2, 2), 21))), ((3, 0), (((3, 2), 31),))]
    assert (seg.taken, seg.emitted) == (3, 6)  # rows taken, outputs made
    assert not seg.can_process()  # nothing left to release
    with pytest.raises(LocalProtocolError):  # the driver asks can_process first
        seg.process()


def test_process_of_an_input_without_outputs():
    seg = stage_one()
    seg.on_message(INGRESS, Batch((item(1, 1, -5),), (1,)))
    assert seg.process() == 0
    assert all(len(b) == 0 for b in seg.fprod.out.buffers)
    # The item is still accounted for in the bound.
    assert plain(seg.flush(1, PRIM)) == [Send(X, C1P, Batch((), (1,)))]
    # An item whose outputs all go to partition 0: partition 1 gets only the bound.
    seg.router = by(lambda out: 0)
    seg.on_message(INGRESS, Batch((item(3, 2, 4, 6),), (3,)))
    assert seg.process() == 4
    assert entries(seg, 0) == [((3, 0), (((2, 1), 4), ((2, 2), 5), ((3, 1), 6), ((3, 2), 7)))]
    assert entries(seg, 1) == []
    assert plain(seg.flush(1, PRIM)) == [Send(X, C1P, Batch((), (3,)))]


def test_flush_bound_values():
    seg = stage_one()
    assert seg.flushable() == []  # nothing known yet: bound (0,)
    seg.on_message(INGRESS, Batch((item(1, 1, 10), item(2, 2, 20)), (4,)))
    # item 1 is still queued: the bound (0,) promises nothing new.
    assert seg.output_bound() == (0,)
    assert seg.flushable() == []
    seg.process()
    # item 2 is still queued: the bound is (1,).
    assert plain(seg.flush(0, PRIM)) == [Send(X, C0P, Batch((((1, 0), (((1, 1), 10),)),), (1,)))]
    seg.process()
    # The merge is empty: the ingress's bound (4,) is the frontier.
    assert plain(seg.flush(0, PRIM)) == [Send(X, C0P, Batch((((2, 0), (((2, 1), 20),)),), (4,)))]
    assert plain(seg.flush(1, PRIM)) == [
        Send(X, C1P, Batch((((1, 0), (((1, 2), 11),)), ((2, 0), (((2, 2), 21),))), (4,)))
    ]
    assert seg.flushable() == []
    assert seg.flush(0, PRIM) == []
    assert seg.on_message(INGRESS, Batch((), (6,))) == []
    assert plain(seg.flush(0, PRIM)) == [Send(X, C0P, Batch((), (6,)))]


def test_bound_is_below_an_unsent_output():
    seg = stage_one(batch_size=1)
    seg.on_message(INGRESS, Batch((item(1, 1, 10),), (1,)))
    seg.on_message(INGRESS, Batch((item(3, 2, 20, 30),), (3,)))
    seg.process()
    seg.process()
    [first] = plain(seg.flush(0, PRIM))
    assert first == Send(X, C0P, Batch((((1, 0), (((1, 1), 10),)),), (3, -1)))
    assert not covers(first.msg.bound, (3, 0))  # the sub-item still unsent
    assert plain(seg.flush(0, PRIM)) == [
        Send(X, C0P, Batch((((3, 0), (((2, 1), 20), ((3, 1), 30))),), (3,)))]


def test_can_process_false_when_a_buffer_is_full():
    seg = stage_one(capacity=1)  # a sub-item per buffer, whatever its rows
    seg.on_message(INGRESS, Batch((item(2, 1, 10, 12), item(3, 3, 30)), (3,)))
    seg.process()  # fills both buffers (one sub-item of two rows each)
    assert [len(b) for b in seg.fprod.out.buffers] == [1, 1]
    assert seg.fcons.merge.ready()
    assert not seg.can_process()
    seg.flush(0, PRIM)
    seg.on_message(C0S, Ack((2, 0)))
    assert len(seg.fprod.out.buffers[0]) == 0
    assert not seg.can_process()  # partition 1's buffer is still full
    seg.flush(1, PRIM)
    assert seg.on_message(C1S, Ack((2, 0))) == []
    assert seg.can_process()
    assert seg.process_ready(8) == 1  # item 3, then no more
    assert entries(seg, 0) == [((3, 0), (((3, 1), 30),))]


def test_process_ready_processes_whole_items_while_the_guard_holds():
    seg = stage_one(capacity=2)
    seg.on_message(INGRESS, Batch(tuple(item(x, x, 10 * x) for x in range(1, 6)), (5,)))
    assert seg.process_ready(1) == 1  # at most the limit
    assert seg.process_ready(8) == 1  # then a buffer is full: the guard stops it
    assert not seg.can_process() and seg.fcons.merge.ready()
    assert [sn for sn, _ in entries(seg, 0)] == [(1, 0), (2, 0)]
    assert (seg.taken, seg.emitted) == (2, 4)
    assert seg.process_ready(8) == 0


def test_messages_are_dispatched_and_unexpected_ones_raise():
    seg = stage_one()
    with pytest.raises(RemoteProtocolError):
        seg.on_message(C0P, Ack((1, 0)))  # acks come from the secondaries only
    with pytest.raises(RemoteProtocolError):
        seg.on_message(INGRESS, "hello")
    seg.on_fail({Addr(1, 0, S)})
    assert seg.on_message(C0S, Reverse(())) == []
    assert seg.fprod.r_done == [True, False]
    assert seg.on_message(C1S, Reverse(())) == [TakeoverDone(X)]


# --- last stage: several producers, output to the egress ---------------------------------

Y = Addr(2, 0, P)
A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)
EG, GHOST = Addr(3, 0, P), Addr(3, 0, S)


def stage_two():
    fcons = FluxConsumer(Y, [(A0P, A0S), (A1P, A1S)])
    fprod = FluxProducer(Y, [(EG, GHOST)], 8, 16, absent={GHOST})
    return Segment(Y, fcons, Chain(single=True), fprod, by(lambda out: 0))


def test_last_stage_merges_by_sn_and_bounds_by_the_merge_frontier():
    seg = stage_two()
    # input 1's outputs at stage 1 went to both partitions: rows (1, 1) and (1, 3) to
    # partition 0, (1, 2) to partition 1; each sends its sub-item of item 1
    assert seg.on_message(A0P, Batch((((1, 0), rows(((1, 1), "a"), ((1, 3), "c"))),
                                      ((3, 0), rows(((3, 1), "d")))), (3,))) == [
        Send(Y, A0S, Ack((3, 0)))
    ]
    assert not seg.can_process()  # partition 1 may still send its part of item 1
    assert seg.flushable() == []
    assert seg.on_message(A1P, Batch((((1, 1), rows(((1, 2), "b"))),), (2,))) == [
        Send(Y, A1S, Ack((1, 1)))
    ]
    assert seg.can_process()
    assert seg.process() == 3  # item 1 whole: its parts merged by row SN
    assert seg.chain.seen == ["a", "b", "c"]
    assert not seg.can_process()  # item 3 waits for partition 1's bound to reach (3,)
    # Frontier: weakest of before((3, 0)) and partition 1's bound (2,): item bound (2,).
    assert plain(seg.flush(0, PRIM)) == [Send(Y, EG, Batch(
        (((1, 0), (((1, 1, 1), "a"), ((1, 2, 1), "b"), ((1, 3, 1), "c"))),), (2,)))]
    assert seg.fprod.out.buffers[0].entries() == []  # S-Prod^P: dropped once sent
    seg.on_message(A1P, Batch((), (5,)))
    seg.process()
    # Partition 0: its bound (3,); partition 1: (5,).
    assert plain(seg.flush(0, PRIM)) == [
        Send(Y, EG, Batch((((3, 0), (((3, 1, 1), "d"),)),), (3,)))]


def test_on_fail_returns_consumer_then_producer_effects():
    seg = stage_two()
    seg.on_message(A0P, Batch((((1, 0), rows(((1, 1), "a"))),), (1,)))
    assert seg.on_fail({A0P, Addr(2, 0, S)}) == [
        Send(Y, A0S, Reverse((1, 0))),
        TakeoverDone(Y),
    ]
    assert seg.fcons.p_fail and seg.fprod.p_fail


class Parser:
    """An operator with a bug: it cannot take negative records."""

    def process(self, record):
        if record < 0:
            raise ValueError(f"cannot parse {record}")
        return [record]

    def get_state(self):
        return None

    def install_state(self, state):
        pass


def test_an_operator_that_raises_is_named_with_its_stage_partition_and_item():
    seg = stage_one()
    seg.chain = OperatorChain([Parser()])
    seg.on_message(INGRESS, Batch((item(1, 1, 4), item(3, 2, 5, -3)), (3,)))
    assert seg.process() == 1
    with pytest.raises(OperatorError) as raised:
        seg.process()
    err = raised.value
    # the record it raised on, by its SN: the item's second row, input 3
    assert (err.what, err.stage, err.partition, err.sn) == ("operator Parser", 1, 0, (3,))
    assert str(err) == ("operator Parser failed in stage 1, partition 0, on the record with "
                        "sequence number (3,): ValueError: cannot parse -3")
    # nothing of the failed item was buffered
    assert [sn for b in seg.fprod.out.buffers for sn, _ in b.entries()] == [(1, 0)]


def test_the_second_operator_of_a_chain_is_the_one_named():
    seg = stage_one()
    seg.chain = OperatorChain([Map(lambda r: r - 10), Parser()])
    seg.on_message(INGRESS, Batch((item(1, 1, 4),), (1,)))
    with pytest.raises(OperatorError, match=r"operator Parser failed in stage 1, partition 0, "
                                            r"on the record with sequence number \(1,\)"):
        seg.process()


def test_a_partition_key_that_raises_is_reported_as_such():
    seg = stage_one()
    seg.router = by(lambda out: hash(out))  # lists are unhashable
    seg.chain = OperatorChain([Map(lambda r: [r])])
    seg.on_message(INGRESS, Batch((item(7, 7, 4),), (7,)))
    # named by the output's row SN: the first output of input (7,)
    with pytest.raises(OperatorError, match=r"the partition key of the next stage failed in "
                                            r"stage 1, partition 0, on the record with sequence "
                                            r"number \(7, 1\): TypeError: unhashable type"):
        seg.process()
    assert all(len(b) == 0 for b in seg.fprod.out.buffers)  # nothing half-put


def test_segments_take_the_chains_built_ahead_before_building_their_own():
    """A standby builds its operators while it waits (the check when it loads the
    dataflow), not while a catch-up waits for it."""
    from flux.protocol.builder import MachineBuilder
    from flux.dataflow import Dataflow, Stage

    built = []

    class Counted(Map):
        def __init__(self):
            super().__init__(lambda r: r)
            built.append(self)

    dataflow = Dataflow([Stage("one", key=lambda r: r, operators=(Counted,))])
    ahead = dataflow.stages[0].build_chain()
    builder = MachineBuilder(dataflow, 2, capacity=8, batch_size=4, spare_chains={1: [ahead]})
    before = len(built)
    first = builder.standby_segment(Addr(1, 0, S))
    assert first.chain is ahead and len(built) == before  # nothing built while catch-up waits
    second = builder.segment(Addr(1, 1, P))
    assert second.chain is not ahead and len(built) == before + 1  # spares used up: fresh
