"""The ingress: the base-case producer (paper 3.1.2, Figure 4 action 3).

It numbers inputs 1, 2, 3, ..., routes each to one stage-1 partition, and
sends it to *both* replicas of that partition; each replica acks it back.
A tuple leaves the buffer once both replicas hold it, so the buffer bounds
how far the two replicas may drift apart. One bounded buffer per partition:
a full one stops the source (back-pressure), it never drops an input.

A source that interleaves several partitions of its own (Kafka's) may
interleave them otherwise after a restart; every input that may have
influenced a committed output must get its SN again (DESIGN 10). With
``log_inputs`` the ingress holds each accepted input until the runtime says
the assignment of SNs up to it is durable (``inputs_logged``): nothing
leaves before it is in the input log, so the sink can only ever see outputs
of logged inputs, and a restart replays the log's order.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Iterable, List, Optional, Sequence, Set, Tuple

from flux.addresses import Addr, P, S
from flux.protocol.buffer import Buffer
from flux.control_messages import SegmentStats
from flux.data_messages import Ack, Credit, CSync, Pause
from flux.effects import CutChosen, Send
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.operator import describe
from flux.protocol.producer import ACK, SEND, BufferFactory, Producer
from flux.sequence import NO_PROGRESS, SN, input_sn

INGRESS = Addr(0, 0, P)


class Ingress:
    """Accepts the source's records in order and feeds both replicas of stage 1."""

    def __init__(
        self,
        partitions: int,
        route: Callable[[Any], int],
        capacity: int,
        batch_size: int,
        buffer_factory: BufferFactory = Buffer,
        absent: Iterable[Addr] = (),
        window: Optional[int] = None,
        log_inputs: bool = False,
    ):
        """``absent``: stage-1 replicas that never exist (replication "none", DESIGN 7);
        ``window``: tuples each stage-1 replica may hold untaken (back-pressure);
        ``log_inputs``: inputs leave only once logged (``inputs_logged``)."""
        self.addr = INGRESS
        self.route = route
        peers = [(Addr(1, i, P), Addr(1, i, S)) for i in range(partitions)]
        # 3.1.3: sends to and acks from both replicas
        self.out = Producer(self.addr, peers, capacity, batch_size, buffer_factory,
                            normal_modes=(SEND | ACK, SEND | ACK), absent=absent, window=window)
        self.accepted = 0
        self.capacity = capacity
        self.log_inputs = log_inputs
        #: inputs whose SN assignment is durable (all of them without an input log)
        self.logged = 0
        #: accepted inputs waiting for the log: (partition, SN, record), and per partition
        self.held: Deque[Tuple[int, SN, Any]] = deque()
        self.held_for = [0] * partitions

    def stats(self) -> SegmentStats:
        """Counters for monitoring, as a segment's: inputs accepted, tuples
        buffered (not yet held by both replicas), in flight and full windows."""
        in_flight, blocked = self.out.window_use()
        return SegmentStats(self.addr, self.accepted, self.accepted, 0, self.out.buffered(),
                            in_flight, blocked)

    # -- the source side ---------------------------------------------------
    def frontier(self) -> SN:
        """Every input not sent yet will get an SN above this: with an input log, inputs
        held for it are not sent yet."""
        last = min(self.accepted, self.logged) if self.log_inputs else self.accepted
        return input_sn(last) if last else NO_PROGRESS

    def can_accept(self, record: Any) -> bool:
        return not self._full_for(self.route(record))

    def _full_for(self, i: int) -> bool:
        held = self.held_for[i]
        return self.out.full_for(i) or (held and len(self.out.buffers[i]) + held >= self.capacity)

    def accept(self, record: Any) -> Optional[SN]:
        """Figure 3 action 1; None (back-pressure) when the partition's buffer is full."""
        try:
            i = self.route(record)
        except Exception as exc:
            raise self._key_error(self.accepted + 1, exc) from exc
        if self._full_for(i):
            return None
        self.accepted += 1
        sn = (self.accepted,)  # input_sn(accepted), >= 1 by construction
        if self.log_inputs:
            self.held.append((i, sn, record))
            self.held_for[i] += 1
        else:
            self.out.put(i, sn, record)
        return sn

    def accept_many(self, records: Sequence[Any]) -> int:
        """``accept`` for each of ``records`` in order until one meets back-pressure;
        returns how many were accepted (one call a run of inputs, the guard
        asked of the partition's buffer straight)."""
        if self.log_inputs:
            n = 0
            for record in records:
                if self.accept(record) is None:
                    break
                n += 1
            return n
        route, buffers, put = self.route, self.out.buffers, self.out.put
        first = accepted = self.accepted
        try:
            for record in records:
                try:  # the user's key only: a fault of the buffers is not theirs
                    i = route(record)
                except Exception as exc:
                    raise self._key_error(accepted + 1, exc) from exc
                if buffers[i].full():
                    break
                accepted += 1
                put(i, (accepted,), record)
        finally:  # a key that raises leaves what went before accepted
            self.accepted = accepted
        return accepted - first

    def _key_error(self, n: int, exc: Exception) -> OperatorError:
        """The first stage's key raised on input ``n``: user code, as an operator's error
        in a segment (the job stops with it, naming the input)."""
        return OperatorError("the partition key of the next stage", self.addr.stage,
                             self.addr.partition, input_sn(n), describe(exc))

    def log_due(self) -> bool:
        """Are inputs waiting for the input log?"""
        return self.log_inputs and self.logged < self.accepted

    def inputs_logged(self, n: int) -> List:
        """The SNs of inputs 1..n and their source positions are durable: they may leave."""
        if not self.log_inputs:
            raise LocalProtocolError("inputs logged by an ingress without an input log")
        if not self.logged <= n <= self.accepted:
            raise LocalProtocolError(f"inputs logged up to {n}: {self.logged} were logged, "
                                     f"{self.accepted} accepted")
        held = self.held
        while held and held[0][1][0] <= n:
            i, sn, record = held.popleft()
            self.held_for[i] -= 1
            self.out.put(i, sn, record)
        self.logged = n
        return []

    def choose_cut(self, number: int) -> List:
        """Checkpoint ``number`` covers every input accepted so far (DESIGN 10): the cut
        travels on every batch from here on."""
        if self.out.cut is not None and number <= self.out.cut[0]:
            raise LocalProtocolError(f"checkpoint {number} after checkpoint {self.out.cut[0]}")
        self.out.cut = (number, self.accepted)
        return [CutChosen(number, self.accepted)]

    # -- the dataflow side: it flushes its connections, its only local work ----------
    def flushable(self):
        return self.out.flushable(self.frontier())

    def flush(self, i: int, d: int) -> List[Send]:
        send = self.out.flush(i, d, self.frontier())
        return [send] if send else []

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, Ack):
            self.out.on_ack(src, msg)
            return []
        if isinstance(msg, Credit):
            self.out.on_credit(src, msg)
            return []
        if isinstance(msg, Pause):
            return self.out.on_pause(src, msg)
        if isinstance(msg, CSync):
            return self.out.on_csync(src, msg)
        raise RemoteProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")

    def ready_for(self, src: Addr, msg) -> bool:
        """A guarded control message waits at the head of its connection (DESIGN 4.4)."""
        return not isinstance(msg, CSync) or self.out.can_accept_csync(src, msg)

    def on_fail(self, dead: Set[Addr]) -> List[Send]:
        """Figure 4 action 3 for every dead stage-1 replica."""
        self.out.fail_addresses(dead)
        return []

    def on_avail(self, avail, peer_mover=None) -> List:
        self.out.on_avail(avail.addr, avail.version)
        return []

    def idle(self) -> bool:
        return self.out.idle()

    def check_invariants(self) -> None:
        self.out.check_invariants()

