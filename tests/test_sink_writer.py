"""Exact transitions of a sink's writer and of the last stage that feeds it
(flux/protocol/sink_writer.py; docs/design/parallel_io.md): the writer acks nothing on
receipt and both replicas at its sink's commits, so both keep every output the sink may
still lose; its reverse lets the survivor evict only what was committed; a writer
started again elsewhere resumes from the sink's last output; a view that moves it makes
the last stage wait for its reverse and tell it bounds and cuts anew."""
from __future__ import annotations

import pytest

from exchange.wire import decode, encode
from flux.addresses import Addr, P, S
from flux.control_messages import View, WriterMove
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Deliver, SinkCommit, Send
from flux.envelope import Envelope
from flux.protocol.buffer import PRIM, SEC
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.links import ACK, SEND
from flux.protocol.sink_writer import SinkWriter
from items import rows

pytestmark = pytest.mark.timeout(60)

# One stage of two partitions; partition 1's writer is stage 2, partition 1.
W = Addr(2, 1, P)
GHOST = Addr(2, 1, S)
LP, LS = Addr(1, 1, P), Addr(1, 1, S)


def sub(x, *recs):
    """Partition 1's sub-item of item x, rows ``(row SN, record)``."""
    return ((x, 1), rows(*recs))


def replica(addr):
    """A last-stage replica feeding the writer (the ghost never exists)."""
    pair = (W, GHOST)
    return FluxProducer(addr, [pair], capacity=8, batch_size=4, absent={GHOST},
                        to_writer=True)


def test_both_replicas_keep_what_the_writer_has_not_acked():
    p, s = replica(LP), replica(LS)
    assert p.out.links[0][PRIM].modes == SEND | ACK  # P sends to the writer, and hears its acks
    assert s.out.links[0][SEC].modes == ACK
    for f in (p, s):
        f.out.put(0, (1, 1), "a")
        f.out.put(0, (2, 1), "b")
    sent = p.out.flush(0, PRIM, (2,))
    assert [sn for sn, _ in sent.msg.items] == [(1, 1), (2, 1)]
    assert len(p.out.buffers[0]) == 2  # sent, not evicted: the sink has not committed
    p.out.on_ack(W, Ack((1, 1)))
    s.out.on_ack(W, Ack((1, 1)))
    assert len(p.out.buffers[0]) == 1 and len(s.out.buffers[0]) == 1


def test_the_writer_acks_at_commits_only_and_both_replicas():
    w = SinkWriter(1, 2, partition=1, commit_every=2)
    effects = w.on_message(LP, Batch((sub(1, ((1, 1), "a")),), (1,)))
    assert Deliver((((1, 1), "a"),), 1) in effects
    assert not [e for e in effects if isinstance(e, Send) and isinstance(e.msg, Ack)]
    effects = w.on_message(LP, Batch((sub(2, ((2, 1), "b")),), (2,)))
    assert effects[-1] == SinkCommit(0, 0, 1, (2, 1))  # two items: commit_every
    assert w.committed() == [Send(W, LP, Ack((2, 1), 0)), Send(W, LS, Ack((2, 1), 0))]
    assert w.committed() == []  # nothing new


def test_a_reverse_lets_the_survivor_evict_only_what_was_committed():
    w = SinkWriter(1, 2, partition=1, commit_every=5)
    w.on_message(LP, Batch((sub(1, ((1, 1), "a")),), (1,)))
    w.on_message(LP, Batch((sub(2, ((2, 1), "b")),), (2,)))
    w.commit_now()
    w.committed()  # the sink committed item 1 and 2
    w.on_message(LP, Batch((sub(3, ((3, 1), "c")),), (3,)))
    [reverse] = w.on_fail({LP})
    assert reverse == Send(W, LS, Reverse((2, 1), (3, 1)))

    s = replica(LS)
    for x in (1, 2, 3, 4):
        s.out.put(0, (x, 1), f"r{x}")
    s.out.on_ack(W, Ack((2, 1)))
    s.on_reverse(W, reverse.msg)
    assert [sn for sn, _ in s.out.buffers[0].entries()] == [(3, 1), (4, 1)]  # 3 is kept
    sent = s.out.flush(0, SEC, (4,))
    assert [sn for sn, _ in sent.msg.items] == [(4, 1)]  # and not sent again
    assert s.out.links[0][SEC].modes == SEND | ACK


def test_a_writer_started_again_resumes_from_the_sinks_last_output():
    w = SinkWriter(1, 2, partition=1, commit_every=4)
    # the sink's last committed output came from input 7 (in item 7 or a later one)
    assert w.resume((7, 1, 2), dead={LP}) == [Send(W, LS, Reverse((6, 1), (6, 1)))]
    assert w.settled() == 6
    # the committed item comes again if it was numbered above 7: the sink drops its
    # outputs (none above its last); nothing at or below (6, 1) may come any more
    assert w.on_message(LS, Batch((sub(8, ((7, 1, 2), "old"), ((8, 1, 1), "new")),), (8,)))[0] \
        == Deliver((((7, 1, 2), "old"), ((8, 1, 1), "new")), 1)
    assert SinkWriter(1, 2, partition=1, commit_every=4).resume(None, dead=set()) == \
        [Send(W, LP, Reverse((), ()))]


def test_a_moved_writer_is_not_sent_to_until_its_reverse_and_hears_bounds_anew():
    p = replica(LP)
    for x in (1, 2, 3):
        p.out.put(0, (x, 1), f"r{x}")
    p.out.flush(0, PRIM, (3,))
    p.out.on_ack(W, Ack((1, 1)))
    p.on_writer_moved(W)
    link = p.out.links[0][PRIM]
    assert link.modes == ACK and not p.out.flushable((3,))
    p.on_reverse(W, Reverse((1, 1), (1, 1)))  # the new writer: the sink has item 1
    sent = p.out.flush(0, PRIM, (3,))
    assert [sn for sn, _ in sent.msg.items] == [(2, 1), (3, 1)] and sent.msg.bound == (3,)


def test_a_writer_move_crosses_the_wire():
    view = View(4, frozenset({LP}), frozenset({3}), (), (WriterMove(W, 7, "node2"),))
    env = Envelope(Addr(0, 0, P), Addr(0, 0, P), 4, view, 1, None)
    assert decode(encode(env)).msg == view
    rev = Envelope(W, LS, 4, Reverse((2, 1), (3, 1)), 1, None)
    assert decode(encode(rev)).msg == Reverse((2, 1), (3, 1))
