"""The envelope every message travels in: who sent it, to whom, in which view.

A rebuilt replica reuses its address, so fencing is by incarnation both ways
(DESIGN 4.4): a dead sender's messages are dropped, and a message meant for a
dead incarnation never reaches its successor (as TCP to a dead process).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message on the wire: sender, destination, the sender's view, the sender's
    incarnation and the destination incarnation the sender meant. ``dst_inc`` None
    means "whoever holds the address" (the StateMovers, whose ids name one
    incarnation already, and the controller)."""

    src: Any
    dst: Any
    view: int
    msg: Any
    inc: int = 0
    dst_inc: Optional[int] = None
