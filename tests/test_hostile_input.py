"""Hostile input on every socket of a running job (controller, data and acks on the nodes,
ingress, egress, StateMover services): nothing crashes, nothing is lost, the output is the
reference.

Strangers (no CURVE, or keys from another secret) cannot complete a handshake: nothing
they send reaches Python. A holder of the job's keys that sends malformed frames has each
dropped with a log line naming it; one that speaks for a fenced incarnation is ignored.
"""
from __future__ import annotations

import logging
import time

import msgpack
import pytest
import zmq

from exchange import wire
from flux.addresses import Addr, P
from flux.data_messages import Batch
from flux.envelope import Envelope
from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.runtime.mover_service import mover_peer
from flux.testing.threads import ThreadCluster
from flux.runtime.transport import job_keys
from flux.testing.workloads import packet_workload

pytestmark = pytest.mark.timeout(120)

SECRET = "the-job-secret"


def paced(records, every=50, pause=0.003):
    for k, r in enumerate(records):
        if k % every == 0:
            time.sleep(pause)
        yield r


def hostile_frames():
    """One hostile message of each kind, as [connection seq, payload] frames."""
    real = wire.encode(Envelope(Addr(1, 0, P), Addr(2, 0, P), 0, Batch((), (1,)), 1, None))
    return {
        "garbage bytes": [b"1", b"\xc1\xc1 not msgpack at all"],
        "truncated msgpack": [b"1", real[: len(real) // 2]],
        "wrong shape": [b"1", msgpack.packb({"hello": "world"})],
        "unknown kind": [b"1", msgpack.packb([wire.VERSION, "launch-missiles", [1, 0, 0],
                                              [2, 0, 1], 0, 1, None, []])],
        "oversized": [b"1", b"\x00" * (wire.MAX_FRAME + 4096)],
        "bad sequence number": [b"one", real],
    }


KINDS = ["garbage bytes", "truncated msgpack", "wrong shape", "unknown kind",
         "bad sequence number"]


def dealer(ctx, identity: bytes, address: str, keys=None) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IDENTITY, identity)
    if keys is not None:
        s.curve_serverkey = keys[0]
        s.curve_publickey, s.curve_secretkey = keys
    s.connect(address)
    return s


def try_send(sock: zmq.Socket, parts, seconds: float) -> bool:
    """Send without blocking; a DEALER whose handshake never completes has no peer to queue
    for, so a stranger's send may never leave at all."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def dropped(cluster) -> int:
    """Frames every transport of the job refused."""
    return (sum(t.dropped for t in cluster.transports.values())
            + sum(m.transport.dropped for m in cluster.movers.values()))


def targets(cluster):
    """Every receiving socket of the job: name -> address."""
    found = {n: t.address for n, t in cluster.transports.items()}
    found.update({mover_peer(n): m.address for n, m in cluster.movers.items()})
    return found


def test_strangers_and_malformed_frames_on_every_socket_change_nothing(caplog, zmq_ctx):
    records = packet_workload(6000, seed=3, pairs=600, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 4)
    # the hostile senders share this process (and its GIL) with the whole cluster: a
    # generous detection timeout keeps their own load from looking like a dead node
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records), standbys=1, secret=SECRET,
                            detect_after=2.0)
    evil = zmq_ctx
    sockets = []
    frames = hostile_frames()
    try:
        with caplog.at_level(logging.WARNING, logger="flux.runtime.transport"), cluster:
            assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 4, 60)
            stranger_keys = job_keys("a guess")
            insider_keys = job_keys(SECRET)
            for name, address in targets(cluster).items():
                for k, kind in enumerate(KINDS + ["oversized"]):
                    for who, keys in (("plain", None), ("stranger", stranger_keys),
                                      ("insider", insider_keys)):
                        if kind == "oversized" and (who != "insider"
                                                    or name not in ("controller", "node0")):
                            continue  # 64 MiB a piece: two sockets are enough
                        identity = f"mallory-{who}-{k}@{name}".encode()
                        s = dealer(evil, identity, address, keys)
                        sockets.append(s)
                        sent = try_send(s, frames[kind], 5.0 if who == "insider" else 0.2)
                        assert sent or who != "insider"
            malformed = len(KINDS) * len(targets(cluster))
            assert cluster.wait_until(lambda: dropped(cluster) == malformed, 30), \
                (dropped(cluster), malformed)  # every insider frame was read and dropped
            assert cluster.wait_until(lambda: len(cluster.delivered) >= len(expected), 60)
        assert not cluster.errors, cluster.errors
        assert not cluster.controller.dead  # no process died or was suspected
        assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
        logged = " ".join(r.getMessage() for r in caplog.records)
        for name in targets(cluster):
            for k in range(len(KINDS)):  # each insider's malformed frame, named in a log line
                assert f"mallory-insider-{k}@{name}" in logged
        assert "mallory-plain" not in logged and "mallory-stranger" not in logged
        assert dropped(cluster) == malformed  # the oversized ones were never received
    finally:
        for s in sockets:
            s.close(linger=0)


def test_a_message_from_a_fenced_incarnation_is_ignored(zmq_ctx):
    records = packet_workload(6000, seed=4, pairs=600, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 4)
    # node1 is found by its dropped connection; the heartbeat timeout only has to outlast
    # a process-wide stall of this loaded test process (as in the test above)
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records), standbys=1, secret=SECRET,
                            detect_after=2.0)
    evil = zmq_ctx
    with cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 4, 60)
        dead_inc = cluster.incarnations["node1"]
        cluster.kill("node1")
        assert cluster.wait_until(lambda: "node1" in cluster.controller.dead, 30)
        # ...and node0 knows it: until the view reaches node0, node1's incarnation is a
        # live one there, and a forged batch in its name is taken like any other
        assert cluster.wait_until(lambda: dead_inc in cluster.loops["node0"].host.dead_incs,
                                  30)
        # node1 hosted 1.1P: a forged batch in its name, with its (now fenced) incarnation
        forged = Envelope(Addr(1, 1, P), Addr(2, 0, P), 0,
                          Batch((((999_999, 1), ["app0", 1, 5, 7]),), (999_999,)),
                          dead_inc, None)
        s = dealer(evil, f"node1#{dead_inc}x".encode(), cluster.transports["node0"].address,
                   job_keys(SECRET))
        assert try_send(s, [b"1", wire.encode(forged)], 5.0)
        done = cluster.wait_until(lambda: len(cluster.delivered) >= len(expected), 60)
        s.close(linger=0)
        assert done, (len(cluster.delivered), len(expected))
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
