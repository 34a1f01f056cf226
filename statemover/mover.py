"""The StateMover: moves a segment's whole state to a new replica (paper 3.3.1, 5.3.1).

One mover per node, "local to the machine, but in a separate thread outside
the dataflow" (3.3.1); this module is its sans-I/O core, and a driver owns the
thread and the sockets. Everything that affects a transfer lives here:

- The active segment asks for ``request_send`` (the paper's
  ``send(sm, send-req)``), the standby for ``request_recv``
  (``send(sm, recv-req)``), in any order. Each mover sends its peer a
  ``Handshake``; a mover that has both its local request and the peer's
  handshake emits ``SmReady`` (Figure 5 action 2).
- The active side then calls ``send(state)``: the mover emits every ``Chunk``,
  then a ``Trailer`` (chunk count, length, CRC-32 of the whole state), then
  ``StateSent``: the active's ``sm_done`` (Figure 5 action 4). The paper has no
  ack from the receiver, so neither do we.
- The receiver checks each chunk's index as it arrives and the trailer at the
  end; only then ``StateReceived`` (installState, then sm_done). Any mismatch
  is ``TransferFailed``: corrupt state is never delivered.
- Two-phase catch-up (docs/design/catchup.md): before ``send``, the active may call
  ``send_part(part)`` any number of times while it goes on processing. Each
  part is its chunks (indices from 0) and a ``PartTrailer`` (part number,
  count, length, CRC), checked like the final trailer; the receiver emits
  ``StatePart`` per part, answers with a ``PartAck`` (the sender signals
  ``PartAcked``: the active keeps a window of parts in flight and pauses only
  once every part is acknowledged), and stays open for more. Parts and the final state
  belong to one transfer id, so a part of an aborted attempt never mixes
  into a newer one, and a receiver that fails keeps no part.
- Transfer ids are unique per catch-up attempt (3.4, DESIGN 4.6) and all
  state is keyed by id, so messages of an older attempt never mix into a
  newer one.
- A link that loses envelopes (the transport reports the gap as ``LinkLost``, before
  the message after it) costs a resend, not the attempt (``statemover.resend``): every
  chunk and trailer is numbered, the sender keeps those not yet confirmed (a part's
  until its ``PartAck``, the final state's until the receiver's ``StateAck``: the
  transfer stays SENT until then, though ``StateSent`` was signalled at once), and the
  receiver asks for everything from the first it misses (``Nack``) and takes only the
  number it expects next. Data, or a ``Nack``, from a peer whose handshake was lost shows
  that the peer asked for the transfer: it readies it as the handshake would have. Only a
  loss with nothing after it on its link (no gap shown) is left to the catch-up's
  deadline. Without this, an attempt succeeded only if each of its few dozen envelopes
  arrived: at a fifth lost, never.
- Crashes make late messages normal: a message for an unknown, finished or
  aborted transfer, or from a dead peer, is dropped. A message that no live
  transfer could accept is a ``RemoteProtocolError``; a local call out of turn
  a ``LocalProtocolError``.
- Mover ids name one incarnation (DESIGN 4.4): a peer declared dead stays dead.

Checksum: ``zlib.crc32``, computed in one pass by the sender and streamed
chunk by chunk by the receiver. It guards against accidental corruption
(a driver bug, a bad buffer), not an adversary, at memory speed.
"""
from __future__ import annotations

import zlib
from typing import Any, Dict, Hashable, Iterable, Optional, Tuple

from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from statemover.messages import (
    Abort,
    Chunk,
    Handshake,
    LinkLost,
    Nack,
    PartAck,
    PartAcked,
    PartTrailer,
    Role,
    SmReady,
    StateAck,
    StateSent,
    Trailer,
    TransferFailed,
)
from statemover.receiving import CHECKSUM_MISMATCH, ReceiverSide
from statemover.resend import SendLog
from statemover.transfer import NUMBERED, RECV, SEND, TERMINAL, TRANSITIONS, Mode, Transfer

__all__ = ["CANCELLED", "CHECKSUM_MISMATCH", "DEFAULT_CHUNK_SIZE", "PEER_FAILED", "Mode",
           "StateMover", "TERMINAL", "TRANSITIONS"]

DEFAULT_CHUNK_SIZE = 1 << 20  # 1 MiB

#: Failure reasons that are not formatted with numbers.
CANCELLED = "cancelled"
PEER_FAILED = "peer failed"


class StateMover(ReceiverSide):
    """Moves states between this node and its peers, one transfer per catch-up attempt."""

    def __init__(self, me: Hashable, chunk_size: int = DEFAULT_CHUNK_SIZE):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.me = me
        self.chunk_size = chunk_size
        self.transfers: Dict[Hashable, Transfer] = {}
        self.dead: set = set()
        #: A peer's Handshake or Abort that came before our own request: (src, msg).
        self._early: Dict[Hashable, Tuple[Any, Any]] = {}
        #: peers whose link lost messages: from one of them a chunk or trailer out of turn
        #: is dropped (a resend brings it), and another message out of turn may follow a
        #: lost one, so it fails that transfer instead of the process
        self.lossy: set = set()

    # -- local events ------------------------------------------------------------
    def request_send(self, transfer: Hashable, peer: Hashable) -> list:
        """The active segment's ``send(sm, send-req)`` (Figure 5 action 1)."""
        return self._request(transfer, peer, SEND)

    def request_recv(self, transfer: Hashable, peer: Hashable) -> list:
        """The standby segment's ``send(sm, recv-req)`` (Figure 5 action 1)."""
        return self._request(transfer, peer, RECV)

    def send(self, transfer: Hashable, state) -> list:
        """The active's ``send(sm, st)``: chunks, trailer, then StateSent (action 4).

        Chunks are zero-copy slices of one immutable ``bytes``. After an abort
        this is a no-op: the failure was already reported, and the segment may
        have handed the state over before it saw that.
        """
        t = self._known(transfer)
        if t.mode is Mode.ABORTED:
            return []
        self._step(transfer, t, "send", LocalProtocolError)
        for other in self.transfers.values():  # one final state kept per peer: the memory
            if other.peer == t.peer and other.mode is Mode.SENT and other is not t:  # of one
                self._finish(other)  # whose ack was lost stays bounded
        data = state if type(state) is bytes else bytes(state)  # snapshot, never aliased
        effects = self._chunks(transfer, t, data)
        trailer = Trailer(transfer, len(effects), len(data), zlib.crc32(data), t.log.next_seq)
        effects.append(Send(self.me, t.peer, t.log.add(trailer)))
        effects.append(StateSent(transfer))
        return effects

    def send_part(self, transfer: Hashable, part) -> list:
        """One bulk part of a two-phase catch-up: its chunks and a ``PartTrailer``.

        The transfer stays READY: more parts, or ``send`` of the final state, follow.
        A no-op after an abort, like ``send``."""
        t = self._known(transfer)
        if t.mode is Mode.ABORTED:
            return []
        self._step(transfer, t, "part", LocalProtocolError)
        data = part if type(part) is bytes else bytes(part)
        effects = self._chunks(transfer, t, data)
        trailer = PartTrailer(transfer, t.parts, len(effects), len(data), zlib.crc32(data),
                              t.log.next_seq)
        effects.append(Send(self.me, t.peer, t.log.add(trailer)))
        t.parts += 1
        return effects

    def _chunks(self, transfer, t: Transfer, data: bytes) -> list:
        view, n, log = memoryview(data), self.chunk_size, t.log
        return [Send(self.me, t.peer, log.add(Chunk(transfer, i, view[off:off + n], log.next_seq)))
                for i, off in enumerate(range(0, len(data), n))]

    def cancel(self, transfer: Hashable, reason: str = CANCELLED) -> list:
        """Give up on ``transfer`` here and tell the peer; finished ones are left alone.

        Cancelling an id not requested yet leaves a tombstone, so a request that
        was racing with the cancel fails at once instead of waiting forever.
        """
        t = self.transfers.get(transfer)
        if t is None:
            self._early.pop(transfer, None)
            self.transfers[transfer] = Transfer(None, None, Mode.ABORTED, reason)
            return []
        if t.mode is Mode.SENT:
            return self._finish(t)
        if t.mode in TERMINAL:
            return []
        tell = [] if t.peer in self.dead else [Send(self.me, t.peer, Abort(transfer, reason))]
        return tell + self._abort(transfer, t, reason)

    def on_fail(self, dead_peers: Iterable[Hashable]) -> list:
        """Peers died (a controller view, 3.2.1): abort every live transfer with them."""
        dead = set(dead_peers)
        self.dead |= dead
        for transfer in [k for k, (src, _) in self._early.items() if src in dead]:
            del self._early[transfer]
        effects: list = []
        for transfer, t in self.transfers.items():
            if t.peer in dead and t.mode is Mode.SENT:
                self._finish(t)  # StateSent was reported: fail(X) is catch-up's job
            elif t.peer in dead and t.mode not in TERMINAL:
                effects += self._abort(transfer, t, PEER_FAILED)
        return effects

    # -- messages from peer movers ---------------------------------------------
    def link_lost(self, peer: Hashable, why: str) -> list:
        """Messages from ``peer`` were lost in transit: each live transfer it sends to us
        asks for everything from the first chunk or trailer it misses (``Nack``; ``why``
        is for the caller's log). What a receiver lost (an ack, a nack) is covered by
        what it sends next, so a sending transfer waits."""
        self.lossy.add(peer)
        return [Send(self.me, peer, Nack(transfer, t.seq)) for transfer, t in self.transfers.items()
                if t.peer == peer and t.role is RECV and t.mode not in TERMINAL]

    def on_message(self, src: Hashable, msg) -> list:
        """A message from mover ``src``; stale ones are dropped (crashes make them normal)."""
        if isinstance(msg, LinkLost):
            return self.link_lost(src, f"messages from {src} lost in transit "
                                       f"(#{msg.expected} to #{msg.got - 1})")
        handler = self._HANDLERS.get(type(msg))
        if handler is None:
            raise RemoteProtocolError(f"{self.me!r}: unknown message {msg!r} from {src!r}")
        if src in self.dead:
            return []  # fenced (DESIGN 4.4)
        t = self.transfers.get(msg.transfer)
        if t is None:
            if isinstance(msg, (Handshake, Abort)):  # our own request may still be coming
                prev = self._early.get(msg.transfer)
                if prev is None or not isinstance(prev[1], Abort):  # an abort is final
                    self._early[msg.transfer] = (src, msg)
            return []  # a chunk or trailer of an attempt we never had
        if t.mode in TERMINAL:
            return []  # late message of a finished or aborted attempt
        if src != t.peer:
            raise RemoteProtocolError(f"{self.me!r}: {msg!r} from {src!r}, but the peer is {t.peer!r}")
        try:
            if type(msg) in NUMBERED and src in self.lossy:
                ready = self._handshake_lost(msg.transfer, t)
                if msg.seq != t.seq:
                    return ready  # after a gap, or sent again: the Nack brings it in its turn
                return ready + handler(self, msg.transfer, t, msg)
            return handler(self, msg.transfer, t, msg)
        except RemoteProtocolError as exc:
            if src not in self.lossy:
                raise
            return self._abort(msg.transfer, t, f"out of turn after lost messages ({exc})")

    def _on_handshake(self, transfer, t: Transfer, msg: Handshake) -> list:
        if msg.role == t.role:
            raise RemoteProtocolError(f"{self.me!r}: both ends of {transfer!r} are in role {t.role!r}")
        self._step(transfer, t, "handshake")
        return [SmReady(transfer)]

    def _on_part_ack(self, transfer, t: Transfer, msg: PartAck) -> list:
        self._step(transfer, t, "part ack")
        if not t.acked <= msg.part < t.parts:  # FIFO: acks come in order, once each
            raise RemoteProtocolError(f"{self.me!r}: ack of part {msg.part} of {transfer!r}, "
                                      f"expected {t.acked} of {t.parts} sent")
        first, t.acked = t.acked, msg.part + 1  # cumulative: an ack lost on the way is in it
        t.log.confirm_part(msg.part)
        return [PartAcked(transfer, p) for p in range(first, t.acked)]

    def _on_nack(self, transfer, t: Transfer, msg: Nack) -> list:
        """The receiver misses messages from number ``msg.seq`` on: send them again. In
        REQUESTED, from a peer whose messages were lost: its handshake was."""
        if t.role is not SEND or (t.mode is Mode.REQUESTED and t.peer not in self.lossy):
            raise RemoteProtocolError(f"{self.me!r}: {msg!r} in {t.mode.name} for {t.role} "
                                      f"transfer {transfer!r}")
        ready = [SmReady(transfer)] if t.mode is Mode.REQUESTED else []
        self._step(transfer, t, "nack")
        again = t.log.since(msg.seq)
        if again is None:
            raise RemoteProtocolError(f"{self.me!r}: {msg!r}, but messages #{t.log.base} to "
                                      f"#{t.log.next_seq} are those kept")
        return ready + [Send(self.me, t.peer, m) for m in again]

    def _on_state_ack(self, transfer, t: Transfer, msg: StateAck) -> list:
        self._step(transfer, t, "state ack")
        t.log.clear()
        return []

    def _on_abort(self, transfer, t: Transfer, msg: Abort) -> list:
        if t.mode is Mode.SENT:
            return self._finish(t)  # the receiver gave up after we had finished
        return self._abort(transfer, t, f"peer aborted: {msg.reason}")

    _HANDLERS = {Handshake: _on_handshake, Chunk: ReceiverSide._on_chunk,
                 Trailer: ReceiverSide._on_trailer, PartTrailer: ReceiverSide._on_part_trailer,
                 PartAck: _on_part_ack, Abort: _on_abort, Nack: _on_nack,
                 StateAck: _on_state_ack}

    # -- helpers -----------------------------------------------------------------
    def _request(self, transfer, peer, role: Role) -> list:
        t = self.transfers.get(transfer)
        if t is not None and t.role is not None:
            raise LocalProtocolError(f"{self.me!r}: transfer {transfer!r} was already requested")
        if peer == self.me:
            raise LocalProtocolError(f"{self.me!r}: transfer {transfer!r} to itself")
        early = self._early.get(transfer)
        if early is not None and early[0] != peer:
            raise RemoteProtocolError(f"{self.me!r}: {early[1]!r} came from {early[0]!r}, not {peer!r}")
        if early is not None and getattr(early[1], "role", None) == role:
            raise RemoteProtocolError(f"{self.me!r}: both ends of {transfer!r} are in role {role!r}")
        if t is not None:  # cancelled before it was requested
            t.role, t.peer = role, peer
            return [TransferFailed(transfer, t.reason)]
        t = self.transfers[transfer] = Transfer(role, peer, log=SendLog() if role is SEND else None)
        if peer in self.dead:
            return self._abort(transfer, t, PEER_FAILED)
        self._early.pop(transfer, None)
        if early is not None and isinstance(early[1], Abort):
            return self._on_abort(transfer, t, early[1])  # the peer gave up first
        effects: list = [Send(self.me, peer, Handshake(transfer, role))]
        if early is not None:
            effects += self._on_handshake(transfer, t, early[1])
        return effects

    def _known(self, transfer) -> Transfer:
        t = self.transfers.get(transfer)
        if t is None or t.role is None:
            raise LocalProtocolError(f"{self.me!r}: transfer {transfer!r} was never requested")
        return t

    def _step(self, transfer, t: Transfer, event: str, error=RemoteProtocolError) -> None:
        nxt = TRANSITIONS.get((t.role, t.mode, event))
        if nxt is None:
            raise error(f"{self.me!r}: {event} in {t.mode.name} for {t.role} transfer {transfer!r}")
        t.mode = nxt

    @staticmethod
    def _finish(t: Transfer) -> list:
        """A SENT transfer ends without its ack (the peer died, or a later state went to
        it): the state was reported sent, so nothing is signalled; only the copy goes."""
        t.mode = Mode.DONE
        t.log.clear()
        return []

    def _abort(self, transfer, t: Transfer, reason: str) -> list:
        t.mode, t.reason = Mode.ABORTED, reason
        t.chunks, t.length, t.crc = [], 0, 0  # never keep, nor deliver, a partial state
        if t.log is not None:
            t.log.clear()
        return [TransferFailed(transfer, reason)]

    # -- queries -----------------------------------------------------------------
    def mode(self, transfer: Hashable) -> Optional[Mode]:
        t = self.transfers.get(transfer)
        return None if t is None else t.mode

    def check_invariants(self) -> None:
        """Raise AssertionError when the mover's own rules are broken."""
        assert not (self._early.keys() & self.transfers.keys()), "early message for a requested transfer"
        assert not any(src in self.dead for src, _ in self._early.values()), "early message from the dead"
        for transfer, t in self.transfers.items():
            assert isinstance(t.role, Role) or t.mode is Mode.ABORTED, f"{transfer!r}: tombstone not aborted"
            assert t.mode in TERMINAL or t.peer not in self.dead, f"{transfer!r}: live with a dead peer"
            assert t.chunks == [] or (t.role == RECV and t.mode is Mode.RECEIVING), f"{transfer!r}: stray chunks"
            assert t.length == sum(len(c) for c in t.chunks), f"{transfer!r}: length out of step"
            assert (t.reason is not None) == (t.mode is Mode.ABORTED), f"{transfer!r}: reason without abort"
            assert t.log is None or t.role == SEND, f"{transfer!r}: a receiver with a send log"
            assert t.log is None or t.mode not in TERMINAL or not t.log.messages, \
                f"{transfer!r}: messages kept after the transfer ended"
