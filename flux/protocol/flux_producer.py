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

F-Prod owns what take-over adds to the abstract producer of Figure 3 (``p_fail``,
``r_done``); everything else is the producer's own interface, reached through ``out``
(``fprod.out.flush(...)``, ``fprod.out.on_ack(...)``): one object, not a copy of its
methods.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

from flux.addresses import Addr, other
from flux.protocol.buffer import PRIM, SEC, Buffer
from flux.control_messages import Avail, TakeoverDone
from flux.data_messages import Restore, Restored, Reverse, Stay
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.producer import ACK, DEAD, PAUSE_ROOM, SEND, BufferFactory, Producer


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
        pause_room: int = PAUSE_ROOM,
        to_writer: bool = False,
        dormant=(),
        partitioned: bool = True,
    ):
        """``consumers[i]`` is (replica P, replica S) of consumer partition i;
        ``absent`` lists consumer replicas that never exist (the egress's S);
        ``window``: tuples each consumer may hold untaken (back-pressure);
        ``pause_room``: see ``Producer``; ``to_writer``: the consumer is a sink's writer
        that acks both replicas at its commits (docs/design/parallel_io.md); ``dormant``:
        consumer partitions not running yet (docs/design/rescaling.md); ``partitioned``:
        the consumers are partitions (False: an egress)."""
        r = addr.replica
        peers = [(pair[r], pair[other(r)]) for pair in consumers]
        self.addr = addr
        self.dual = Addr(addr.stage, addr.partition, other(r))
        # 5.1: data only to the primary consumer, acks only from the secondary consumer;
        # a sink's writer acks its data source too, and only what its sink committed
        self.out = Producer(addr, peers, capacity, batch_size, buffer_factory,
                            normal_modes=(SEND | ACK if to_writer else SEND, ACK), absent=absent, window=window,
                            pause_room=pause_room, dormant=dormant, partitioned=partitioned)
        self.p_fail = False
        self.r_done = [False] * len(peers)
        self._takeover_reported = False

    # -- take-over events (5.2) ----------------------------------------------
    def on_reverse(self, src: Addr, msg: Reverse) -> List:
        """5.2 (replaces Figure 4-(2)): conn_i[SEC] := {SEND}; r_done_i; del_i += {SEC}."""
        i = self.out.reverse(src, msg.hwm, msg.held or ())
        self.r_done[i] = True
        return self._report_takeover()

    def on_restore(self, src: Addr, msg: Restore) -> List[Send]:
        """The hand-back's end (docs/design/handback.md): stop sending to the secondary
        ``src``, which takes data from its own side again, and say so after our last
        data to it."""
        self.out.restore(src)
        return [Send(self.addr, src, Restored(msg.version))]

    def on_stay(self, src: Addr, msg: Stay) -> List:
        """The secondary ``src`` we still forward to lost the new replica on its side
        before it handed back: it goes on taking our data, as a reverse would have it
        (5.2): r_done_i."""
        i, d = self.out.locate(src, SEND)
        if d != SEC:
            raise RemoteProtocolError(f"{self.addr}: stay from {src}, our primary consumer")
        self.r_done[i] = True
        return self._report_takeover()

    def on_writer_moved(self, writer: Addr) -> None:
        """The sink's writer starts again elsewhere (docs/design/parallel_io.md)."""
        self.out.writer_moved(writer)

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

    def replay_fail(self, dead: Set[Addr]) -> None:
        """A failure seen while this new replica waited for its state, applied over the
        installed buffers (they may be older): drop those consumers, nothing else."""
        self.out.fail_addresses(dead)

    def replay_avail(self, avail: Avail) -> None:
        """An avail seen while waiting for the state: a standby for a consumer the
        installed state still has DEAD."""
        self.out.on_avail(avail.addr, avail.version, only_if_dead=True)

    def end_catchup(self, version: int) -> List[Send]:
        """5.3.2 at the active: psync to every consumer. A consumer that reversed to us is
        handed back (docs/design/handback.md): we go on sending to it until its
        ``Restore``, so its output waits for no install of the new replica; a sink's
        writer is not (it acks at commits), and we stop forwarding to it here, as in
        the paper."""
        out = self.out
        forwards = ACK not in out.normal_modes[PRIM]
        effects = out.psyncs(version, forwards)
        if not forwards:
            out.restore_secondaries()
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
