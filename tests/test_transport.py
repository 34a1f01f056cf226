"""The ZeroMQ transport on loopback: order, hostile frames, gaps, no blocking on dead peers."""
from __future__ import annotations

import logging
import time

import pytest
import zmq

from flux.addresses import Addr
from flux.data_messages import Batch
from flux.envelope import Envelope
from flux.runtime.transport import ConnectionLost, Transport, job_keys

A, B = Addr(1, 0, 0), Addr(2, 0, 1)
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()  # hangs if a test leaves a socket open: the timeout would fail it


@pytest.fixture
def pair(ctx):
    a = Transport(ctx, "a", 1)
    b = Transport(ctx, "b", 2)
    a.connect("b", b.address)
    b.connect("a", a.address)
    yield a, b
    a.close()
    b.close()


def receive(t, n, timeout=5.0):
    got, gaps = [], []
    deadline = time.monotonic() + timeout
    while len(got) + len(gaps) < n and time.monotonic() < deadline:
        envs, gs = t.poll(50)
        got += envs
        gaps += gs
    return got, gaps


def batch(n):
    return Envelope(A, B, 0, Batch((((n, 1), ["rec", n]),), (n,)), 1, 2)


def test_messages_arrive_whole_and_in_order(pair):
    a, b = pair
    for n in range(1, 2001):
        assert a.send("b", batch(n))
    got, gaps = receive(b, 2000)
    assert gaps == []
    assert [e.msg.items[0][0] for e in got] == [(n, 1) for n in range(1, 2001)]
    assert got[0] == Envelope(A, B, 0, Batch((((1, 1), ["rec", 1]),), (1,)), 1, 2)


def test_envelopes_sent_in_one_bundling_block_leave_as_one_message_in_order(pair):
    a, b = pair
    with a.bundling():
        for n in range(1, 301):
            assert a.send("b", batch(n))
        assert a.pending("b") == 300  # nothing left before the block's end
    assert a.pending("b") == 0
    # 300 envelopes: two messages (at most BUNDLE_ENVELOPES each), numbered 1 and 2
    assert a.out_seq["b"] == 2
    got, gaps = receive(b, 300)
    assert gaps == []
    assert [e.msg.items[0][0] for e in got] == [(n, 1) for n in range(1, 301)]


def test_a_bundle_holds_a_large_envelope_alone(pair):
    from flux.runtime.transport import BUNDLE_BYTES

    a, b = pair
    big = Envelope(A, B, 0, Batch((((2, 1), ["x" * BUNDLE_BYTES]),), (2,)), 1, 2)
    with a.bundling():
        a.send("b", batch(1))
        a.send("b", big)
        a.send("b", batch(3))
    assert a.out_seq["b"] == 3  # before it, itself, after it
    got, gaps = receive(b, 3)
    assert gaps == [] and [e.msg.items[0][0] for e in got] == [(1, 1), (2, 1), (3, 1)]


def test_a_malformed_envelope_in_a_message_is_dropped_alone(ctx, pair, caplog):
    from exchange.wire import encode

    a, b = pair
    peer = raw_dealer(ctx, b"c#4", b.address)
    try:
        with caplog.at_level(logging.WARNING, logger="flux.runtime.transport"):
            peer.send_multipart([b"1", encode(batch(1)), b"\xc1not msgpack", encode(batch(3))])
            got, gaps = receive(b, 2)
        assert gaps == [] and [e.msg.items[0][0] for e in got] == [(1, 1), (3, 1)]
        assert b.dropped == 1
        assert any("c#4" in r.getMessage() for r in caplog.records)
    finally:
        peer.close(linger=0)


def raw_dealer(ctx, identity, address):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IDENTITY, identity)
    s.connect(address)
    return s


@pytest.mark.parametrize("frames,reason", [
    ([b"1", b"\xc1not msgpack"], "not a msgpack frame"),
    ([b"1", b"\x93\x01\x02\x03"], "a frame is a list of at least 7 fields"),
    ([b"one", b"x"], "connection sequence number is not an int"),
    ([b"1"], "1 frames: no envelope after the sequence number"),
])
def test_hostile_frames_are_dropped_with_a_log_line_naming_the_peer(ctx, pair, caplog, frames, reason):
    a, b = pair
    evil = raw_dealer(ctx, b"mallory#9", b.address)
    try:
        with caplog.at_level(logging.WARNING, logger="flux.runtime.transport"):
            evil.send_multipart(frames)
            deadline = time.monotonic() + 5
            while b.dropped == 0 and time.monotonic() < deadline:
                assert b.poll(50) == ([], [])
        assert b.dropped == 1
        assert any("mallory#9" in r.getMessage() and reason in r.getMessage() for r in caplog.records)
        a.send("b", batch(1))  # the transport still works
        got, _ = receive(b, 1)
        assert len(got) == 1
    finally:
        evil.close(linger=0)


def test_a_gap_in_a_connection_is_reported_not_skipped(ctx, pair):
    a, b = pair
    from exchange.wire import encode

    forger = raw_dealer(ctx, b"c#3", b.address)
    try:
        forger.send_multipart([b"1", encode(batch(1))])
        forger.send_multipart([b"3", encode(batch(3))])  # message 2 was lost
        got, gaps = receive(b, 2)
        assert len(got) == 1
        assert [(g.peer, g.expected, g.got) for g in gaps] == [("c#3", 2, 3)]
    finally:
        forger.close(linger=0)


def test_sending_to_a_dead_peer_never_blocks_and_the_outbox_is_bounded(ctx):
    a = Transport(ctx, "a", 1, outbox_limit=50, hwm=10)
    try:
        a.connect("ghost", "tcp://127.0.0.1:9")  # nothing listens there
        started = time.monotonic()
        accepted = [a.send("ghost", batch(n)) for n in range(1, 200)]
        assert time.monotonic() - started < 5  # generous: the point is it returns at all
        assert accepted[:50] == [True] * 50 and not all(accepted)
        assert a.pending("ghost") <= 50
        a.disconnect("ghost")
        assert a.pending() == 0
    finally:
        a.close()


def test_a_restarted_process_gets_a_fresh_sequence_space(ctx, pair):
    a, b = pair
    a.send("b", batch(1))
    assert len(receive(b, 1)[0]) == 1
    a2 = Transport(ctx, "a", 7)  # same name, new incarnation
    try:
        a2.connect("b", b.address)
        a2.send("b", batch(2))
        got, gaps = receive(b, 1)
        assert len(got) == 1 and gaps == []
    finally:
        a2.close()


def test_a_watched_peer_whose_process_closes_its_sockets_is_reported_at_once(ctx, pair):
    a, b = pair
    c = Transport(ctx, "c", 3)
    a.connect("c", c.address)
    a.watch("b")
    a.watch("c")
    a.send("b", batch(1))
    a.send("c", batch(2))
    assert len(receive(b, 1)[0]) == 1 and len(receive(c, 1)[0]) == 1  # both connected
    c.close()  # what the kernel does for a killed process
    lost, deadline = [], time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        lost = a.poll(50)[1]
    assert lost == [ConnectionLost("c")]  # b is still there
    a.disconnect("c")
    b.send("a", batch(3))
    assert receive(a, 1) == ([batch(3)], [])


def test_an_unwatched_peer_that_goes_away_is_not_reported(ctx, pair):
    a, b = pair
    c = Transport(ctx, "c", 3)
    a.connect("c", c.address)
    a.send("c", batch(1))
    assert len(receive(c, 1)[0]) == 1
    c.close()
    assert receive(a, 1, timeout=0.5) == ([], [])


def test_an_oversized_frame_is_never_received_and_the_others_go_on(ctx):
    small = Transport(ctx, "b", 2, max_frame=1_000)
    a = Transport(ctx, "a", 1)
    evil = raw_dealer(ctx, b"mallory#9", small.address)
    try:
        evil.send_multipart([b"1", b"\x00" * 50_000])  # ZeroMQ closes this connection
        a.connect("b", small.address)
        a.send("b", batch(1))
        got, _ = receive(small, 1)
        assert len(got) == 1 and got[0].src == batch(1).src
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            more, _ = small.poll(50)
            assert more == []  # nothing else arrives: the big frame was never taken
        assert small.dropped == 0
    finally:
        evil.close(linger=0)
        a.close()
        small.close()


def test_with_the_jobs_keys_only_a_process_given_the_secret_gets_through(ctx):
    keys = job_keys("the-job-secret")
    b = Transport(ctx, "b", 2, keys=keys)
    member = Transport(ctx, "a", 1, keys=keys)
    stranger = Transport(ctx, "m", 9, keys=job_keys("a guess"))
    plain = Transport(ctx, "p", 8)  # no CURVE at all
    try:
        for t in (stranger, plain):
            t.connect("b", b.address)
            t.send("b", batch(7))
        member.connect("b", b.address)
        member.send("b", batch(1))
        got, _ = receive(b, 1)
        assert [env.msg for env in got] == [batch(1).msg]
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            more, gaps = b.poll(50)
            assert more == [] and gaps == []  # the others never deliver a byte
        assert b.dropped == 0
    finally:
        for t in (member, stranger, plain, b):
            t.close()


def test_job_keys_are_a_pair_and_differ_per_secret():
    public, secret = job_keys("s1")
    assert zmq.curve_public(secret) == public and job_keys("s1") == (public, secret)
    assert job_keys("s2")[0] != public
