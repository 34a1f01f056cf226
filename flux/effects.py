"""Effects: what a protocol machine asks its driver to do (DESIGN 3).

Machines never do I/O; they return these and the simulator or the runtime
carries them out. Reports for the controller (``FoldedIn``, ``TakeoverDone``)
are effects too; they live with the control messages they become.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Tuple

from flux.data_messages import Item


@dataclass(frozen=True, slots=True)
class Send:
    """Put ``msg`` on the FIFO connection from ``src`` to ``dst``."""

    src: Any
    dst: Any
    msg: Any


@dataclass(frozen=True, slots=True)
class Deliver:
    """Effect of the egress: these items leave the dataflow, in order."""

    items: Tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class StateInstalled:
    """State of a catch-up ``transfer`` arrived (``nbytes``) and is installed: a bulk part,
    or the rest. The runtime times the movement; the protocol does not need it."""

    transfer: Hashable
    nbytes: int
    #: False for a bulk part (phase 1): more of the same transfer follows
    complete: bool = True


@dataclass(frozen=True, slots=True)
class SourcesPaused:
    """The active of catch-up ``transfer`` paused its sources (phase 2, 5.3.1): its
    partition's output waits from here until ``SourcesResumed``. The runtime times
    the pause; the protocol does not need it."""

    transfer: Hashable


@dataclass(frozen=True, slots=True)
class SourcesResumed:
    """The active of catch-up ``transfer`` resumed its sources (the state sent, or the
    attempt aborted): its partition's pause is over."""

    transfer: Hashable
