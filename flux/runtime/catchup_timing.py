"""How long the catch-ups of one process's segments took, for the controller's log.

A movement is timed from when both StateMovers were ready to when the new
replica installed the whole state, its bulk parts' bytes counted in (phase 1
and 2, paper 5.3); a pause from when the active paused its partition's
sources to when it resumed them (what the catch-up cost the output).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from flux.control_messages import CatchUpPaused, StateMoved
from flux.effects import SourcesPaused, SourcesResumed, StateInstalled
from flux.protocol.host import Host
from statemover.messages import SmReady


class CatchUpTiming:
    """The movements and pauses under way, by transfer."""

    def __init__(self, host: Host, clock: Callable[[], float]):
        self.host = host
        self.clock = clock
        self._moves: Dict[tuple, float] = {}  # transfer -> when both movers were ready
        self._moved_bytes: Dict[tuple, int] = {}  # transfer -> bytes of its parts so far
        self._paused: Dict[tuple, float] = {}  # transfer -> when its active paused its sources

    def movers_ready(self, e: SmReady) -> None:
        self._moves[e.transfer] = self.clock()

    def installed(self, e: StateInstalled) -> Optional[StateMoved]:
        """Count a transfer's bytes, bulk parts included; the movement's report when whole."""
        nbytes = self._moved_bytes.pop(e.transfer, 0) + e.nbytes
        if not e.complete:  # a bulk part: the rest follows
            self._moved_bytes[e.transfer] = nbytes
            return None
        started = self._moves.pop(e.transfer, None)
        seg = self.host.segment_of(e.transfer)
        if started is None or seg is None:
            return None
        return StateMoved(seg.addr, nbytes, self.clock() - started)

    def sources_paused(self, e: SourcesPaused) -> None:
        self._paused[e.transfer] = self.clock()

    def sources_resumed(self, e: SourcesResumed) -> Optional[CatchUpPaused]:
        """How long the active held its partition's sources paused (None: a pause this
        process did not see begin)."""
        paused = self._paused.pop(e.transfer, None)
        seg = self.host.segment_of(e.transfer)
        if paused is None or seg is None:
            return None
        return CatchUpPaused(seg.addr, self.clock() - paused)
