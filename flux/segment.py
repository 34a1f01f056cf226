"""A dataflow segment: F-Cons -> operator chain -> F-Prod (paper 3.1.1, 5).

One replica of one partition of one stage. The segment numbers outputs
(DESIGN 4.1: the k-th output of input ``s`` is ``s + (k,)``), routes each to
its consumer partition, and computes the progress bound it may promise
downstream from what is really pending (DESIGN 4.3).
"""
from __future__ import annotations

from typing import Any, Callable, List, Set

from flux.flux_consumer import FluxConsumer
from flux.flux_producer import FluxProducer
from flux.messages import Ack, Addr, Batch, ProtocolError, Reverse
from flux.sequence import output_sn


class Segment:
    """The machines and operators of one partition replica of one stage."""

    def __init__(
        self,
        addr: Addr,
        consumer: FluxConsumer,
        chain: Any,
        producer: FluxProducer,
        route: Callable[[Any], int],
    ):
        self.addr = addr
        self.fcons = consumer
        self.chain = chain
        self.fprod = producer
        self.route = route

    # -- messages ------------------------------------------------------------
    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, Batch):
            return self.fcons.on_batch(src, msg)
        if isinstance(msg, Ack):
            self.fprod.on_ack(src, msg)
            return []
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg)
        raise ProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")

    def on_fail(self, dead: Set[Addr]) -> List:
        return self.fcons.on_fail(dead) + self.fprod.on_fail(dead)

    # -- local work ------------------------------------------------------------
    def can_process(self) -> bool:
        """Figure 3 action 1's guard: room in the buffers and an input the merge releases."""
        return not self.fprod.full() and self.fcons.merge.ready()

    def process(self) -> int:
        """Run the next input through the operators; returns how many outputs it made."""
        sn, record = self.fcons.merge.pop()
        outputs = self.chain.process(record)
        for k, out in enumerate(outputs, 1):
            self.fprod.put(self.route(out), output_sn(sn, k), out)
        return len(outputs)

    def flushable(self):
        return self.fprod.flushable(self.fcons.merge.frontier())

    def flush(self, i: int, d: int) -> List:
        send = self.fprod.flush(i, d, self.fcons.merge.frontier())
        return [send] if send else []

    def idle(self) -> bool:
        return self.fcons.idle() and self.fprod.idle()

    def check_invariants(self) -> None:
        self.fprod.check_invariants()
