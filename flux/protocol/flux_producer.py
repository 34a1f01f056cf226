"""F-Prod: the top of a segment (paper 5.1, 5.2; Figure 7).

Replica r of producer partition j sends data to its *primary* consumers (the
replica r of every consumer partition: same dataflow) and takes acks from its
*secondary* consumers (replica 1-r: the dual dataflow). A tuple is evicted
once produced, sent to the primary and acked by the secondary:
``del_i = {PROD, PRIM, SEC}`` (5.1).

Take-over (5.2): a dead consumer replica is dropped from the buffer like at
the ingress (Figure 4 action 3); a ``reverse`` from a secondary consumer,
whose data came from this producer's dead dual, turns that connection into a
sending one. The buffer's duplicate filter keeps what the secondary already
holds from being sent again.

The egress is a consumer partition whose replica S never exists: it is dead
from the start, so replica P sends to the egress and replica S takes its acks,
exactly the S-Prod of 3.1.2.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

from flux.addresses import Addr, other
from flux.protocol.buffer import SEC, Buffer
from flux.control_messages import Avail, TakeoverDone
from flux.data_messages import Ack, Credit, CSync, Pause, Reverse
from flux.effects import Send
from flux.protocol.producer import ACK, DEAD, SEND, BufferFactory, Producer
from flux.sequence import SN


class FluxProducer:
    """F-Prod of replica ``addr.replica`` of producer partition ``addr.partition``."""

    def __init__(
        self,
        addr: Addr,
        consumers: Sequence[Tuple[Addr, Addr]],
        capacity: int,
        batch_size: int,
        absent: Set[Addr] = frozenset(),
        buffer_factory: BufferFactory = Buffer,
        window: Optional[int] = None,
    ):
        """``consumers[i]`` is (replica P, replica S) of consumer partition i;
        ``absent`` lists consumer replicas that never exist (the egress's S);
        ``window``: tuples each consumer may hold untaken (back-pressure)."""
        r = addr.replica
        peers = [(pair[r], pair[other(r)]) for pair in consumers]
        self.addr = addr
        self.dual = Addr(addr.stage, addr.partition, other(r))
        # 5.1: data only to the primary consumer, acks only from the secondary consumer
        self.out = Producer(addr, peers, capacity, batch_size, buffer_factory,
                            normal_modes=(SEND, ACK), absent=absent, window=window)
        self.p_fail = False
        self.r_done = [False] * len(peers)
        self._takeover_reported = False
        self.put = self.out.put  # one call per output, not two
        self.put_outputs = self.out.put_outputs

    # -- events ------------------------------------------------------------
    def on_ack(self, src: Addr, msg: Ack) -> None:
        self.out.on_ack(src, msg)

    def on_credit(self, src: Addr, msg: Credit) -> None:
        self.out.on_credit(src, msg)

    def on_reverse(self, src: Addr, msg: Reverse) -> List:
        """5.2 (replaces Figure 4-(2)): conn_i[SEC] := {SEND}; r_done_i; del_i += {SEC}."""
        i = self.out.reverse(src, msg.hwm)
        self.r_done[i] = True
        return self._report_takeover()

    def on_fail(self, dead: Set[Addr]) -> List:
        """fail(): dead consumer replicas as at the ingress; note a dead dual (p_fail)."""
        self.out.fail_addresses(dead)
        if self.dual in dead:
            self.p_fail = True
        return self._report_takeover()

    # -- take-over completion (DESIGN 4.5) ---------------------------------
    def takeover_done(self) -> bool:
        """Every secondary consumer is dead or has reversed to this replica."""
        return self.p_fail and all(
            self.r_done[i] or self.out.status(i, SEC) is DEAD for i in range(len(self.r_done))
        )

    def _report_takeover(self) -> List:
        if not self._takeover_reported and self.takeover_done():
            self._takeover_reported = True
            return [TakeoverDone(self.addr)]
        return []

    # -- catch-up (5.3) ------------------------------------------------------
    def on_avail(self, avail: Avail) -> None:
        """Figure 5 avail(dest) for a consumer replica of ours."""
        self.out.on_avail(avail.addr, avail.version)

    def on_pause(self, src: Addr, msg: Pause) -> List[Send]:
        return self.out.on_pause(src, msg)

    def ready_for_csync(self, src: Addr, msg: CSync) -> bool:
        return self.out.can_accept_csync(src, msg)

    def on_csync(self, src: Addr, msg: CSync) -> List:
        return self.out.on_csync(src, msg)

    def replay_fail(self, dead: Set[Addr]) -> None:
        """A failure seen while this new replica waited for its state, applied over the
        installed buffers (they may be older): drop those consumers, nothing else."""
        self.out.fail_addresses(dead)

    def replay_avail(self, avail: Avail) -> None:
        """An avail seen while waiting for the state: a standby for a consumer the
        installed state still has DEAD."""
        self.out.on_avail(avail.addr, avail.version, only_if_dead=True)

    def psyncs(self, version: int) -> List[Send]:
        """5.3.2 at the new replica: psync to every live consumer."""
        return self.out.psyncs(version)

    def end_catchup(self, version: int) -> List[Send]:
        """5.3.2 at the active: psync to every consumer; stop forwarding to secondaries."""
        effects = self.out.psyncs(version)
        self.out.restore_secondaries()
        self.p_fail = False
        self.r_done = [False] * len(self.r_done)
        self._takeover_reported = False
        return effects

    def get_state(self) -> list:
        """Every buffer with the status of its two destinations."""
        return self.out.to_state()

    def install_state(self, state: list, reverse: bool) -> None:
        """Install the active's buffers, reversed at a new replica (5.3)."""
        self.out.install_state(state, reverse)
        self.p_fail = False
        self.r_done = [False] * len(self.r_done)

    # -- sending -----------------------------------------------------------
    def put(self, i: int, sn: SN, item) -> None:
        self.out.put(i, sn, item)  # (bound straight to the producer's in __init__)

    def put_outputs(self, sn: SN, outputs: list, routes: list) -> None:
        self.out.put_outputs(sn, outputs, routes)  # (bound likewise)

    def full(self) -> bool:
        return self.out.full()

    def input_room(self) -> int:
        return self.out.input_room()

    def flushable(self, frontier: SN):
        return self.out.flushable(frontier)

    def flush(self, i: int, d: int, frontier: SN) -> Optional[Send]:
        return self.out.flush(i, d, frontier)

    def idle(self) -> bool:
        return self.out.idle()

    def buffered(self) -> int:
        return self.out.buffered()

    def window_use(self) -> Tuple[int, int]:
        return self.out.window_use()

    def check_invariants(self) -> None:
        self.out.check_invariants()
