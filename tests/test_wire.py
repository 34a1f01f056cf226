"""The wire format: every message round-trips; every malformed frame is refused with a reason."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange import wire
from exchange.wire import CODECS, WireError, decode, encode
from flux.addresses import Addr, MoverAddr, ProcAddr
from flux.digests import GROUPS, Digest
from flux.control_messages import (
    CheckpointDone,
    CutAtEpoch,
    HoldInputs,
    IngressEnded,
    SplitCutPassed,
    Avail,
    CatchUpPaused,
    CutDigest,
    SnapshotWritten,
    Failed,
    FoldedIn,
    Heartbeat,
    Members,
    OperatorFailed,
    ProbedKeys,
    ProbeKeys,
    Ready,
    Register,
    StateMoved,
    Stop,
    Stopping,
    NodeStats,
    SegmentStats,
    TakeoverDone,
    View,
    Welcome,
    SinkCommitted,
    WriterMove,
    WriterProgress,
    InstallRange,
    RangeInstalled,
    RangePacked,
)
from exchange.group_map import GroupMove
from flux.data_messages import (
    Ack,
    Batch,
    Credit,
    CSync,
    IngressLog,
    LogAck,
    Pause,
    PauseAck,
    PSync,
    Restore,
    Restored,
    Stay,
    Reverse,
)
from flux.envelope import Envelope
from statemover.messages import (
    Abort,
    LinkLost,
    Chunk,
    Handshake,
    PartAck,
    Nack,
    PartTrailer,
    Role,
    StateAck,
    Trailer,
    TransferFailed,
)

A, B = Addr(1, 2, 0), Addr(2, 0, 1)

MESSAGES = [
    Batch((((3, 1), ["k", 1, 2.5]), ((4, 2), None)), (4,)),
    Batch((), (0,)),
    Batch((((7, 1), "x"),), (7,), (3, 6)),  # with a checkpoint cut
    Batch((((9, 1), "x"),), (9,), (4, 8, ((2, 3, (GroupMove(1, 0, 63, 0, 2),)),
                                          (4, 8, (GroupMove(1, 64, 64, 1, 0),
                                                  GroupMove(2, 7, 9, 3, 1)))))),  # live moves
    RangePacked(4, GroupMove(2, 7, 9, 3, 1), Addr(2, 3, 0), b"\x92\x01\x02"),
    InstallRange(4, GroupMove(2, 7, 9, 3, 1), b"\x92\x01\x02"),
    RangePacked(3, GroupMove(2, 7, 9, 3, 1, prepare=True), Addr(2, 3, 1), b"\x90"),
    RangePacked(5, GroupMove(2, 7, 9, 3, 1), Addr(2, 3, 0), b"\x90", over=3, took=0.25),
    InstallRange(5, GroupMove(2, 7, 9, 3, 1), b"\x90", over=3),
    RangeInstalled(4, GroupMove(2, 7, 9, 3, 1), Addr(2, 1, 1), 0.031),
    Ack((7, 1)), Credit((7, 2)), Reverse(()), Pause(3), PauseAck(3), CSync(4), PSync(4), PSync(5, True), Restore(6), Restored(6), Stay(6),
    IngressLog(4, (("item", 1048579), ("epoch", 2), ("cut", 3, 2), ("item", 3145729))),
    IngressLog(5, (("cut", 4, 3, ([1, 0, 63, 0, 2], [2, 7, 9, 3, 1, 1])),)),  # live moves
    LogAck(6),
    Handshake((1, 2, 3), "send"), Chunk((1, 2, 3), 0, b"\x00\xffstate", 4),
    Trailer((1, 2, 3), 1, 7, 123456, 5), PartTrailer((1, 2, 3), 2, 1, 7, 123456, 3),
    PartAck((1, 2, 3), 2), Nack((1, 2, 3), 4), StateAck((1, 2, 3)),
    Abort((1, 2, 3), "peer failed"),
    LinkLost(3, 7),
    TransferFailed((1, 2, 3), "checksum mismatch"), Heartbeat(0.25, 0.5),
    View(4, frozenset({Addr(1, 0, 1), MoverAddr("node1")}), frozenset({3}),
         (Avail(Addr(1, 0, 1), 9, 2, "standby0", "node0"),)),
    View(5), View(6, writers=(WriterMove(Addr(3, 1, 0), 9, "node2"),)),
    Reverse((3, 1), (5, 1)), WriterProgress(2, (17, 2), 16, 40), SinkCommitted(3, (9, 1, 2), 1),
    IngressEnded(2, 3 << 20, 17), CutAtEpoch(3, 1234),
    CutAtEpoch(4, 1240, (GroupMove(1, 0, 63, 0, 2), GroupMove(2, 7, 9, 3, 1, prepare=True))),
    HoldInputs(7), HoldInputs(None),
    SplitCutPassed(3, 5 << 20, 1, 96),
    SplitCutPassed(4, 6 << 20, 0, 97, "[90, 1234]"),
    SinkCommitted(4, None, 0), Heartbeat(), FoldedIn(Addr(1, 0, 0), Addr(2, 1, 1), 7), TakeoverDone(Addr(2, 0, 0)),
    Register(2, 41, "tcp://127.0.0.1:5000", 123, 99, "s3cret", "tcp://127.0.0.1:5002"),
    Register(2, 41, "tcp://10.1.0.7:5000", 123, 99, "s3cret", "tcp://10.1.0.7:5002", "10.1.0.7",
             "exec-3", "6c1c9a52-2d7e-4b0e-9a7e-1f0e2d3c4b5a"),
    Welcome("standby41", 3, ((Addr(1, 0, 0), "node1"),), (7, 8)),
    Members((("node0", "tcp://127.0.0.1:5001", 40),)),
    Failed(2, 41, "ImportError: no module named ops", "s3cret"), Stop("job stopped"),
    Stopping("lost the controller's lease (3.10s)"),
    StateMoved(Addr(1, 2, 1), 1 << 20, 0.125), CatchUpPaused(Addr(1, 0, 0), 0.031), Ready(),
    SnapshotWritten(3, Addr(2, 1, 0), "stage2-part1-P.state", 8 << 20, 0.25),
    SnapshotWritten(4, Addr(1, 0, 1), "", 0, 0.0, "OSError: disk full"),
    CutDigest(Addr(2, 1, 1), Digest(3, 4096, (2**64 - 1, 7), 12345, 1024)),
    CutDigest(Addr(1, 0, 0), Digest(1, 10, (), None, -1)),
    CutDigest(Addr(1, 3, 0), Digest(2, 20, (5, 6), 1, 10,
                                     (tuple(range(GROUPS)), None))),
    ProbeKeys(Addr(2, 1, 1), 3, 4096, 0, (7, 200)),
    ProbedKeys(Addr(2, 1, 0), 3, 4096, 0, (("k17", 2**64 - 1), ((1, "a"), 5))),
    ProbedKeys(Addr(2, 1, 0), 3, 4096, 1, None),
    OperatorFailed("operator Boom", 2, 1, (17, 1), "ZeroDivisionError: division by zero", "s"),
    CheckpointDone(7, 2**40),
    NodeStats((SegmentStats(Addr(1, 0, 0), 10, 5, 3, 7, 2, 0, (4, 0, 6)),
               SegmentStats(Addr(2, 3, 1), 0, 0, 0, 0, 0, 1, (), 12, True))), NodeStats(),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    env = Envelope(A, B, 5, msg, 11, 12)
    assert decode(encode(env)) == env


def test_every_kind_on_the_wire_is_round_tripped_above():
    assert {codec[0] for codec in CODECS.values()} == {type(m) for m in MESSAGES}


def test_process_endpoints_round_trip():
    env = Envelope(ProcAddr("controller"), ProcAddr("node2"), 3, Heartbeat(), 0, None)
    assert decode(encode(env)) == env


def test_mover_endpoints_and_an_unknown_destination_incarnation_round_trip():
    env = Envelope(MoverAddr("node3"), MoverAddr("standby0"), 2, Abort((1, 0, 9), "x"), 4, None)
    assert decode(encode(env)) == env


def test_records_come_back_in_wire_form():
    env = Envelope(A, B, 0, Batch((((1, 1), ("a", (1, 2))),), (1,)), 1)
    assert decode(encode(env)).msg.items == (((1, 1), ["a", [1, 2]]),)


sns = st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=4).map(tuple)
records = st.recursive(st.none() | st.integers(-2**31, 2**31) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3), max_leaves=6)


def batch_items(width):
    """Tuples of one stage: every SN of a batch has the same length (DESIGN 4.1)."""
    sn = st.lists(st.integers(min_value=0, max_value=2**40), min_size=width,
                  max_size=width).map(tuple)
    return st.lists(st.tuples(sn, records), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(batch_items), sns, st.integers(0, 2**31))
def test_batches_round_trip(items, bound, view):
    env = Envelope(A, B, view, Batch(tuple(items), bound), 3, 9)
    assert decode(encode(env)) == Envelope(A, B, view, Batch(tuple(
        (sn, msgpack.unpackb(msgpack.packb(rec), raw=False)) for sn, rec in items), bound), 3, 9)


def frame(*parts):
    return msgpack.packb(list(parts), use_bin_type=True)


GOOD = [wire.VERSION, "ack", [1, 0, 0], [2, 0, 1], 0, 1, None, [3], 0]


@pytest.mark.parametrize("data,reason", [
    (b"\xc1garbage", "not a msgpack frame"),
    (encode(Envelope(A, B, 0, Ack((1,)), 1))[:-3], "not a msgpack frame"),
    (frame(*GOOD) + b"\x01", "not a msgpack frame"),
    (msgpack.packb({"kind": "ack"}), "a frame is a list"),
    (frame(1, "ack"), "a frame is a list of at least 7 fields"),
    (frame(99, *GOOD[1:]), "wire version 99"),
    (frame(wire.VERSION, "launch", *GOOD[2:]), "unknown message kind 'launch'"),
    (frame(wire.VERSION, 7, *GOOD[2:]), "unknown message kind 7"),
    (frame(*GOOD[:7], ["3"], 0), "ack: hwm must be a list of ints"),
    (frame(*GOOD[:7], [3], "2"), "ack: moves crossed must be an int"),
    (frame(*GOOD[:7]), "ack: expected 2 fields, got 0"),
    (frame(*GOOD[:2], [1, 0, 2], *GOOD[3:]), "src: replica must be 0 or 1"),
    (frame(*GOOD[:2], {"a": 1}, *GOOD[3:]), "src must be [stage, partition, replica]"),
    (frame(*GOOD[:4], "0", *GOOD[5:]), "view must be an int"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], 1, b"\x01" * 8, ["r", "extra"], [1], None),
     "batch: batch of 2 records has 8 bytes of SNs of length 1"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], [[[1], "r"]], [1], None),
     "batch: expected 5 fields, got 3"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], 1, [1], ["r"], [1], None),
     "batch: batch items must be SN bytes and a list of records"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], 0, b"", [], [1], [1, -2]),
     "batch: a checkpoint cut must be [checkpoint, input]"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], 0, b"", [], [1], [1, 2, [[1, 2, [[1, 9, 3, 0, 1]]]]]),
     "batch: a move is [stage, first, last, source, dest"),
    (frame(wire.VERSION, "batch", *GOOD[2:7], 0, b"", [], [1], [1, 2, [[1, 2]]]),
     "batch: malformed move cut"),
    (frame(wire.VERSION, "install_range", *GOOD[2:7], 3, [1, 0, 3, 0, 1], "not bytes", None),
     "install_range: range must be bytes"),
    (frame(wire.VERSION, "sm_chunk", *GOOD[2:7], [1, 2, 3], 0, "not bytes", 0),
     "sm_chunk: chunk data must be bytes"),
    (frame(wire.VERSION, "sm_part_trailer", *GOOD[2:7], [1, 2, 3], "0", 1, 7, 9, 0),
     "sm_part_trailer: part must be an int"),
    (frame(wire.VERSION, "sm_part_trailer", *GOOD[2:7], [1, 2, 3], 0, 1, 7, 9),
     "sm_part_trailer: expected 6 fields, got 5"),
    (frame(wire.VERSION, "sm_nack", *GOOD[2:7], [1, 2, 3], "4"), "sm_nack: seq must be an int"),
    (frame(wire.VERSION, "sm_hello", *GOOD[2:7], [1, 2, 3], "steal"),
     "sm_hello: mover role must be 'send' or 'recv'"),
    (frame(wire.VERSION, "ingress_log", *GOOD[2:7], 1, [["lunch", 3]]),
     "ingress_log: a log entry must be [kind, number]"),
    (frame(wire.VERSION, "ingress_log", *GOOD[2:7], 1, [["cut", 3]]),
     "ingress_log: a log entry must be [kind, number]"),
    (frame(wire.VERSION, "ingress_log", *GOOD[2:7], 1, [["item", "3"]]),
     "ingress_log: log entry must be an int"),
    ("text", "a frame must be bytes"),
])
def test_malformed_frames_are_refused_with_a_reason(data, reason):
    with pytest.raises(WireError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        decode(data)


def test_an_oversized_frame_is_refused_before_decoding(monkeypatch):
    monkeypatch.setattr(wire, "MAX_FRAME", 100)
    with pytest.raises(WireError, match="exceeds the 100-byte limit"):
        decode(frame(*GOOD[:7], list(range(200))))


def test_the_reference_frame_of_these_tests_is_itself_valid():
    assert decode(frame(*GOOD)) == Envelope(Addr(1, 0, 0), Addr(2, 0, 1), 0, Ack((3,)), 1, None)


def test_a_batch_mixing_sn_lengths_is_a_local_error():
    with pytest.raises(ValueError, match="one length"):
        encode(Envelope(A, B, 0, Batch((((1,), "a"), ((1, 2), "b")), (1,)), 1))


def test_a_message_without_a_wire_form_is_a_local_error():
    with pytest.raises(TypeError, match="no wire form for str"):
        encode(Envelope(A, B, 0, "hello", 1))


def test_a_mover_role_travels_as_its_plain_string():
    frame = encode(Envelope(MoverAddr("a"), MoverAddr("b"), 1, Handshake((1, 2, 3), Role.RECV), 4))
    assert frame == encode(Envelope(MoverAddr("a"), MoverAddr("b"), 1, Handshake((1, 2, 3), "recv"), 4))
    assert b"recv" in frame
    assert decode(frame).msg.role is Role.RECV


def test_a_batch_packed_for_both_replicas_is_packed_once_and_never_mixed_up():
    """The same tuples object (Buffer.take for the pair's two replicas) is packed once;
    equal SNs with other records are packed afresh."""
    items = (((1,), "a"), ((2,), "b"))
    other_items = (((1,), "x"), ((2,), "y"))
    for its in (items, items, other_items, items):
        env = Envelope(A, B, 0, Batch(its, (2,)), 1)
        assert decode(encode(env)).msg.items == its
    assert wire._last_encoded[0] is items
