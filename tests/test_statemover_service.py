"""The StateMover service: a node's mover traffic on a thread and socket of its own."""
from __future__ import annotations

import time

import pytest
import zmq

from flux.addresses import MoverAddr
from flux.envelope import Envelope
from flux.runtime.mover_service import StateMoverService, mover_peer
from flux.runtime.transport import Transport
from statemover.messages import Chunk, Handshake

pytestmark = pytest.mark.timeout(30)
A, B, C = MoverAddr("a"), MoverAddr("b"), MoverAddr("c")


@pytest.fixture
def two_nodes(zmq_ctx):
    ctx = zmq_ctx
    nodes = {n: Transport(ctx, n, k) for k, n in enumerate("ab", 1)}
    movers = {n: StateMoverService(ctx, f"w{k}", k) for k, n in enumerate("ab", 1)}
    addresses = {mover_peer(n): m.address for n, m in movers.items()}
    dead = set()
    for n, m in movers.items():
        m.start(n, nodes[n].address, addresses, dead.__contains__)
        nodes[n].connect(mover_peer(n), m.address)
    yield nodes, movers, dead
    for m in movers.values():
        m.stop()
    for t in nodes.values():
        t.close()


def receive(t, n=1, timeout=5.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += t.poll(20)[0]
    return got


def test_state_chunks_go_from_node_to_node_through_the_two_services(two_nodes):
    nodes, movers, _ = two_nodes
    big = Envelope(A, B, 3, Chunk((2, 1, 4), 0, b"\x01" * 3_000_000, 0), 11, 12)
    hello = Envelope(A, B, 3, Handshake((2, 1, 4), "send"), 11, 12)
    nodes["a"].send(mover_peer("a"), hello)
    nodes["a"].send(mover_peer("a"), big)
    assert receive(nodes["b"], 2) == [hello, big]  # whole, in order
    # each service's thread counts just after it hands a message on: b's may have passed
    # it on (and a's may have sent it) before its own count went up
    deadline = time.monotonic() + 5
    while (movers["a"].relayed < 2 or movers["b"].relayed < 2) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert movers["a"].relayed == 2 and movers["b"].relayed == 2


def test_nothing_goes_to_a_process_declared_dead(two_nodes):
    nodes, movers, dead = two_nodes
    dead.add("b")
    nodes["a"].send(mover_peer("a"), Envelope(A, B, 3, Handshake((2, 1, 4), "send"), 11, 12))
    assert receive(nodes["b"], timeout=0.5) == []
    assert movers["a"].relayed == 0


@pytest.mark.parametrize("env", [
    Envelope(C, B, 3, Handshake((2, 1, 4), "send"), 11, 12),  # not from our mover
    Envelope(A, C, 3, Handshake((2, 1, 4), "send"), 11, 12),  # to a mover it has no address for
])
def test_what_is_not_its_own_to_carry_is_dropped_with_a_log_line(two_nodes, env, caplog):
    nodes, movers, _ = two_nodes
    nodes["a"].send(mover_peer("a"), env)
    deadline = time.monotonic() + 5
    while "dropped" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "dropped" in caplog.text and movers["a"].relayed == 0
    assert receive(nodes["b"], timeout=0.3) == []


def test_messages_a_peer_movers_link_lost_are_reported_to_the_node_in_order(two_nodes):
    """A gap in the connection numbers from another node's mover (ZeroMQ lost what was in
    flight across a reconnect) reaches the local mover as a LinkLost from that mover, before
    the message after the gap, so its transfers ask for what they miss at once rather than
    wait for the catch-up's deadline."""
    from exchange.wire import encode
    from statemover.messages import LinkLost

    nodes, movers, _ = two_nodes
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.IDENTITY, b"c/mover#5")
    raw.connect(movers["b"].address)
    try:
        after = Envelope(C, B, 3, Handshake((2, 1, 5), "send"), 5, None)
        raw.send_multipart([b"1", encode(Envelope(C, B, 3, Handshake((2, 1, 4), "send"), 5,
                                                  None))])
        raw.send_multipart([b"3", encode(after)])  # #2 was lost: #3 shows the gap
        raw.send_multipart([b"4", encode(after)])
        got = receive(nodes["b"], 3)
    finally:
        raw.close()
    assert [e.msg for e in got] == [Handshake((2, 1, 4), "send"), LinkLost(2, 3),
                                    Handshake((2, 1, 5), "send")]
    assert got[1].src == C and got[1].dst == B and got[1].inc == 5


def test_an_idle_service_sleeps_until_a_message_or_its_stop(zmq_ctx, monkeypatch):
    """Its thread wakes for messages, not every few ms (each wake-up takes the GIL from
    the node's loop), and still stops promptly."""
    mover = StateMoverService(zmq_ctx, "w1", 1)
    polls = []
    poll = mover.transport.poll
    monkeypatch.setattr(mover.transport, "poll",
                        lambda timeout_ms: (polls.append(timeout_ms), poll(timeout_ms))[1])
    node = Transport(zmq_ctx, "a", 1)
    mover.start("a", node.address, {}, lambda name: False)
    try:
        time.sleep(0.5)
        assert polls and set(polls) == {50} and len(polls) <= 12  # 5 ms polls: ~100
    finally:
        began = time.monotonic()
        mover.stop()
        node.close()
    assert time.monotonic() - began < 1.0

