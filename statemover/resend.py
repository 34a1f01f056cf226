"""What a sending StateMover keeps so that a lost envelope costs a resend, not the attempt.

Every chunk and trailer of a transfer carries a number (``seq``, from 0). The sender
keeps those the receiver has not confirmed: a part's until its ``PartAck``, the final
state's until the ``StateAck``. A receiver that sees messages of its sender lost
(``LinkLost``, reported in the link's order before the message after the gap) asks for
everything from the first number it misses (``Nack``), and takes only the number it
expects next: a message after a gap, or one sent twice, is dropped. Pure: no I/O.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, List, Optional

from statemover.messages import PartTrailer


class SendLog:
    """The chunks and trailers of one transfer the receiver has not confirmed yet."""

    __slots__ = ("base", "messages")

    def __init__(self) -> None:
        self.base = 0  # the number of messages[0]
        self.messages: Deque[Any] = deque()

    @property
    def next_seq(self) -> int:
        """The number the next message gets."""
        return self.base + len(self.messages)

    def add(self, msg: Any) -> Any:
        if msg.seq != self.next_seq:
            raise ValueError(f"message #{msg.seq} logged as #{self.next_seq}")
        self.messages.append(msg)
        return msg

    def confirm_part(self, part: int) -> None:
        """The receiver has every part up to ``part``: forget them (and their chunks)."""
        messages = self.messages
        while messages:
            msg = messages.popleft()
            self.base += 1
            if type(msg) is PartTrailer and msg.part == part:
                return

    def since(self, seq: int) -> Optional[List[Any]]:
        """The messages from number ``seq`` on, to send again; None if ``seq`` is not one
        this log can answer (confirmed already, or never sent)."""
        if not self.base <= seq <= self.next_seq:
            return None
        return list(self.messages)[seq - self.base:]

    def clear(self) -> None:
        self.base = self.next_seq
        self.messages.clear()
