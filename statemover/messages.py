"""The StateMover's vocabulary: messages between movers and the signals to its segment.

Movers talk over channels of their own (3.3.1); their messages carry the
transfer id (unique per catch-up attempt, DESIGN 4.6), so an older attempt's
messages never mix into a newer one. The calls are what a segment asks of its node's mover (Figure 5:
``send(sm, send-req)``, ``send(sm, recv-req)``, ``send(sm, st)``, and the
abort of 3.4), as effects the host carries out. The signals are the paper's
``sm_ready`` and ``sm_done`` (Figure 5), and the failure that makes the
controller retry (3.4).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Hashable


class Role(str, enum.Enum):
    """A mover's part in one transfer. It travels in Handshake, so its value is the
    wire form ("send"/"recv") and it compares equal to that string."""

    SEND = "send"
    RECV = "recv"

    def __str__(self) -> str:
        return self.value

# -- calls from the segment to its mover (local effects) -------------------------

@dataclass(frozen=True, slots=True)
class RequestSend:
    """The active segment's ``send(sm, send-req)`` (Figure 5 action 1)."""

    transfer: Hashable
    peer: Any


@dataclass(frozen=True, slots=True)
class RequestRecv:
    """The new replica's ``send(sm, recv-req)`` (Figure 5 action 1)."""

    transfer: Hashable
    peer: Any


@dataclass(frozen=True, slots=True, repr=False)
class SendState:
    """The active's ``send(sm, st)``: the whole segment, serialized (actions 3-4)."""

    transfer: Hashable
    data: bytes

    def __repr__(self) -> str:
        return f"SendState({self.transfer!r}, <{len(self.data)} bytes>)"


@dataclass(frozen=True, slots=True, repr=False)
class SendPart:
    """The active's bulk, one part at a time, while it goes on processing (two-phase
    catch-up, phase 1): the mover sends its chunks and a ``PartTrailer``; the transfer
    stays open for more parts and, at the end, the ``SendState`` of phase 2."""

    transfer: Hashable
    data: bytes

    def __repr__(self) -> str:
        return f"SendPart({self.transfer!r}, <{len(self.data)} bytes>)"


@dataclass(frozen=True, slots=True)
class CancelTransfer:
    """The segment gave up on this attempt (3.4): tell the peer mover."""

    transfer: Hashable
    reason: str


MOVER_CALLS = (RequestSend, RequestRecv, SendPart, SendState, CancelTransfer)

# -- messages between movers ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class Handshake:
    """This mover has its segment's request for ``transfer``, in ``role`` (3.3.1)."""

    transfer: Hashable
    role: Role


@dataclass(frozen=True, slots=True, repr=False)
class Chunk:
    """Chunk number ``index`` (from 0) of the state; ``data`` is bytes-like. ``seq``
    numbers every chunk and trailer of the transfer (from 0), so after a loss the
    receiver can ask for what it misses (``Nack``) and tell a resent message from a
    stale one."""

    transfer: Hashable
    index: int
    data: Any
    seq: int

    def __repr__(self) -> str:  # a trace shows the size, not megabytes of bytes
        return f"Chunk({self.transfer!r}, {self.index}, <{len(self.data)} bytes>, #{self.seq})"


@dataclass(frozen=True, slots=True)
class Trailer:
    """End of the state: what the receiver must have got, to check it whole."""

    transfer: Hashable
    count: int
    length: int
    crc: int
    seq: int


@dataclass(frozen=True, slots=True)
class PartTrailer:
    """End of bulk part number ``part`` (from 0): checked like the final ``Trailer``;
    the chunks after it belong to the next part (their indices start again at 0)."""

    transfer: Hashable
    part: int
    count: int
    length: int
    crc: int
    seq: int


@dataclass(frozen=True, slots=True)
class PartAck:
    """Bulk part number ``part`` arrived whole and was handed to the new replica (which
    installs it in the same step): the sender's window moves on, and phase 2 waits for
    the last one, so the pause never waits behind a backlog of parts. Cumulative: it
    acknowledges every part up to ``part`` (an ack lost on the way is covered by the
    next)."""

    transfer: Hashable
    part: int


@dataclass(frozen=True, slots=True)
class Nack:
    """The receiver saw messages of the sender lost (``LinkLost``): send again every
    chunk and trailer of ``transfer`` from number ``seq`` on. A lost envelope costs a
    resend, not the attempt: an attempt that needed every one of its envelopes to arrive
    could never finish on a link that loses a few (DESIGN 4.6)."""

    transfer: Hashable
    seq: int


@dataclass(frozen=True, slots=True)
class StateAck:
    """The receiver has the whole final state: the sender may forget it (until then it
    keeps it, to answer a ``Nack``)."""

    transfer: Hashable


@dataclass(frozen=True, slots=True)
class Abort:
    """The peer gave up on ``transfer``: stop waiting for it."""

    transfer: Hashable
    reason: str


@dataclass(frozen=True, slots=True)
class LinkLost:
    """Not a peer's message: this node's transport saw messages from that peer's mover
    vanish in transit (connection numbers ``expected`` .. ``got``), and says so in that
    link's FIFO order, before the message after the gap."""

    expected: int
    got: int


# -- local effects ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SmReady:
    """Both movers are ready: the paper's ``sm_ready()`` (Figure 5 action 2)."""

    transfer: Hashable


@dataclass(frozen=True, slots=True)
class StateSent:
    """Every chunk is handed out: the active side's ``sm_done()`` (action 4)."""

    transfer: Hashable


@dataclass(frozen=True, slots=True, repr=False)
class StateReceived:
    """The whole state arrived and checked out: install it, then ``sm_done()`` (action 4)."""

    transfer: Hashable
    data: bytes

    def __repr__(self) -> str:
        return f"StateReceived({self.transfer!r}, <{len(self.data)} bytes>)"


@dataclass(frozen=True, slots=True)
class PartAcked:
    """The new replica has bulk part ``part``: the active may send one more, and after the
    last, pause (two-phase catch-up)."""

    transfer: Hashable
    part: int


@dataclass(frozen=True, slots=True, repr=False)
class StatePart:
    """Bulk part number ``part`` arrived whole and checked out: the standby installs it
    and goes on waiting (two-phase catch-up, phase 1)."""

    transfer: Hashable
    part: int
    data: bytes

    def __repr__(self) -> str:
        return f"StatePart({self.transfer!r}, {self.part}, <{len(self.data)} bytes>)"


@dataclass(frozen=True, slots=True)
class TransferFailed:
    """The transfer is over without a state; the controller retries (3.4)."""

    transfer: Hashable
    reason: str
