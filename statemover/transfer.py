"""One transfer as a StateMover keeps it: its modes, the table of their transitions, and
its record (statemover/mover.py, which drives them)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

from statemover.messages import Chunk, PartTrailer, Role, Trailer
from statemover.resend import SendLog


class Mode(enum.Enum):
    REQUESTED = "requested"  # local request made, handshake sent, peer's not yet here
    READY = "ready"  # SmReady emitted; sender awaits send(), receiver awaits chunks
    RECEIVING = "receiving"  # receiver holds at least one chunk
    SENT = "sent"  # sender: the final state handed out, kept for a resend until its ack
    DONE = "done"
    ABORTED = "aborted"


TERMINAL = (Mode.DONE, Mode.ABORTED)
#: what the sender numbers and keeps for a resend (``statemover.resend``)
NUMBERED = (Chunk, PartTrailer, Trailer)
SEND, RECV = Role.SEND, Role.RECV

#: (role, mode, event) -> next mode, for live transfers. An event not listed is
#: a protocol error: local for ``send``, remote for a peer's message. Cancel, peer failure, peer abort and a failed check take
#: any live transfer to ABORTED.
TRANSITIONS = {
    (SEND, Mode.REQUESTED, "handshake"): Mode.READY,
    (RECV, Mode.REQUESTED, "handshake"): Mode.READY,
    (SEND, Mode.READY, "part"): Mode.READY,  # send_part(): a bulk part, more may follow
    (SEND, Mode.READY, "send"): Mode.SENT,  # send() hands out every chunk at once
    (SEND, Mode.SENT, "state ack"): Mode.DONE,  # the receiver has it: forget it
    (SEND, Mode.READY, "part ack"): Mode.READY,  # the receiver has a part
    (SEND, Mode.REQUESTED, "nack"): Mode.READY,  # the peer's handshake was lost (lossy only)
    (SEND, Mode.READY, "nack"): Mode.READY,  # resend what the receiver misses
    (SEND, Mode.SENT, "nack"): Mode.SENT,
    (RECV, Mode.READY, "chunk"): Mode.RECEIVING,
    (RECV, Mode.RECEIVING, "chunk"): Mode.RECEIVING,
    (RECV, Mode.READY, "part trailer"): Mode.READY,  # an empty part
    (RECV, Mode.RECEIVING, "part trailer"): Mode.READY,  # a part whole: StatePart
    (RECV, Mode.READY, "trailer"): Mode.DONE,  # the empty state has no chunks
    (RECV, Mode.RECEIVING, "trailer"): Mode.DONE,
}


@dataclass(slots=True)
class Transfer:
    """One transfer at one end: its role, its peer, its mode, and what is in flight."""

    role: Optional[Role]  # None: cancelled before it was requested (a tombstone)
    peer: Any
    mode: Mode = Mode.REQUESTED
    reason: Optional[str] = None
    chunks: List[Any] = field(default_factory=list)
    length: int = 0
    crc: int = 0
    parts: int = 0  # bulk parts sent (sender) or received whole (receiver)
    acked: int = 0  # bulk parts the receiver acknowledged (sender)
    seq: int = 0  # receiver: the number of the chunk or trailer it takes next
    log: Optional[SendLog] = None  # sender: what it sent and the receiver has not confirmed
