"""Exact transitions of the StateMover (statemover/mover.py; paper 3.3.1, 5.3.1, Figure 5).

Mover A is on the active replica's node, mover B on the standby's. Transfer
ids are (stage, partition, version, standby incarnation), as the caller picks.
"""
from __future__ import annotations

import zlib
from collections import deque
from dataclasses import replace
from itertools import zip_longest

import pytest

from flux.effects import Send
from flux.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from statemover.messages import (
    Abort,
    Chunk,
    Handshake,
    LinkLost,
    Nack,
    PartAck,
    PartAcked,
    PartTrailer,
    Role,
    SmReady,
    StateAck,
    StatePart,
    StateReceived,
    StateSent,
    Trailer,
    TransferFailed,
)
from statemover.mover import (
    CANCELLED,
    CHECKSUM_MISMATCH,
    DEFAULT_CHUNK_SIZE,
    PEER_FAILED,
    Mode,
    StateMover,
)

A, B = "moverA", "moverB"
T = (1, 0, 1, 7)
T_OLD, T_NEW = (1, 0, 1, 7), (1, 0, 2, 9)
C = 4  # chunk size of the small tests


def pattern(n: int) -> bytes:
    return bytes((i * 7 + 3) % 256 for i in range(n))


class MoverPair:
    """Two movers wired back to back in memory (like h11's ConnectionPair).

    ``links[m]`` is the FIFO of messages in flight *to* mover ``m``; local
    effects collect in ``local[m]``. ``pump`` delivers everything, in order,
    through ``tamper(msg) -> messages`` (drop, corrupt or repeat one).
    """

    def __init__(self, chunk_size: int = C):
        self.m = {A: StateMover(A, chunk_size), B: StateMover(B, chunk_size)}
        self.links = {A: deque(), B: deque()}
        self.local = {A: [], B: []}

    def route(self, me, effects):
        for e in effects:
            if isinstance(e, Send):
                assert e.src == me and e.dst in self.m
                self.links[e.dst].append(e.msg)
            else:
                self.local[me].append(e)

    def call(self, me, method, *args):
        self.route(me, getattr(self.m[me], method)(*args))

    def pump(self, tamper=lambda msg: [msg]):
        while self.links[A] or self.links[B]:
            for dst, src in ((A, B), (B, A)):
                while self.links[dst]:
                    for msg in tamper(self.links[dst].popleft()):
                        self.route(dst, self.m[dst].on_message(src, msg))
        for mover in self.m.values():
            mover.check_invariants()

    def move(self, data, transfer=T, tamper=lambda msg: [msg]):
        """A whole transfer from A to B; returns B's last local effect."""
        self.call(A, "request_send", transfer, B)
        self.call(B, "request_recv", transfer, A)
        self.pump()
        self.call(A, "send", transfer, data)
        self.pump(tamper)
        return self.local[B][-1]


def ready_pair(transfer=T, chunk_size=C):
    a, b = StateMover(A, chunk_size), StateMover(B, chunk_size)
    a.request_send(transfer, B)
    b.request_recv(transfer, A)
    assert a.on_message(B, Handshake(transfer, Role.RECV)) == [SmReady(transfer)]
    assert b.on_message(A, Handshake(transfer, Role.SEND)) == [SmReady(transfer)]
    return a, b


def chunks_of(effects):
    return [e.msg for e in effects if isinstance(e, Send)]


# --- handshake (Figure 5 actions 1, 2) -------------------------------------------------

def test_handshake_sender_asks_first():
    a, b = StateMover(A), StateMover(B)
    assert a.request_send(T, B) == [Send(A, B, Handshake(T, Role.SEND))]
    assert a.mode(T) is Mode.REQUESTED
    assert b.request_recv(T, A) == [Send(B, A, Handshake(T, Role.RECV))]
    assert b.on_message(A, Handshake(T, Role.SEND)) == [SmReady(T)]
    assert a.on_message(B, Handshake(T, Role.RECV)) == [SmReady(T)]
    assert a.mode(T) is b.mode(T) is Mode.READY


def test_handshake_receiver_asks_first_and_its_handshake_arrives_before_the_send_req():
    a, b = StateMover(A), StateMover(B)
    assert b.request_recv(T, A) == [Send(B, A, Handshake(T, Role.RECV))]
    assert a.on_message(B, Handshake(T, Role.RECV)) == []  # held until the segment asks
    assert a.mode(T) is None
    assert a.request_send(T, B) == [Send(A, B, Handshake(T, Role.SEND)), SmReady(T)]
    assert b.on_message(A, Handshake(T, Role.SEND)) == [SmReady(T)]
    assert a.mode(T) is b.mode(T) is Mode.READY
    a.check_invariants()
    b.check_invariants()


# --- moving the state (Figure 5 action 4) -----------------------------------------------

def test_exact_effects_of_send_and_receive():
    a, b = ready_pair()
    data = b"abcdefghij"
    effects = a.send(T, data)
    assert effects == [
        Send(A, B, Chunk(T, 0, b"abcd", 0)),
        Send(A, B, Chunk(T, 1, b"efgh", 1)),
        Send(A, B, Chunk(T, 2, b"ij", 2)),
        Send(A, B, Trailer(T, 3, 10, zlib.crc32(data), 3)),
        StateSent(T),
    ]
    assert a.mode(T) is Mode.SENT  # kept until the receiver says it has it
    msgs = chunks_of(effects)
    assert b.on_message(A, msgs[0]) == []
    assert b.mode(T) is Mode.RECEIVING
    assert b.on_message(A, msgs[1]) == []
    assert b.on_message(A, msgs[2]) == []
    received, ack = b.on_message(A, msgs[3])
    assert received == StateReceived(T, data) and type(received.data) is bytes
    assert ack == Send(B, A, StateAck(T))
    assert b.mode(T) is Mode.DONE
    assert a.on_message(B, ack.msg) == [] and a.mode(T) is Mode.DONE
    a.check_invariants()
    b.check_invariants()


@pytest.mark.parametrize("size", [0, 1, C - 1, C, C + 1, 3 * C, 3 * C + 2])
def test_round_trip(size):
    pair, data = MoverPair(), pattern(size)
    assert pair.move(data) == StateReceived(T, data)
    assert pair.local[A] == [SmReady(T), StateSent(T)]
    assert pair.local[B] == [SmReady(T), StateReceived(T, data)]


def test_chunks_are_zero_copy_slices_of_the_state():
    a, _ = ready_pair()
    data = pattern(10)
    chunks = [m for m in chunks_of(a.send(T, data)) if isinstance(m, Chunk)]
    assert all(isinstance(c.data, memoryview) and c.data.obj is data for c in chunks)


def test_a_mutable_state_is_snapshotted_at_send():
    pair, data = MoverPair(), bytearray(b"0123456789")
    pair.call(A, "request_send", T, B)
    pair.call(B, "request_recv", T, A)
    pair.pump()
    pair.call(A, "send", T, data)
    data[0:4] = b"XXXX"  # the segment reuses its buffer before the driver sends
    pair.pump()
    assert pair.local[B][-1] == StateReceived(T, b"0123456789")


def test_twenty_megabytes_move_through_two_movers():
    pair, data = MoverPair(DEFAULT_CHUNK_SIZE), pattern(256) * (20 * 4096)
    received = pair.move(data)
    assert isinstance(received, StateReceived) and received.data == data
    assert "bytes>" in repr(received) and len(repr(received)) < 100


def test_two_transfers_in_opposite_directions_do_not_mix():
    pair = MoverPair()
    t_ab, t_ba = (1, 0, 1, 7), (1, 1, 1, 8)
    pair.call(A, "request_send", t_ab, B)
    pair.call(B, "request_send", t_ba, A)
    pair.call(A, "request_recv", t_ba, B)
    pair.call(B, "request_recv", t_ab, A)
    pair.pump()
    pair.call(A, "send", t_ab, b"from A to B")
    pair.call(B, "send", t_ba, b"from B to A!")
    pair.pump()
    assert pair.local[B][-1] == StateReceived(t_ab, b"from A to B")
    assert pair.local[A][-1] == StateReceived(t_ba, b"from B to A!")


# --- corrupt transfers: TransferFailed, never the state ------------------------------

def tamper_chunk(index, change):
    def tamper(msg):
        return change(msg) if isinstance(msg, Chunk) and msg.index == index else [msg]
    return tamper


def test_corrupted_chunk_fails_the_checksum():
    pair = MoverPair()
    flip = tamper_chunk(1, lambda m: [replace(m, data=b"E" + bytes(m.data[1:]))])
    assert pair.move(b"abcdefghij", tamper=flip) == TransferFailed(T, CHECKSUM_MISMATCH)
    assert pair.local[B] == [SmReady(T), TransferFailed(T, CHECKSUM_MISMATCH)]
    assert pair.local[A] == [SmReady(T), StateSent(T)]
    assert pair.m[B].mode(T) is Mode.ABORTED


def test_chunk_of_the_wrong_length_fails():
    pair = MoverPair()
    longer = tamper_chunk(0, lambda m: [replace(m, data=bytes(m.data) + b"!")])
    assert pair.move(b"abcdefghij", tamper=longer) == TransferFailed(T, "length 11, trailer says 10")


def test_missing_chunk_in_the_middle():
    pair = MoverPair()
    assert pair.move(b"abcdefghij", tamper=tamper_chunk(1, lambda m: [])) == TransferFailed(T, "missing chunk 1")
    assert pair.local[B] == [SmReady(T), TransferFailed(T, "missing chunk 1")]  # later ones dropped


def test_missing_last_chunk():
    pair = MoverPair()
    assert pair.move(b"abcdefghij", tamper=tamper_chunk(2, lambda m: [])) == TransferFailed(T, "missing chunk 2")


def test_duplicated_chunk():
    pair = MoverPair()
    twice = tamper_chunk(0, lambda m: [m, m])
    assert pair.move(b"abcdefghij", tamper=twice) == TransferFailed(T, "duplicate chunk 0")
    assert pair.local[B] == [SmReady(T), TransferFailed(T, "duplicate chunk 0")]


def test_chunks_out_of_order():
    a, b = ready_pair()
    c0, c1, c2, trailer = chunks_of(a.send(T, b"abcdefghij"))
    assert b.on_message(A, c0) == []
    assert b.on_message(A, c2) == [TransferFailed(T, "missing chunk 1")]
    assert b.on_message(A, c1) == []
    assert b.on_message(A, trailer) == []
    b.check_invariants()


def test_trailer_counting_fewer_chunks_than_arrived():
    a, b = ready_pair()
    c0, c1, c2, trailer = chunks_of(a.send(T, b"abcdefghij"))
    for c in (c0, c1, c2):
        assert b.on_message(A, c) == []
    assert b.on_message(A, replace(trailer, count=2)) == [TransferFailed(T, "3 chunks, trailer says 2")]


# --- catch-up attempts: stale messages of an older id (3.4, DESIGN 4.6) ----------------

def test_stale_chunks_of_an_aborted_attempt_are_ignored():
    a, b = ready_pair(T_OLD)
    old = chunks_of(a.send(T_OLD, b"OLD STATE!!!"))
    assert b.on_message(A, old[0]) == []
    assert b.cancel(T_OLD) == [Send(B, A, Abort(T_OLD, CANCELLED)), TransferFailed(T_OLD, CANCELLED)]
    assert a.on_message(B, Abort(T_OLD, CANCELLED)) == []  # the sender had finished
    # The controller retries with a new version; old messages keep trickling in.
    assert b.request_recv(T_NEW, A) == [Send(B, A, Handshake(T_NEW, Role.RECV))]
    assert b.on_message(A, Handshake(T_OLD, Role.SEND)) == []
    assert b.mode(T_NEW) is Mode.REQUESTED
    assert a.on_message(B, Handshake(T_NEW, Role.RECV)) == []
    assert a.request_send(T_NEW, B) == [Send(A, B, Handshake(T_NEW, Role.SEND)), SmReady(T_NEW)]
    assert b.on_message(A, Handshake(T_NEW, Role.SEND)) == [SmReady(T_NEW)]
    new = chunks_of(a.send(T_NEW, b"new state"))
    interleaved = [m for pair in zip_longest(old[1:], new) for m in pair if m is not None]
    assert interleaved[0] == old[1] and interleaved[-1] == new[-1]
    out = [e for m in interleaved for e in b.on_message(A, m)]
    assert out == [StateReceived(T_NEW, b"new state"), Send(B, A, StateAck(T_NEW))]
    b.check_invariants()


def test_a_stale_handshake_never_readies_a_newer_attempt():
    b = StateMover(B)
    assert b.on_message(A, Handshake(T_OLD, Role.SEND)) == []  # an attempt B never saw
    assert b.request_recv(T_NEW, A) == [Send(B, A, Handshake(T_NEW, Role.RECV))]
    assert b.on_message(A, Chunk(T_OLD, 0, b"old", 0)) == []
    assert b.on_message(A, Trailer(T_OLD, 1, 3, zlib.crc32(b"old"), 1)) == []
    assert b.mode(T_NEW) is Mode.REQUESTED and b.mode(T_OLD) is None


# --- peer failures (3.2.1) and cancel ---------------------------------------------------

def test_peer_dies_during_the_handshake():
    a, b = StateMover(A), StateMover(B)
    a.request_send(T, B)
    b.request_recv(T, A)
    assert a.on_fail({B}) == [TransferFailed(T, PEER_FAILED)]
    assert a.on_message(B, Handshake(T, Role.RECV)) == []  # a slow message of the dead
    assert a.send(T, b"state") == []  # the segment had not seen the failure yet
    assert b.on_fail({A}) == [TransferFailed(T, PEER_FAILED)]
    assert a.mode(T) is b.mode(T) is Mode.ABORTED
    a.check_invariants()
    b.check_invariants()


def test_peer_dies_after_ready_before_send():
    a, b = ready_pair()
    assert a.on_fail({B, "someone else"}) == [TransferFailed(T, PEER_FAILED)]
    assert a.send(T, b"state") == []


def test_sender_dies_mid_transfer():
    a, b = ready_pair()
    msgs = chunks_of(a.send(T, b"abcdefghij"))
    assert b.on_message(A, msgs[0]) == []
    assert b.on_fail({A}) == [TransferFailed(T, PEER_FAILED)]
    assert [e for m in msgs[1:] for e in b.on_message(A, m)] == []  # never a partial state
    b.check_invariants()


def test_receiver_dies_after_the_sender_finished():
    a, b = ready_pair()
    a.send(T, b"abcdefghij")
    assert a.mode(T) is Mode.SENT  # kept for a resend
    assert a.on_fail({B}) == []  # StateSent was already reported; fail(X) is catch-up's job
    assert a.mode(T) is Mode.DONE
    a.check_invariants()  # the copy is gone


def test_failure_of_an_unrelated_peer_changes_nothing():
    a, _ = ready_pair()
    assert a.on_fail({"moverC"}) == []
    assert a.mode(T) is Mode.READY


def test_request_with_a_dead_peer_fails_at_once():
    a = StateMover(A)
    assert a.on_message(B, Handshake(T, Role.RECV)) == []
    assert a.on_fail({B}) == []
    assert a.request_send(T, B) == [TransferFailed(T, PEER_FAILED)]
    a.check_invariants()


def test_messages_of_a_dead_peer_are_fenced():
    b = StateMover(B)
    b.request_recv(T, "moverC")
    assert b.on_fail({A}) == []
    assert b.on_message(A, Handshake(T_NEW, Role.SEND)) == []  # not held for a later request
    assert b.on_message(A, Handshake(T, Role.SEND)) == []  # not a protocol error: A is gone
    b.check_invariants()
    assert b.request_recv(T_NEW, A) == [TransferFailed(T_NEW, PEER_FAILED)]


def test_cancel_by_the_sender_aborts_both_sides():
    a, b = ready_pair()
    assert a.cancel(T) == [Send(A, B, Abort(T, CANCELLED)), TransferFailed(T, CANCELLED)]
    assert b.on_message(A, Abort(T, CANCELLED)) == [TransferFailed(T, "peer aborted: cancelled")]
    assert a.cancel(T) == []  # already over
    assert a.send(T, b"state") == []


def test_cancel_by_the_receiver_mid_transfer():
    a, b = ready_pair()
    msgs = chunks_of(a.send(T, b"abcdefghij"))
    b.on_message(A, msgs[0])
    assert b.cancel(T, "view 5") == [Send(B, A, Abort(T, "view 5")), TransferFailed(T, "view 5")]
    assert [e for m in msgs[1:] for e in b.on_message(A, m)] == []
    b.check_invariants()


def test_cancel_after_done_is_a_no_op():
    pair = MoverPair()
    pair.move(b"abc")
    assert pair.m[A].cancel(T) == [] and pair.m[B].cancel(T) == []


def test_cancel_before_the_request_fails_the_request_at_once():
    a = StateMover(A)
    assert a.cancel(T) == []
    assert a.request_send(T, B) == [TransferFailed(T, CANCELLED)]
    assert a.on_message(B, Handshake(T, Role.RECV)) == []
    a.check_invariants()


def test_peer_abort_before_the_request_fails_the_request_at_once():
    b = StateMover(B)
    assert b.on_message(A, Abort(T, CANCELLED)) == []
    assert b.on_message(A, Handshake(T, Role.SEND)) == []  # cannot undo the abort
    assert b.request_recv(T, A) == [TransferFailed(T, "peer aborted: cancelled")]
    b.check_invariants()


# --- protocol errors --------------------------------------------------------------------

def test_send_before_sm_ready_is_a_protocol_error():
    a = StateMover(A)
    a.request_send(T, B)
    with pytest.raises(LocalProtocolError):
        a.send(T, b"x")
    assert a.mode(T) is Mode.REQUESTED


def test_local_misuse_is_a_protocol_error():
    a, b = ready_pair()
    with pytest.raises(LocalProtocolError):
        b.send(T, b"x")  # the receiver does not send
    with pytest.raises(LocalProtocolError):
        a.send((9, 9, 9, 9), b"x")  # never requested
    with pytest.raises(LocalProtocolError):
        a.request_recv(T, B)  # the id is taken
    with pytest.raises(LocalProtocolError):
        a.request_send((2, 0, 1, 7), A)  # to itself
    a.send(T, b"x")
    with pytest.raises(LocalProtocolError):
        a.send(T, b"x")  # twice
    assert a.mode(T) is Mode.SENT and b.mode(T) is Mode.READY


def test_messages_no_live_transfer_accepts_are_protocol_errors():
    a, b = StateMover(A), StateMover(B)
    a.request_send(T, B)
    b.request_recv(T, A)
    with pytest.raises(RemoteProtocolError):
        a.on_message(B, Handshake(T, Role.SEND))  # both ends would send
    with pytest.raises(RemoteProtocolError):
        b.on_message(A, Chunk(T, 0, b"x", 0))  # data before the handshake
    with pytest.raises(RemoteProtocolError):
        b.on_message("moverC", Handshake(T, Role.SEND))  # not the peer
    with pytest.raises(RemoteProtocolError):
        b.on_message(A, "hello")
    b.on_message(A, Handshake(T, Role.SEND))
    with pytest.raises(RemoteProtocolError):
        b.on_message(A, Handshake(T, Role.SEND))  # twice on a FIFO link
    a.on_message(B, Handshake(T, Role.RECV))
    with pytest.raises(RemoteProtocolError):
        a.on_message(B, Chunk(T, 0, b"x", 0))  # the sender receives no chunks
    assert a.mode(T) is b.mode(T) is Mode.READY


def test_an_early_handshake_that_does_not_fit_the_request_is_a_protocol_error():
    a = StateMover(A)
    a.on_message("moverC", Handshake(T, Role.RECV))
    with pytest.raises(RemoteProtocolError):
        a.request_send(T, B)  # the handshake came from someone else
    b = StateMover(B)
    b.on_message(A, Handshake(T, Role.RECV))
    with pytest.raises(ProtocolError):
        b.request_recv(T, A)  # both ends would receive
    assert a.mode(T) is None and b.mode(T) is None


def test_chunk_size_must_be_positive():
    assert StateMover(A).chunk_size == 1 << 20
    with pytest.raises(ValueError):
        StateMover(A, 0)


def test_chunk_repr_shows_the_size_not_the_bytes():
    assert repr(Chunk(T, 3, b"x" * 1000, 9)) == "Chunk((1, 0, 1, 7), 3, <1000 bytes>, #9)"


# --- bulk parts of a two-phase catch-up (docs/design/catchup.md) ------------------------------

def test_exact_effects_of_a_part_then_the_final_state():
    a, b = ready_pair()
    part = b"abcdef"
    effects = a.send_part(T, part)
    assert effects == [
        Send(A, B, Chunk(T, 0, b"abcd", 0)),
        Send(A, B, Chunk(T, 1, b"ef", 1)),
        Send(A, B, PartTrailer(T, 0, 2, 6, zlib.crc32(part), 2)),
    ]
    assert a.mode(T) is Mode.READY  # more parts, or the final state, may follow
    msgs = chunks_of(effects)
    assert b.on_message(A, msgs[0]) == [] and b.mode(T) is Mode.RECEIVING
    assert b.on_message(A, msgs[1]) == []
    got, ack = b.on_message(A, msgs[2])
    assert got == StatePart(T, 0, part) and type(got.data) is bytes
    assert ack == Send(B, A, PartAck(T, 0))  # the receiver has it: the sender's window moves
    assert b.mode(T) is Mode.READY
    b.check_invariants()
    assert a.on_message(B, ack.msg) == [PartAcked(T, 0)]
    with pytest.raises(RemoteProtocolError):
        a.on_message(B, PartAck(T, 0))  # acked twice
    # an empty part: a trailer alone; chunk indices start again at 0 in every part
    assert a.send_part(T, b"") == [Send(A, B, PartTrailer(T, 1, 0, 0, zlib.crc32(b""), 3))]
    assert b.on_message(A, PartTrailer(T, 1, 0, 0, zlib.crc32(b""), 3)) == [
        StatePart(T, 1, b""), Send(B, A, PartAck(T, 1))]
    final = chunks_of(a.send(T, b"xyz"))
    assert final == [Chunk(T, 0, b"xyz", 4), Trailer(T, 1, 3, zlib.crc32(b"xyz"), 5)]
    assert [e for m in final for e in b.on_message(A, m)] == [StateReceived(T, b"xyz"),
                                                              Send(B, A, StateAck(T))]
    assert a.mode(T) is Mode.SENT and b.mode(T) is Mode.DONE
    a.check_invariants()
    b.check_invariants()


def test_parts_and_state_round_trip_through_two_movers():
    pair = MoverPair()
    pair.call(A, "request_send", T, B)
    pair.call(B, "request_recv", T, A)
    pair.pump()
    parts = [pattern(n) for n in (0, 1, C, 3 * C + 1)]
    for p in parts:
        pair.call(A, "send_part", T, p)
    pair.pump()
    pair.call(A, "send", T, b"delta")
    pair.pump()
    assert pair.local[B] == [SmReady(T)] + [StatePart(T, i, p) for i, p in enumerate(parts)] + [
        StateReceived(T, b"delta")]
    assert pair.local[A] == [SmReady(T)] + [PartAcked(T, i) for i in range(len(parts))] + [
        StateSent(T)]


def test_a_corrupted_part_fails_the_transfer_and_nothing_after_it_is_delivered():
    a, b = ready_pair()
    msgs = chunks_of(a.send_part(T, b"abcdefgh")) + chunks_of(a.send(T, b"final"))
    msgs[1] = replace(msgs[1], data=b"eXgh")
    out = [e for m in msgs for e in b.on_message(A, m)]
    assert out == [TransferFailed(T, CHECKSUM_MISMATCH)]
    assert b.mode(T) is Mode.ABORTED
    b.check_invariants()  # no chunk kept


@pytest.mark.parametrize("tamper,reason", [
    (lambda msgs: msgs[:1] + msgs[2:], "missing chunk 1"),  # a chunk lost inside a part
    (lambda msgs: msgs[:3] + msgs[6:], "part 2, expected part 1"),  # a whole part lost
    (lambda msgs: msgs[:3] + msgs[:3], "part 0, expected part 1"),  # a part repeated
])
def test_lost_or_repeated_parts_fail_the_transfer(tamper, reason):
    a, b = ready_pair()
    msgs = [m for p in (b"abcdef", b"ghijkl", b"mn") for m in chunks_of(a.send_part(T, p))]
    assert [type(m) for m in msgs[:3]] == [Chunk, Chunk, PartTrailer]
    out = [e for m in tamper(msgs) for e in b.on_message(A, m)]
    assert out[-1] == TransferFailed(T, reason)
    assert b.mode(T) is Mode.ABORTED


def test_a_part_trailer_counting_other_chunks_fails():
    a, b = ready_pair()
    c0, c1, trailer = chunks_of(a.send_part(T, b"abcdef"))
    b.on_message(A, c0)
    assert b.on_message(A, trailer) == [TransferFailed(T, "missing chunk 1")]


def test_send_part_out_of_turn_is_a_local_error_and_a_no_op_after_abort():
    a = StateMover(A)
    with pytest.raises(LocalProtocolError):
        a.send_part(T, b"x")  # never requested
    a.request_send(T, B)
    with pytest.raises(LocalProtocolError):
        a.send_part(T, b"x")  # not ready yet
    a, b = ready_pair()
    a.send(T, b"done")
    with pytest.raises(LocalProtocolError):
        a.send_part(T, b"x")  # after the final state
    a, b = ready_pair()
    with pytest.raises(LocalProtocolError):
        b.send_part(T, b"x")  # the receiver sends nothing
    assert a.cancel(T) == [Send(A, B, Abort(T, CANCELLED)), TransferFailed(T, CANCELLED)]
    assert a.send_part(T, b"x") == []  # the segment had not seen the abort yet


def test_a_part_trailer_the_sender_never_made_is_a_remote_error():
    a, b = ready_pair()
    with pytest.raises(RemoteProtocolError):
        a.on_message(B, PartTrailer(T, 0, 0, 0, 0, 0))  # to the sender
    b2 = StateMover(B)
    b2.request_recv(T, A)  # REQUESTED: no handshake yet
    with pytest.raises(RemoteProtocolError):
        b2.on_message(A, PartTrailer(T, 0, 0, 0, 0, 0))


def test_parts_of_an_aborted_attempt_never_reach_the_next():
    a, b = ready_pair(T_OLD)
    old = chunks_of(a.send_part(T_OLD, b"OLD PART"))
    assert b.on_message(A, old[0]) == []
    assert b.on_fail({"someone else"}) == []
    b.cancel(T_OLD)
    b.check_invariants()  # the partial part is gone
    b.request_recv(T_NEW, A)
    a.on_message(B, Handshake(T_NEW, Role.RECV))
    a.request_send(T_NEW, B)
    b.on_message(A, Handshake(T_NEW, Role.SEND))
    new = chunks_of(a.send_part(T_NEW, b"new"))
    out = [e for m in old[1:] + new for e in b.on_message(A, m)]
    assert out == [StatePart(T_NEW, 0, b"new"), Send(B, A, PartAck(T_NEW, 0))]


def test_the_receiver_dies_between_parts():
    a, b = ready_pair()
    for m in chunks_of(a.send_part(T, b"abcdef")):
        b.on_message(A, m)
    assert a.on_fail({B}) == [TransferFailed(T, PEER_FAILED)]
    assert a.send_part(T, b"more") == [] and a.send(T, b"final") == []


# -- a link that lost messages (a lossy mover link) -------------------------

def test_lost_messages_from_a_peer_ask_its_live_transfers_for_a_resend_and_no_others():
    a, b = ready_pair()
    other = StateMover("moverC", C)
    b.request_recv(T_NEW, "moverC")
    effects = b.on_message(A, LinkLost(3, 5))
    assert effects == [Send(B, A, Nack(T, 0))]  # nothing of T taken yet: all of it again
    assert b.mode(T) is Mode.READY and b.mode(T_NEW) is Mode.REQUESTED
    b.check_invariants()
    assert other.transfers == {}


def test_a_chunk_whose_handshake_was_lost_readies_the_transfer():
    """The sender's handshake was lost; the sender sends data only once it has ours, so
    its first chunk (after the gap the transport reported) stands for the handshake."""
    b = StateMover(B, C)
    assert b.on_message(A, LinkLost(1, 2)) == []
    b.request_recv(T, A)
    assert b.on_message(A, Chunk(T, 0, b"abcd", 0)) == [SmReady(T)]
    assert b.mode(T) is Mode.RECEIVING
    assert b.on_message(A, Trailer(T, 1, 4, zlib.crc32(b"abcd"), 1)) == [
        StateReceived(T, b"abcd"), Send(B, A, StateAck(T))]


def test_out_of_turn_from_a_peer_that_lost_nothing_is_still_a_protocol_error():
    b = StateMover(B, C)
    b.request_recv(T, A)
    with pytest.raises(RemoteProtocolError, match="chunk in REQUESTED"):
        b.on_message(A, Chunk(T, 0, b"abcd", 0))
