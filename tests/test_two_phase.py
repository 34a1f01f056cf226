"""Two-phase catch-up at the segments (docs/design/catchup.md, DESIGN 9): exact effects.

Phase 1 (STREAMING): at sm_ready the active snapshots its keyed stores, tracks
their changes, and hands the snapshot to the mover in parts while it goes on
processing; the new replica installs each part. Phase 2: the pause and drain of
5.3.1, then only the changes since the snapshot, the other operators, the
buffers and the merge. Names as in tests/test_catchup_transitions.py: M is the
active stage 2 replica, MX the new one, A* the producers, D* the consumers.
"""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.control_messages import Avail, TakeoverDone
from flux.data_messages import Batch, CSync, Pause, PauseAck, Reverse
from flux.effects import Send, SourcesPaused, StateInstalled
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.host import Host
from flux.keyed_state import KeyedState
from flux.operator import Map, OperatorChain, wire_form
from flux.testing.counter import KeyedCounter
from flux.protocol.segment import (
    AWAITING_STATE,
    DRAINING,
    MOVING,
    PROCESSING,
    STREAMING,
    CatchUp,
    Segment,
)
from flux.sequence import NO_SN
from flux.state_codec import pack_part, unpack_state
from statemover.messages import (
    CancelTransfer,
    RequestRecv,
    RequestSend,
    SendPart,
    SendState,
    StatePart,
    TransferFailed,
)
from items import by, rows

A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)
PRODUCERS = [(A0P, A0S), (A1P, A1S)]
M, MX = Addr(2, 0, P), Addr(2, 0, S)
D0P, D0S = Addr(3, 0, P), Addr(3, 0, S)
D1P, D1S = Addr(3, 1, P), Addr(3, 1, S)
DOWN = [(D0P, D0S), (D1P, D1S)]
AVAIL = Avail(MX, 30, 5, "standby0", "node0")
TRANSFER = (2, 0, 5)


class Tally:
    """An operator with state of its own (no KeyedState): it moves whole, in phase 2."""

    def __init__(self):
        self.n = 0

    def process(self, record):
        self.n += 1
        return [record]

    def get_state(self):
        return [self.n]

    def install_state(self, state):
        self.n = state[0]


def chain():
    return OperatorChain([KeyedCounter(), Tally(), Map(lambda r: r)])


def segment(addr=M, mode=PROCESSING, bulk_pairs=2, per_step=True):
    seg = Segment(addr, FluxConsumer(addr, PRODUCERS), chain(), FluxProducer(addr, DOWN, 1000, 4),
                  by(lambda out: out[1] % 2), mode)
    seg.bulk_pairs, seg.bulk_per_step = bulk_pairs, per_step
    return seg


def feed(seg, first, keys):
    """Item n = first + len(keys) - 1 from A0P: rows (first, 1), (first + 1, 1), ... (A1P
    only moves its bound past it), processed. Returns the next item's first row."""
    n = first + len(keys) - 1
    sub = rows(*(((first + i, 1), (k, i)) for i, k in enumerate(keys)))
    seg.on_message(A0P, Batch((((n, 0), sub),), (n,)))
    seg.on_message(A1P, Batch((), (n,)))
    while seg.can_process():
        seg.process()
    return n + 1


def plain(entries):
    """Buffer entries as ``(connection SN, pairs)``: Rows compare by identity."""
    return [(sn, sub.pairs()) for sn, sub in entries]


def store(seg) -> KeyedState:
    return seg.chain.operators[0].state


def started(**kw):
    """M took over from its dead dual MX, holds keys a..e, and asked its mover to send."""
    seg = segment(**kw)
    nxt = feed(seg, 1, ["a", "b", "c", "d", "e", "a"])
    seg.on_fail({MX})
    seg.on_message(D0S, Reverse(NO_SN))
    assert seg.on_message(D1S, Reverse(NO_SN)) == [TakeoverDone(M)]
    assert seg.on_avail(AVAIL, "sm@sb") == [RequestSend(TRANSFER, "sm@sb")]
    return seg, nxt


def part(i, pairs, transfer=TRANSFER):
    return SendPart(transfer, pack_part(i, [k for k, _ in pairs], [v for _, v in pairs]))


PAUSES = [Send(M, A0P, Pause(5)), Send(M, A1P, Pause(5)), SourcesPaused(TRANSFER)]


def test_phase_one_streams_the_snapshot_part_by_part_while_processing():
    seg, nxt = started()
    assert seg.sm_ready() == []  # one part per step: nothing yet, nothing paused
    assert seg.mode == STREAMING and seg.has_part()
    assert store(seg).tracking and store(seg).dirty() == []
    assert seg.send_part() == [part(0, [["a", 2], ["b", 1]])]
    # still processing: takes data, processes, flushes, as in PROCESSING
    assert seg.ready_for(A0P, Batch((), (nxt,)))
    nxt = feed(seg, nxt, ["a", "f"])
    assert store(seg).dirty_keys() == ["a", "f"]
    assert seg.flushable() != []
    # the keys are those of sm_ready: f=1 is not among them (a=3 went before: the delta)
    assert seg.send_part() == [part(0, [["c", 1], ["d", 1]])]
    assert seg.mode == STREAMING
    assert seg.send_part() == [part(0, [["e", 1]])]  # the last part
    assert seg.mode == STREAMING and not seg.has_part()
    assert seg.part_acked(0) == [] and seg.part_acked(1) == []
    # the new replica has every part: phase 2 begins, the distributed pause of 5.3.1
    assert seg.part_acked(2) == PAUSES
    assert seg.mode == DRAINING and not seg.has_part()
    with pytest.raises(LocalProtocolError):
        seg.send_part()
    assert seg.on_message(A0P, PauseAck(5)) == []
    [call] = seg.on_message(A1P, PauseAck(5))
    assert seg.mode == MOVING
    assert isinstance(call, SendState) and call.transfer == TRANSFER
    state = unpack_state(call.data)
    assert state["parts"] == 3
    assert state["deltas"] == [[0, {"set": [["a", 3], ["f", 1]], "deleted": []}]]
    assert state["operators"] == [None, [8], None]  # the Tally moves whole; Map has None
    assert state["fprod"] == wire_form(seg.fprod.get_state())
    assert state["fcons"] == wire_form(seg.fcons.get_state())
    assert store(seg).tracking  # until the attempt ends
    effects = seg.state_sent()
    assert seg.mode == PROCESSING and not store(seg).tracking
    seg.check_invariants()
    assert Send(M, A0P, CSync(5)) in effects


def test_without_the_part_step_sm_ready_hands_the_whole_bulk_over_at_once():
    seg, _ = started(per_step=False)
    assert seg.sm_ready() == [part(0, [["a", 2], ["b", 1]]), part(0, [["c", 1], ["d", 1]]),
                              part(0, [["e", 1]])]
    assert seg.part_acked(0) == seg.part_acked(1) == [] and seg.part_acked(2) == PAUSES
    assert seg.mode == DRAINING


def test_no_more_than_the_window_of_parts_is_in_flight():
    """The active never runs ahead of what the new replica has installed."""
    seg, _ = started()
    seg.part_window = 2
    seg.sm_ready()
    assert len(seg.send_part() + seg.send_part()) == 2
    assert not seg.has_part() and seg.mode == STREAMING  # a third part waits for an ack
    assert seg.part_acked(0) == [] and seg.has_part()


def test_an_empty_store_streams_nothing_and_pauses_at_once():
    seg = segment()
    seg.on_fail({MX})
    seg.on_message(D0S, Reverse(NO_SN))
    seg.on_message(D1S, Reverse(NO_SN))
    seg.on_avail(AVAIL, "sm@sb")
    assert seg.sm_ready() == PAUSES
    assert seg.mode == DRAINING
    seg.on_message(A0P, PauseAck(5))
    [call] = seg.on_message(A1P, PauseAck(5))
    state = unpack_state(call.data)
    assert state["parts"] == 0 and state["deltas"] == [[0, {"set": [], "deleted": []}]]


def stream(seg, between=lambda: None):
    """Phase 1 at the active, with a new replica that acknowledges each part as it
    arrives; ``between`` runs after each part sent. The calls."""
    calls, acked = [], 0
    while seg.mode is STREAMING:
        if seg.has_part():
            calls += seg.send_part()
            between()
        else:
            calls += seg.part_acked(acked)
            acked += 1
    return calls


def move(seg):
    """Phase 1 and 2 at the active, with inputs processed between parts; the calls."""
    calls = list(seg.sm_ready())
    nxt = [7]

    def more():
        nxt[0] = feed(seg, nxt[0], ["a", "z"])

    calls += stream(seg, more)
    calls += seg.on_message(A0P, PauseAck(5)) + seg.on_message(A1P, PauseAck(5))
    return calls


def standby():
    x = segment(MX, AWAITING_STATE)
    assert x.expect_state(CatchUp(5, "sm@node0")) == [RequestRecv(TRANSFER, "sm@node0")]
    return x


def test_the_new_replica_installs_parts_then_the_delta_and_equals_the_active():
    seg, _ = started()
    calls = move(seg)
    parts = [c for c in calls if isinstance(c, SendPart)]
    [final] = [c for c in calls if isinstance(c, SendState)]
    x = standby()
    for i, c in enumerate(parts):
        assert x.state_part(i, c.data) == []
        assert x.mode == AWAITING_STATE  # takes nothing yet
        assert not x.ready_for(A0S, Batch((), (1,))) and not x.can_process()
    assert len(store(x)) == 5  # the snapshot: a..e
    effects = x.state_received(final.data)
    assert x.mode == PROCESSING
    assert wire_form(x.chain.get_state()) == wire_form(seg.chain.get_state())
    assert store(x).items() == store(seg).items() and store(x)["z"] == 3
    assert not store(x).tracking and x.parts_received == 0
    assert x.installed == {"parts": 3, "deltas": 1, "delta_keys": 2}
    assert Send(MX, A0P, CSync(5)) in effects
    for xb, ab in zip(x.fprod.out.buffers, seg.fprod.out.buffers):  # reversed as before
        assert xb.hwm == ab.hwm[::-1] and xb.sent == ab.sent[::-1]
        assert wire_form(plain(xb.entries())) == wire_form(plain(ab.entries()))


def test_a_deleted_key_is_deleted_at_the_new_replica():
    seg, _ = started()
    calls = list(seg.sm_ready())
    del store(seg)["b"]  # e.g. expiry by event time
    calls += stream(seg)
    calls += seg.on_message(A0P, PauseAck(5)) + seg.on_message(A1P, PauseAck(5))
    x = standby()
    for i, c in enumerate(c for c in calls if isinstance(c, SendPart)):
        x.state_part(i, c.data)
    assert "b" in store(x)
    x.state_received(calls[-1].data)
    assert "b" not in store(x) and store(x).items() == store(seg).items()


def test_the_new_replica_drops_what_its_constructor_put_in_its_stores():
    """An operator may fill its store when it is built (a reference table, Ballast); the
    active may have deleted some of it long before the catch-up: the new replica's state
    is the active's, not a merge with a fresh operator's."""
    seg, _ = started()
    calls = move(seg)
    x = segment(MX, AWAITING_STATE)
    store(x)["built-in"] = 1  # what a constructor put there; the active has no such key
    x.expect_state(CatchUp(5, "sm@node0"))
    for i, c in enumerate(c for c in calls if isinstance(c, SendPart)):
        x.state_part(i, c.data)
    x.state_received([c for c in calls if isinstance(c, SendState)][0].data)
    assert "built-in" not in store(x) and store(x).items() == store(seg).items()


def test_parts_out_of_order_or_missing_are_protocol_errors():
    seg, _ = started()
    calls = move(seg)
    parts = [c for c in calls if isinstance(c, SendPart)]
    x = standby()
    with pytest.raises(RemoteProtocolError):
        x.state_part(1, parts[1].data)
    x.state_part(0, parts[0].data)
    with pytest.raises(RemoteProtocolError):  # the active sent 3 parts, 1 arrived
        x.state_received(calls[-1].data)
    with pytest.raises(RemoteProtocolError):
        x.state_part(1, pack_part(1, ["k"], [1]))  # operator 1 has no keyed store
    with pytest.raises(LocalProtocolError):
        seg.state_part(0, parts[0].data)  # the active receives no parts


def test_abort_while_streaming_cancels_only_and_stops_tracking():
    seg, nxt = started()
    seg.sm_ready()
    seg.send_part()
    assert seg.on_fail({MX}) == [CancelTransfer(TRANSFER, "the standby is gone")]
    assert seg.mode == PROCESSING and seg.catchup is None
    assert not seg.has_part() and not store(seg).tracking  # no memory kept for it
    seg.check_invariants()
    store(seg).clear_dirty()  # as if an attempt had forgotten to stop tracking
    with pytest.raises(AssertionError, match="still track changes"):
        seg.check_invariants()  # the simulator checks this of every live segment at the end
    store(seg).stop_tracking()
    feed(seg, nxt, ["a"])  # processing goes on
    # the next attempt takes a fresh snapshot
    assert seg.on_avail(Avail(MX, 31, 6, "standby1", "node0"), "sm@sb1") == [
        RequestSend((2, 0, 6), "sm@sb1")]
    seg.bulk_pairs = 10
    assert seg.sm_ready() == []
    assert seg.send_part() == [part(0, [["a", 3], ["b", 1], ["c", 1], ["d", 1], ["e", 1]],
                                    (2, 0, 6))]
    assert seg.part_acked(0) == [
        Send(M, A0P, Pause(6)), Send(M, A1P, Pause(6)), SourcesPaused((2, 0, 6))]


@pytest.mark.parametrize("pause_acks", [0, 1, 2])
def test_abort_in_phase_two_stops_tracking(pause_acks):
    seg, _ = started()
    seg.sm_ready()
    stream(seg)
    for src in [A0P, A1P][:pause_acks]:
        seg.on_message(src, PauseAck(5))
    assert seg.mode == (MOVING if pause_acks == 2 else DRAINING)
    effects = seg.transfer_failed()
    assert effects[0] == CancelTransfer(TRANSFER, "the standby is gone")
    assert Send(M, A0P, CSync(5)) in effects  # resumes its sources, as before
    assert seg.mode == PROCESSING and not store(seg).tracking
    seg.check_invariants()


def test_a_failed_transfer_at_the_new_replica_drops_the_parts_it_holds():
    seg, _ = started()
    parts = [c for c in move(seg) if isinstance(c, SendPart)]
    x = standby()
    x.state_part(0, parts[0].data)
    assert x.transfer_failed() == [] and x.mode == AWAITING_STATE
    assert len(store(x)) == 0 and x.parts_received == 0


def test_the_pause_moves_only_the_delta_of_a_big_store():
    seg, nxt = started(bulk_pairs=4096)
    big = store(seg)
    for k in range(20000):
        big[f"key{k:06d}"] = k
    calls = list(seg.sm_ready())
    fed = [nxt]

    def more():
        fed[0] = feed(seg, fed[0], ["key000001", "new"])

    calls += stream(seg, more)
    calls += seg.on_message(A0P, PauseAck(5)) + seg.on_message(A1P, PauseAck(5))
    bulk = sum(len(c.data) for c in calls if isinstance(c, SendPart))
    [final] = [c for c in calls if isinstance(c, SendState)]
    assert len([c for c in calls if isinstance(c, SendPart)]) == 5
    assert bulk > 200_000
    assert len(final.data) * 50 < bulk  # the pause covers a few hundred bytes, not the bulk
    assert unpack_state(final.data)["deltas"] == [[0, {"set": [["key000001", 6], ["new", 5]],
                                                       "deleted": []}]]


def test_the_host_carries_parts_from_one_mover_to_the_other_segment():
    """Two hosts, their movers back to back: phase 1 and 2 through the real movers."""
    seg, _ = started()
    a = Host("node0", {M: seg}, inc=1, segment_factory=lambda addr: None, chunk_size=16)
    b = Host("standby0", {}, inc=2, segment_factory=lambda addr: segment(addr, AWAITING_STATE),
             chunk_size=16)
    x = b.machines[MX] = segment(MX, AWAITING_STATE)
    hosts = {a.mover_addr: a, b.mover_addr: b}
    pending = []

    def run(host, result):
        sends, others = result
        pending.extend(e for e in sends if e.dst in hosts)
        return others

    seg.catchup = CatchUp(5, b.mover_addr, started=True)
    run(a, a.run_local([RequestSend(TRANSFER, b.mover_addr)]))
    run(b, b.run_local(x.expect_state(CatchUp(5, a.mover_addr))))
    others, in_flight = [], 0
    while pending or seg.has_part():
        if pending:
            env = pending.pop(0)
            others += run(hosts[env.dst], hosts[env.dst].on_envelope(env))
        else:
            run(a, a.run_local(seg.send_part()))
        in_flight = max(in_flight, seg._parts_sent - seg._parts_acked)
        if seg.mode is DRAINING:  # the pause-acks of the paused sources
            run(a, a.run_local(seg.on_message(A0P, PauseAck(5))))
            run(a, a.run_local(seg.on_message(A1P, PauseAck(5))))
    assert x.mode == PROCESSING and seg.mode == PROCESSING
    assert store(x).items() == store(seg).items()
    assert x.installed["parts"] == 3
    assert not any(isinstance(e, TransferFailed) for e in others)
    assert 0 < in_flight <= seg.part_window


def test_the_host_drops_a_part_of_another_attempt():
    x = standby()
    h = Host("standby0", {MX: x}, inc=2, segment_factory=lambda addr: None)
    data = pack_part(0, ["a"], [1])
    assert h.run_local([StatePart((2, 0, 4), 0, data)]) == ([], [])  # an older version
    assert x.parts_received == 0 and len(store(x)) == 0
    # the current attempt's part is installed; its bytes are reported for the metrics
    assert h.run_local([StatePart(TRANSFER, 0, data)]) == (
        [], [StateInstalled(TRANSFER, len(data), complete=False)])
    assert x.parts_received == 1 and store(x).items() == [("a", 1)]
