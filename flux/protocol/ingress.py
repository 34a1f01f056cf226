"""The ingress: the base-case producer (paper 3.1.2, Figure 4 action 3).

It numbers inputs 1, 2, 3, ... and cuts them into items (DESIGN 11): at most
``batch_rows`` inputs, or fewer when the runtime lets the pending ones go
(``cut_item``: once they waited ``item_delay`` and stage 1 took the items before
them). Item x is numbered by its last input; its rows are
routed to the stage-1 partitions, one sub-item per partition that gets rows,
with the connection SN ``(x, 0)``, sent to *both* replicas of that partition;
each replica acks it back. A sub-item leaves the buffer once both replicas
hold it, so the buffer bounds how far the two replicas may drift apart. One
bounded buffer per partition: a full one stops the source (back-pressure), it
never drops an input.

A source that interleaves several partitions of its own (Kafka's) may
interleave them otherwise after a restart; every input that may have
influenced a committed output must get its SN again (DESIGN 10). With
``log_inputs`` the ingress holds each item until the runtime says the
assignment of SNs up to it is durable (``inputs_logged``): nothing leaves
before it is in the input log, so the sink can only ever see outputs of logged
inputs, and a restart replays the log's order.

Several ingresses, one per source partition, number in epochs (``EpochIngress``,
DESIGN 12): this class is the one ingress, numbering 1, 2, 3, ...
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterable, List, Optional, Sequence, Set, Tuple

from exchange.group_load import GroupLoad
from exchange.group_map import GroupMove, stage_moves
from exchange.routing import RouteRefused, moved, routed
from exchange.rows import NumberedRows
from flux.addresses import Addr, P, S
from flux.protocol.buffer import Buffer
from flux.protocol.cuts import after_move_cut
from flux.control_messages import SegmentStats
from flux.data_messages import Ack, Credit, CSync, Pause
from flux.effects import CutChosen, Send
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.operator import describe
from flux.protocol.pending_inputs import PendingInputs
from flux.protocol.producer import ACK, PAUSE_ROOM, SEND, BufferFactory, Producer
from flux.sequence import NO_PROGRESS, SN, input_sn

INGRESS = Addr(0, 0, P)


def ingress_addr(index: int = 0) -> Addr:
    """The address of ingress ``index`` (one per source partition read in parallel)."""
    return Addr(0, index, P)


def _sub_items(router, partitions: int, first: int, pending: PendingInputs,
               addr: Addr = INGRESS, load: Optional[GroupLoad] = None
               ) -> List[Optional[NumberedRows]]:
    """Inputs numbered from ``first``, in the form stage 1 takes and routed to its
    ``partitions`` by its key (a run at a time; ``load`` counts them per key group). The
    key is user code: what it refuses stops the job as an operator's error in a segment
    would, naming the input."""
    try:
        rows, routes = routed(router, pending.rows(first), partitions, load)
    except RouteRefused as refused:
        raise OperatorError(refused.what, addr.stage, addr.partition,
                            input_sn(first + refused.row),
                            describe(refused.error)) from refused.error
    return [rows] if routes is None else rows.split(routes, partitions)


class Stage1Connections:
    """The ingress's side toward stage 1 (3.1.2): its connections, which it flushes (its
    only local work), the messages and views of the stage-1 replicas. A subclass says
    where its items stand (``frontier``)."""

    out: Producer
    addr: Addr

    def frontier(self) -> SN:
        """Every item not sent yet will get an SN above this (DESIGN 4.3)."""
        raise NotImplementedError

    def _producer(self, peers, capacity: int, batch_size: int, buffer_factory: BufferFactory,
                  absent: Iterable[Addr], window: Optional[int], pause_room: int) -> Producer:
        """3.1.3: the one ingress sends to and takes acks from both replicas of each pair
        (a replica of a pair of ingresses is a producer replica as a segment's is)."""
        return Producer(self.addr, peers, capacity, batch_size, buffer_factory,
                        normal_modes=(SEND | ACK, SEND | ACK), absent=absent, window=window,
                        pause_room=pause_room)

    def flushable(self):
        return self.out.flushable(self.frontier())

    def flush(self, i: int, d: int) -> List[Send]:
        send = self.out.flush(i, d, self.frontier())
        return [send] if send else []

    def keeps_up(self, i: int, d: int) -> bool:
        return self.out.keeps_up(i, d)

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, Ack):
            self.out.on_ack(src, msg)
            return self._forget_moves()
        if isinstance(msg, Credit):
            self.out.on_credit(src, msg)
            return self._forget_moves()
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

    def on_join(self, partitions) -> List:
        """Dormant stage-1 partitions run from now (docs/design/rescaling.md)."""
        for i in partitions:
            self.out.join(i)
        return []

    def on_leave(self, partitions, cut: tuple = ()) -> List:
        """Stage-1 partitions left (docs/design/rescaling.md)."""
        for i in partitions:
            self.out.leave(i)
        return []


class Ingress(Stage1Connections):
    """Accepts the source's records in order, cuts them into items and feeds both
    replicas of stage 1."""

    def __init__(
        self,
        partitions: int,
        router: Any,
        capacity: int,
        batch_size: int,
        buffer_factory: BufferFactory = Buffer,
        absent: Iterable[Addr] = (),
        window: Optional[int] = None,
        log_inputs: bool = False,
        batch_rows: int = 1024,
        pause_room: int = PAUSE_ROOM,
        index: int = 0,
        replica: int = P,
        dormant: Iterable[int] = (),
    ):
        """``absent``: stage-1 replicas that never exist (replication "none", DESIGN 7);
        ``window``: sub-items each stage-1 replica may hold untaken (back-pressure);
        ``log_inputs``: items leave only once logged (``inputs_logged``);
        ``batch_rows``: the most inputs an item holds; ``pause_room``: see ``Producer``;
        ``index``: which of several ingresses (``EpochIngress``); ``replica``: which of a
        pair of ingresses (``flux.protocol.ingress_pair``); ``dormant``: stage-1 partitions
        not running yet (docs/design/rescaling.md)."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        self.addr = Addr(0, index, replica)
        self.index = index
        #: stage 1's key and input form (``exchange.routing``)
        self.router = router
        peers = [(Addr(1, i, P), Addr(1, i, S)) for i in range(partitions)]
        self.out = self._producer(peers, capacity, batch_size, buffer_factory, absent, window,
                                  pause_room)
        self.out.sleep(dormant)
        self.partitions = partitions
        self.batch_rows = batch_rows
        #: the number of the last input accepted (with one ingress: how many)
        self.accepted = 0
        #: how many inputs it accepted, and how many it routed to each key group of
        #: stage 1 (the rebalancing policy's load)
        self.inputs = 0
        self.routed = GroupLoad()
        self.capacity = capacity
        self.log_inputs = log_inputs
        #: accepted inputs not yet in an item
        self.pending = PendingInputs()
        #: the number of the last item cut (its last input; 0: none yet)
        self.last_item = 0
        #: items up to this number may leave (all of them without an input log)
        self.logged = 0
        #: items cut and waiting for the log: (item number, sub-item per partition)
        self.held: Deque[Tuple[int, List[Optional[NumberedRows]]]] = deque()
        self.held_for = [0] * partitions

    def stats(self) -> SegmentStats:
        """Counters for monitoring, as a segment's: inputs accepted, sub-items
        buffered (not yet held by both replicas), in flight and full windows."""
        in_flight, blocked = self.out.window_use()
        return SegmentStats(self.addr, self.inputs, self.inputs, 0, self.out.buffered(),
                            in_flight, blocked, self.routed.totals())

    # -- the source side ---------------------------------------------------
    def frontier(self) -> SN:
        """Every item not sent yet will get an SN above this (DESIGN 4.3): with an input
        log, items held for it are not sent yet."""
        last = self.held[0][0] - 1 if self.held else self.last_item
        return (last,) if last else NO_PROGRESS

    def can_accept(self, record: Any = None) -> bool:
        """Is there room for one more input? (An item's worth waits for a buffer.)"""
        return len(self.pending) < self.batch_rows or self.can_cut()

    def pending_rows(self) -> int:
        return len(self.pending)

    def all_taken(self) -> bool:
        return self.out.all_taken()

    def can_cut(self) -> bool:
        """Inputs pending, and room for their item in every partition's buffer."""
        if not self.pending:
            return False
        buffers, held_for = self.out.buffers, self.held_for
        for i, buffer in enumerate(buffers):
            if buffer.full() or (held_for[i] and len(buffer) + held_for[i] >= buffer.capacity):
                return False
        return True

    def accept(self, record: Any) -> Optional[SN]:
        """Figure 3 action 1: the input's SN, or None (back-pressure) when its item is
        full and cannot leave; a full item leaves at once when it can."""
        if (len(self.pending) >= self.batch_rows or not self.pending.takes([record])) \
                and not self.cut_item():
            return None
        number = self.accepted + 1  # >= 1 by construction (a full item may leave in _take)
        self._take([record])
        return (number,)

    def accept_many(self, records: Any) -> int:
        """``accept`` for each of ``records`` in order until one meets back-pressure;
        returns how many were accepted (a run at a time, up to a full item).
        ``records``: a list of records, or an Arrow batch whose rows are the inputs (a
        columnar source's); the pending item is cut first if it holds the other kind."""
        n, total = 0, len(records)
        while n < total:
            room = self.batch_rows - len(self.pending)
            if room <= 0 or not self.pending.takes(records):
                # a full item, or one of the other kind: it leaves, or back-pressure stops
                if not self.cut_item():
                    break
                continue
            run = records[n:n + room]
            self._take(run)
            n += len(run)
        return n

    def _take(self, records: Any) -> None:
        """Accepted inputs, in order, into the pending item; a full one leaves when it can."""
        self.accepted += len(records)
        self.inputs += len(records)
        self.pending.add(records)
        if len(self.pending) >= self.batch_rows:
            self.cut_item()

    def cut_item(self, force: bool = False) -> int:
        """Make the pending inputs an item and buffer its sub-items (DESIGN 11); returns
        the item's number (its last input), or 0 when nothing is pending or a buffer has
        no room (back-pressure). ``force``: with or without room (a checkpoint's cut)."""
        if not (self.can_cut() or (force and self.pending)):
            return 0
        x = self.accepted
        subs = _sub_items(self.router, self.partitions, x - len(self.pending) + 1, self.pending,
                          self.addr, self.routed)
        self.pending.clear()
        self.last_item = x
        if self._waits_for_log(x):  # its inputs are not all in the log yet
            self.held.append((x, subs))
            for i, sub in enumerate(subs):
                if sub is not None:
                    self.held_for[i] += 1
        else:
            self._put(x, subs)
        return x

    def _waits_for_log(self, x: int) -> bool:
        """Must item ``x`` wait for the input log before it leaves (DESIGN 10)?"""
        return self.log_inputs and x > self.logged

    def _put(self, x: int, subs: List[Optional[NumberedRows]]) -> None:
        put, sn = self.out.put, (x, self.index)
        for i, sub in enumerate(subs):
            if sub is not None:
                put(i, sn, sub)

    def resume_after(self, n: int) -> None:
        """A restart from a checkpoint of inputs 1..n: numbering goes on from n + 1."""
        if self.accepted or self.pending:
            raise LocalProtocolError("resume of an ingress that accepted inputs")
        self.accepted = self.last_item = self.logged = self.inputs = n

    def log_due(self) -> bool:
        """Are items waiting for the input log?"""
        return self.log_inputs and bool(self.held)

    def inputs_logged(self, n: int) -> List:
        """The SNs of inputs 1..n and their source positions are durable: the items they
        complete may leave."""
        if not self.log_inputs:
            raise LocalProtocolError("inputs logged by an ingress without an input log")
        if not self.logged <= n <= self.accepted:
            raise LocalProtocolError(f"inputs logged up to {n}: {self.logged} were logged, "
                                     f"{self.accepted} accepted")
        self._release_logged(n)
        return []

    def _release_logged(self, n: int) -> None:
        """Items up to ``n`` are logged: those held for it leave."""
        held = self.held
        while held and held[0][0] <= n:
            x, subs = held.popleft()
            for i, sub in enumerate(subs):
                if sub is not None:
                    self.held_for[i] -= 1
            self._put(x, subs)
        self.logged = n

    def _forget_moves(self) -> List:
        """The move cuts every stage-1 replica crossed are told no more (DESIGN 13)."""
        out = self.out
        if out.move_cuts:
            out.move_cuts = after_move_cut(out.move_cuts, out.moves_forgettable())
        return []

    def choose_cut(self, number: int, moves: Sequence[GroupMove] = ()) -> List:
        """Checkpoint ``number`` covers every input accepted so far (DESIGN 10): the cut
        travels on every batch from here on, with the live ``moves`` of key groups that
        take effect at it (DESIGN 13): the inputs after it go to stage 1 by the map after
        its moves, and every stage's producers switch as they cross it."""
        if self.out.cut is not None and number <= self.out.cut[0]:
            raise LocalProtocolError(f"checkpoint {number} after checkpoint {self.out.cut[0]}")
        if self.pending:  # a cut lies between items: the pending inputs are the last one,
            self.cut_item(force=True)  # with or without room (a buffer holds one item more at most)
        if moves:
            self.out.move_cuts += ((number, self.accepted, tuple(moves)),)
        self.out.cut = (number, self.accepted)
        self.router = moved(self.router, stage_moves(moves, 1))
        return [CutChosen(number, self.accepted)]

    def items_left(self) -> bool:
        """Every input accepted is in an item that left: none pending, none held for the
        input log (or, in a pair, for the twin: until it acked, a take-over may cut them
        otherwise)."""
        return not self.pending and not self.held

    def idle(self) -> bool:
        """Nothing waits in a buffer, for an item or for the input log."""
        return self.out.idle() and not self.pending and not self.held

    def check_invariants(self) -> None:
        self.out.check_invariants()

