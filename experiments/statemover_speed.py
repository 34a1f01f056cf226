"""python -m experiments.statemover_speed: how fast segment state moves between nodes.

Two StateMover machines, each on a thread with its own ZeroMQ transport on
loopback (two nodes), move a state of ``--mb`` megabytes in 1 MiB checksummed
chunks; the receiver verifies it. As in a running job, the chunks go through
both nodes' StateMoverService threads and sockets (``--direct``: node to
node, without them). Prints and writes results/statemover/summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import threading
import time

import zmq

from flux.addresses import MoverAddr
from flux.effects import Send
from flux.envelope import Envelope
from flux.runtime.mover_service import StateMoverService, mover_peer
from flux.runtime.transport import Transport
from statemover.messages import SmReady, StateReceived
from statemover.mover import StateMover


def move(megabytes: int, chunk: int = 1 << 20, direct: bool = False) -> dict:
    ctx = zmq.Context()
    a, b = Transport(ctx, "a", 1, outbox_limit=1 << 20), Transport(ctx, "b", 2)
    services = []
    if direct:
        a.connect("b", b.address)
        b.connect("a", a.address)
        via = {a: "b", b: "a"}
    else:
        services = [StateMoverService(ctx, n, k) for k, n in ((1, "a"), (2, "b"))]
        addresses = {mover_peer(sv.name): sv.address for sv in services}
        for t, sv in zip((a, b), services):
            sv.start(sv.name, t.address, addresses, lambda process: False)
            t.connect(mover_peer(sv.name), sv.address)
        via = {a: mover_peer("a"), b: mover_peer("b")}
    ma, mb = StateMover(MoverAddr("a"), chunk), StateMover(MoverAddr("b"), chunk)
    data = os.urandom(megabytes << 20)
    received = {}

    def ship(t: Transport, effects) -> list:
        local = []
        for e in effects:
            if isinstance(e, Send):
                t.send(via[t], Envelope(e.src, e.dst, 0, e.msg, 0, None))
            else:
                local.append(e)
        return local

    def receiver():
        ship(b, mb.request_recv((1, 0, 1), MoverAddr("a")))
        while "data" not in received:
            envs, _ = b.poll(50)
            for env in envs:
                for e in ship(b, mb.on_message(env.src, env.msg)):
                    if isinstance(e, StateReceived):
                        received["data"], received["at"] = e.data, time.perf_counter()

    thread = threading.Thread(target=receiver)
    thread.start()
    ship(a, ma.request_send((1, 0, 1), MoverAddr("b")))
    ready = False
    while not ready:
        envs, _ = a.poll(50)
        for env in envs:
            ready |= any(isinstance(e, SmReady) for e in ship(a, ma.on_message(env.src, env.msg)))
    started = time.perf_counter()
    ship(a, ma.send((1, 0, 1), data))
    while a.pending():
        a.poll(1)
    thread.join(timeout=120)
    for sv in services:
        sv.stop()
    a.close()
    b.close()
    ctx.term()
    seconds = received["at"] - started
    return {"megabytes": megabytes, "seconds": round(seconds, 4),
            "mb_per_s": round(megabytes / seconds, 1), "verified": received["data"] == data,
            "through_statemover_services": not direct}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.statemover_speed", description=__doc__)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--direct", action="store_true",
                    help="node to node, without the StateMoverService threads")
    ap.add_argument("--out", default="results/statemover")
    args = ap.parse_args(argv)
    summary = move(args.mb, direct=args.direct)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["verified"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
