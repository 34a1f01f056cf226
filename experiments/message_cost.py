"""python -m experiments.message_cost: what a ZeroMQ message costs, by how many envelopes
it carries.

Two processes on this machine, a DEALER sending to a ROUTER over TCP with CURVE, as the
job's transport does (``flux.runtime.transport``). The sender sends ``--messages``
messages of ``k`` frames of ``--size`` bytes each, one message per wake-up (it sleeps
``--nap`` seconds between messages, as a node's loop sends what one step made and
waits for more), and the receiver polls and reads them as a node's loop does. The CPU
time of both processes (every thread: ZeroMQ's I/O threads encrypt and write) over the
run, divided by the envelopes sent: the cost of an envelope when ``k`` go together.
Rounds alternate the ``k``s; medians with their spread.

Why: a small item fans out to every replica of the next stage, an envelope to each;
the transport sends what one step of a loop made as one message per peer
(``Transport.bundling``) because a message costs a wake-up and a few system calls
whatever it carries (docs/results/throughput.md, "What an item costs").

Writes ``runs.csv`` and ``summary.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import pathlib
import resource
import time
from typing import Any, Dict, List

from experiments.throughput import spread


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.message_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-message", type=int, nargs="+", default=[1, 4, 8, 16],
                    help="envelopes a message carries (one run each per round)")
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--size", type=int, default=300, help="bytes an envelope")
    ap.add_argument("--nap", type=float, default=0.0002, help="seconds between messages")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/message_cost")
    return ap.parse_args(argv)


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _receive(keys, ports, results, messages: int) -> None:
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = keys
    ports.put(router.bind_to_random_port("tcp://127.0.0.1"))
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    start, got = _cpu(), 0
    while got < messages:
        if not poller.poll(5000):
            break  # the sender is gone: what arrived is what is counted
        while got < messages:
            try:
                router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            got += 1
    results.put(("receiver", _cpu() - start, got))
    router.close(linger=0)
    ctx.term()


def _send(keys, port: int, results, messages: int, k: int, size: int, nap: float) -> None:
    import zmq

    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.curve_serverkey = keys[0]
    dealer.curve_publickey, dealer.curve_secretkey = zmq.curve_keypair()
    dealer.connect(f"tcp://127.0.0.1:{port}")
    envelope = b"x" * size
    start = _cpu()
    for seq in range(1, messages + 1):
        dealer.send_multipart([str(seq).encode()] + [envelope] * k)
        time.sleep(nap)
    results.put(("sender", _cpu() - start, messages))
    dealer.close(linger=2000)
    ctx.term()


def one_run(k: int, args) -> Dict[str, Any]:
    """Both processes' CPU per envelope, ``k`` envelopes a message."""
    import zmq

    keys = zmq.curve_keypair()
    spawn = mp.get_context("spawn")
    ports, results = spawn.Queue(), spawn.Queue()
    receiver = spawn.Process(target=_receive, args=(keys, ports, results, args.messages))
    started = [receiver]
    receiver.start()
    try:
        port = ports.get(timeout=30)
        sender = spawn.Process(target=_send, args=(keys, port, results, args.messages, k,
                                                   args.size, args.nap))
        started.append(sender)
        sender.start()
        cpu = {who: (seconds, n) for who, seconds, n in
               (results.get(timeout=120) for _ in range(2))}
    finally:
        for p in started:  # stopped by their PIDs, whatever happened
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    received = cpu["receiver"][1]
    if received != args.messages:
        raise RuntimeError(f"{args.messages - received} of {args.messages} messages were "
                           f"not received")
    envelopes = args.messages * k
    return {"per_message": k, "messages": args.messages, "envelope_bytes": args.size,
            "sender_us_per_envelope": round(cpu["sender"][0] / envelopes * 1e6, 2),
            "receiver_us_per_envelope": round(cpu["receiver"][0] / envelopes * 1e6, 2),
            "us_per_envelope": round((cpu["sender"][0] + cpu["receiver"][0])
                                     / envelopes * 1e6, 2)}


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    by_k = {}
    for k in sorted({r["per_message"] for r in rows}):
        mine = [r["us_per_envelope"] for r in rows if r["per_message"] == k]
        by_k[str(k)] = spread(mine)
    return {"us_per_envelope": by_k}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    ks = list(args.per_message)
    for n in range(args.rounds):
        for k in ks[n % len(ks):] + ks[:n % len(ks)]:  # each k leads in turn
            row = one_run(k, args)
            row["round"] = n
            rows.append(row)
            print(row, flush=True)
    summary = {"settings": vars(args), **summarize(rows)}
    with open(out / "runs.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for k, s in summary["us_per_envelope"].items():
        print(f"{k:>3} envelopes a message: {s['median']} us of CPU an envelope "
              f"({s['min']}-{s['max']})")
    print(f"wrote {out}/runs.csv, summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
