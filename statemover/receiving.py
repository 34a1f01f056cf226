"""The receiving end of a StateMover transfer: chunks and trailers checked in order, each
part and the final state delivered whole or not at all (paper 3.3.1; two-phase catch-up,
docs/design/catchup.md), and what a loss on the link changes (``statemover.resend``).

A part of ``statemover.mover.StateMover`` (its attributes are the mover's).
"""
from __future__ import annotations

import zlib
from typing import Hashable, Optional

from flux.effects import Send
from statemover.messages import (
    Chunk,
    PartAck,
    PartTrailer,
    SmReady,
    StateAck,
    StatePart,
    StateReceived,
    Trailer,
)
from statemover.transfer import RECV, Mode, Transfer

CHECKSUM_MISMATCH = "checksum mismatch"


class ReceiverSide:
    """The receiving end's events; mixed into ``StateMover``."""

    me: Hashable

    def _handshake_lost(self, transfer, t: Transfer) -> list:
        """A chunk or trailer reached a receiver still waiting for the sender's handshake,
        after a loss: the handshake was lost, and the sender, which sends only once it has
        ours, asked for the transfer."""
        if t.role is not RECV or t.mode is not Mode.REQUESTED:
            return []
        self._step(transfer, t, "handshake")
        return [SmReady(transfer)]

    def _on_chunk(self, transfer, t: Transfer, msg: Chunk) -> list:
        self._step(transfer, t, "chunk")
        expected = len(t.chunks)
        if msg.index != expected:  # FIFO links: anything else is a lost or repeated chunk
            if msg.index < expected:
                return self._abort(transfer, t, f"duplicate chunk {msg.index}")
            return self._abort(transfer, t, f"missing chunk {expected}")
        t.seq += 1  # taken (from a lossy peer only in its turn: ``on_message``)
        t.chunks.append(msg.data)
        t.length += len(msg.data)
        t.crc = zlib.crc32(msg.data, t.crc)
        return []

    def _on_trailer(self, transfer, t: Transfer, msg: Trailer) -> list:
        self._step(transfer, t, "trailer")
        problem = self._check(t, msg)
        if problem is not None:
            return self._abort(transfer, t, problem)
        t.seq += 1  # taken (from a lossy peer only in its turn: ``on_message``)
        data = b"".join(t.chunks)  # the one copy of the whole state
        t.chunks, t.length, t.crc = [], 0, 0
        return [StateReceived(transfer, data), Send(self.me, t.peer, StateAck(transfer))]

    def _on_part_trailer(self, transfer, t: Transfer, msg: PartTrailer) -> list:
        self._step(transfer, t, "part trailer")
        if msg.part != t.parts:  # FIFO links: a whole part lost or repeated
            return self._abort(transfer, t, f"part {msg.part}, expected part {t.parts}")
        problem = self._check(t, msg)
        if problem is not None:
            return self._abort(transfer, t, problem)
        t.seq += 1  # taken (from a lossy peer only in its turn: ``on_message``)
        data = b"".join(t.chunks)
        t.chunks, t.length, t.crc = [], 0, 0
        t.parts += 1
        return [StatePart(transfer, msg.part, data), Send(self.me, t.peer, PartAck(transfer, msg.part))]

    @staticmethod
    def _check(t: Transfer, msg) -> Optional[str]:
        """What is wrong with the chunks received, given their (part) trailer; None if whole."""
        got = len(t.chunks)
        if got < msg.count:
            return f"missing chunk {got}"
        if got > msg.count:
            return f"{got} chunks, trailer says {msg.count}"
        if t.length != msg.length:
            return f"length {t.length}, trailer says {msg.length}"
        if t.crc != msg.crc:
            return CHECKSUM_MISMATCH
        return None
