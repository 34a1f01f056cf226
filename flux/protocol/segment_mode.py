"""A segment's modes and the events that move it between them (paper 3.3, 5.3, Figure 5).

The table ``TRANSITIONS`` is the segment's state machine, read as the paper's tables
are: one row per (mode, event) allowed; the segment asks it before every event
(``Segment._next``), so an event out of turn is a ``LocalProtocolError``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from flux.addresses import Addr


class SegmentMode(enum.Enum):
    PROCESSING = "processing"  # normal processing (and take-over)
    AWAITING_STATE = "awaiting state"  # a new replica on a standby, waiting for its state
    STREAMING = "streaming"  # phase 1: the active sends its keyed snapshot while it processes
    DRAINING = "draining"  # the active paused its sources and drains to the pause-acks (5.3.1)
    MOVING = "moving"  # quiesced (initTrans): the state is with the StateMover


PROCESSING = SegmentMode.PROCESSING
AWAITING_STATE = SegmentMode.AWAITING_STATE
STREAMING = SegmentMode.STREAMING
DRAINING = SegmentMode.DRAINING
MOVING = SegmentMode.MOVING


class Event(enum.Enum):
    MESSAGE = "message"  # a data or sync message from a neighbour (not a pause-ack)
    PAUSE_ACK = "pause-ack"
    FAIL = "fail"  # a view's fail()
    AVAIL = "avail"  # a view's avail()
    WRITER = "writer"  # a view moved a sink's writer (docs/design/parallel_io.md)
    JOIN = "join"  # a view started dormant partitions (docs/design/rescaling.md)
    LEAVE = "leave"  # a view took partitions out (docs/design/rescaling.md)
    PROCESS = "process"  # local work: one input through the operators
    FLUSH = "flush"  # local work: one batch out
    EXPECT_STATE = "expect state"  # Figure 5 action 1 at the new replica
    SM_READY = "sm_ready"  # Figure 5 action 2: phase 1 starts
    SEND_PART = "send part"  # local work in phase 1: one bulk part to the mover
    PART_ACKED = "part acked"  # the new replica has one more part
    BULK_SENT = "bulk sent"  # the new replica has every bulk part: phase 2 (pause, drain)
    STATE_PART = "state part"  # a bulk part arrived at the new replica
    DRAINED = "drained"  # the last pause-ack: checkpoint (actions 2-4)
    STATE_SENT = "state sent"  # action 5 at the active
    STATE_RECEIVED = "state received"  # actions 4-5 at the new replica
    ABORT = "abort"  # the standby died or the transfer failed (3.4)
    TRANSFER_FAILED = "transfer failed"


#: (mode, event) -> next mode; an event not listed is a LocalProtocolError, since the
#: host asks ``ready_for`` and ``can_process``/``flushable`` first. Harmless late events,
#: listed on purpose: a pause-ack while PROCESSING is that of an aborted attempt (our
#: csync already resumed the source), as is one of another version while DRAINING;
#: sm_ready and a failed transfer at a new replica change nothing (it waits for its
#: state, or for the view that discards it). Two phases: PROCESSING -> STREAMING
#: (sm_ready: snapshot, bulk parts while processing) -> DRAINING (bulk handed over:
#: pause and drain) -> MOVING (the delta and the rest) -> PROCESSING.
TRANSITIONS = {
    **{(m, e): m for m in (PROCESSING, STREAMING, DRAINING)
       for e in (Event.MESSAGE, Event.PAUSE_ACK, Event.PROCESS, Event.FLUSH)},
    **{(m, e): m for m in SegmentMode for e in (Event.FAIL, Event.AVAIL, Event.WRITER,
                                                       Event.JOIN, Event.LEAVE)},
    (AWAITING_STATE, Event.EXPECT_STATE): AWAITING_STATE,
    (PROCESSING, Event.SM_READY): STREAMING,
    (AWAITING_STATE, Event.SM_READY): AWAITING_STATE,
    (STREAMING, Event.SEND_PART): STREAMING,
    (STREAMING, Event.PART_ACKED): STREAMING,
    (STREAMING, Event.BULK_SENT): DRAINING,
    (AWAITING_STATE, Event.STATE_PART): AWAITING_STATE,
    (DRAINING, Event.DRAINED): MOVING,
    (MOVING, Event.STATE_SENT): PROCESSING,
    (AWAITING_STATE, Event.STATE_RECEIVED): PROCESSING,
    (PROCESSING, Event.ABORT): PROCESSING,  # started, nothing paused yet: cancel only
    (STREAMING, Event.ABORT): PROCESSING,  # nothing paused yet: cancel, stop tracking
    (DRAINING, Event.ABORT): PROCESSING,
    (MOVING, Event.ABORT): PROCESSING,
    (AWAITING_STATE, Event.TRANSFER_FAILED): AWAITING_STATE,
}


@dataclass(frozen=True, slots=True)
class CatchUp:
    """The catch-up this replica takes part in: version and the peer's StateMover."""

    version: int
    peer_mover: Any
    started: bool = False

    def transfer(self, addr: Addr) -> tuple:
        return (addr.stage, addr.partition, self.version)
