"""A segment's side of catch-up (paper 3.3, 5.3, Figure 5; DESIGN 4.6): the active's
two phases and the new replica's install, and the whole segment's state that moves.

Catch-up moves the state in two phases (DESIGN 9: pause only for what changed).
Phase 1 (STREAMING): at ``sm_ready`` the active, still processing, takes a snapshot
of every operator whose state is a ``KeyedState``, starts dirty tracking, and hands
the snapshot to the mover in parts (``SendPart``) while it goes on processing; the
new replica installs each part as it arrives (``StatePart``). Phase 2: the
distributed pause and drain of 5.3.1, quiesce, and ``SendState`` with only the
changes of those stores since the snapshot, plus everything else whole (other
operators, F-Prod buffers, F-Cons merge), installed as before. Operators without a
``KeyedState`` simply move whole in phase 2 (their bulk is empty).

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's): one file per
seam of the segment, one state machine (``flux.protocol.segment_mode``).
"""
from __future__ import annotations

from typing import Iterator, List, Optional

from flux.effects import SourcesPaused, SourcesResumed
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.operator import describe
from flux.protocol.segment_mode import (
    AWAITING_STATE,
    MOVING,
    PROCESSING,
    STREAMING,
    CatchUp,
    Event,
)
from flux.state_codec import StateCodecError, pack_part, paused_gc, unpack_part, unpack_state
from statemover.messages import CancelTransfer, RequestRecv, RequestSend, SendPart, SendState


class CatchUpSide:
    """The catch-up events of a segment; mixed into ``Segment``."""

    def abort_catchup(self) -> List:
        """The standby died or its transfer failed (3.4): resume as if movement had
        finished, unpausing our sources, but keep forwarding: there is no new replica."""
        c, mode = self.catchup, self.mode
        nxt = self._next(Event.ABORT) if c.started else mode
        self.catchup = None
        if not c.started:
            return []  # never asked the mover: nothing to cancel, nothing paused
        self.mode = nxt
        self._end_tracking()
        cancel = [CancelTransfer(c.transfer(self.addr), "the standby is gone")]
        if mode in (PROCESSING, STREAMING):
            return cancel  # nothing paused yet
        if mode is MOVING:
            self.chain.end_trans()
        self.fcons.cancel_pause()
        return cancel + self.fcons.csyncs(c.version) + [SourcesResumed(c.transfer(self.addr))]

    def transfer_failed(self) -> List:
        if self.mode is AWAITING_STATE:
            self._next(Event.TRANSFER_FAILED)
            self._drop_parts()  # never keep a part of a failed attempt (the view discards us)
            return []
        return self.abort_catchup()


    # -- catch-up, active side (Figure 5 actions 1-5) --------------------------
    def _maybe_start(self) -> List:
        """Action 1: avail seen and take-over of our F-Prod complete (5.3)."""
        c = self.catchup
        if c is None or c.started or self.mode is not PROCESSING or not self.fprod.takeover_done():
            return []
        self.catchup = CatchUp(c.version, c.peer_mover, started=True)
        return [RequestSend(c.transfer(self.addr), c.peer_mover)]

    def sm_ready(self) -> List:
        """Action 2, phase 1: snapshot every keyed store, track its changes from here,
        and stream the snapshot while processing goes on; then phase 2 (``_pause_sources``)."""
        self.mode = self._next(Event.SM_READY)
        if self.mode is AWAITING_STATE:
            return []  # the standby just waits for the state (and its parts)
        self._parts_sent = self._parts_acked = 0
        parts = []
        for i, store in enumerate(self._stores()):
            if store is not None:
                parts.append(_tagged(i, store.parts(self.bulk_pairs)))  # the keys, now
                store.clear_dirty()  # the baseline of phase 2's delta: it fixes the rest
                self._tracked[i] = store
        self._bulk = (part for tagged in parts for part in tagged)
        self._bulk_next = next(self._bulk, None)
        return self._stream(0 if self.bulk_per_step else None)

    def has_part(self) -> bool:
        """May a bulk part go in a ``send_part`` step (phase 1, ``bulk_per_step``): one is
        waiting and the window has room?"""
        return (self.mode is STREAMING and self._bulk_next is not None
                and self._parts_sent - self._parts_acked < self.part_window)

    def send_part(self) -> List:
        """Local work in phase 1: hand the next bulk part to the mover; after the last,
        phase 2 begins."""
        self._next(Event.SEND_PART)
        if self._bulk_next is None:
            raise LocalProtocolError(f"{self.addr}: send part with no part left")
        return self._stream(1)

    def _stream(self, limit: Optional[int]) -> List:
        """Hand over up to ``limit`` parts (all if None); once the new replica has every
        part, pause the sources."""
        effects: List = []
        transfer = self.catchup.transfer(self.addr)
        while self._bulk_next is not None and (limit is None or len(effects) < limit):
            i, (keys, values) = self._bulk_next
            try:
                part = pack_part(i, keys, values)
            except Exception as exc:  # the user's values: as ``_packed`` says
                op = self.chain.operators[i]
                raise OperatorError(f"the state of operator {type(op).__name__} (taken for a "
                                    f"catch-up)", self.addr.stage, self.addr.partition,
                                    self.fcons.frontier(), f"cannot be encoded: "
                                    f"{describe(exc)}") from exc
            effects.append(SendPart(transfer, part))
            self._parts_sent += 1
            self._bulk_next = next(self._bulk, None)
        return effects + self._maybe_pause()

    def part_acked(self, part: int) -> List:
        """Phase 1: the new replica has part ``part`` (the mover checked the order)."""
        self._next(Event.PART_ACKED)
        self._parts_acked += 1
        return self._maybe_pause()

    def _maybe_pause(self) -> List:
        """Every part handed over and acknowledged: phase 2."""
        if self._bulk_next is not None or self._parts_acked < self._parts_sent:
            return []
        self.mode = self._next(Event.BULK_SENT)
        self._bulk = None
        return self._pause_sources()

    def _pause_sources(self) -> List:
        """Phase 2, distributed (5.3.1): pause the data sources, drain to their pause-acks."""
        effects = self.fcons.pause(self.catchup.version)
        effects.append(SourcesPaused(self.catchup.transfer(self.addr)))
        return effects if self.fcons.awaiting_pause_acks() else effects + self._checkpoint()

    def _checkpoint(self) -> List:
        """Actions 2-4: quiesce (initTrans) and hand the mover what phase 1 did not move:
        the keyed stores' changes since the snapshot, everything else whole."""
        self.mode = self._next(Event.DRAINED)
        self.chain.init_trans()
        # in slices, no collector pauses: liveness goes on
        data = self._packed(self._moving_state, "a catch-up", self.fcons.frontier())
        return [SendState(self.catchup.transfer(self.addr), data)]

    def _moving_state(self) -> dict:
        if not self._tracked:
            return self.get_state()  # no keyed store: today's single whole movement
        keyed = sorted(self._tracked)
        state = self.get_state(skip=keyed)
        state["deltas"] = [[i, self._tracked[i].delta()] for i in keyed]
        state["parts"] = self._parts_sent
        return state

    def _end_tracking(self) -> None:
        """The attempt is over (sent or aborted): stop recording changes, forget the bulk."""
        for store in self._tracked.values():
            store.stop_tracking()
        self._tracked = {}
        self._bulk = self._bulk_next = None

    def _stores(self) -> list:
        """Per operator of the chain, its ``KeyedState`` or None (``OperatorChain``)."""
        return self.chain.keyed_stores()

    def state_sent(self) -> List:
        """Action 5 at the active: endTrans, then csync below and psync above (5.3.2)."""
        self.mode = self._next(Event.STATE_SENT)
        v, transfer = self.catchup.version, self.catchup.transfer(self.addr)
        self.chain.end_trans()
        self._end_tracking()
        self.catchup = None
        self.fcons.end_catchup()
        return self.fcons.csyncs(v) + self.fprod.end_catchup(v) + [SourcesResumed(transfer)]

    # -- catch-up, standby side ----------------------------------------------------
    def expect_state(self, catchup: CatchUp) -> List:
        """The new replica asks its mover to receive (Figure 5 action 1, STDBY)."""
        self._next(Event.EXPECT_STATE)
        self.catchup = catchup
        self._drop_parts()  # a store its constructor filled: all of it comes from the active
        return [RequestRecv(catchup.transfer(self.addr), catchup.peer_mover)]

    def state_part(self, part: int, data: bytes) -> List:
        """Phase 1 at the new replica: install one bulk part; go on waiting."""
        self._next(Event.STATE_PART)
        if part != self.parts_received:
            raise RemoteProtocolError(f"{self.addr}: bulk part {part}, expected {self.parts_received}")
        try:
            with paused_gc():  # see _checkpoint
                i, keys, values = unpack_part(data)
        except StateCodecError as exc:
            raise RemoteProtocolError(f"{self.addr}: bulk part {part}: {exc}") from None
        stores = self._stores()
        if not (0 <= i < len(stores) and stores[i] is not None):
            raise RemoteProtocolError(f"{self.addr}: bulk part for operator {i!r}, which has no keyed store")
        stores[i].install_part(keys, values)
        self.parts_received += 1
        return []

    def _drop_parts(self) -> None:
        for store in self._stores():
            if store is not None:
                store.restore(None)
        self.parts_received = 0

    def state_received(self, data: bytes) -> List:
        """Actions 4-5 at the standby: install with the buffers reversed, then sync."""
        nxt = self._next(Event.STATE_RECEIVED)
        with paused_gc():  # see _checkpoint
            self._install_moved(unpack_state(data))
        for kind, what in self.missed:  # what happened since the snapshot was taken
            if kind == "fail":
                self.fprod.replay_fail(what)
            elif kind == "writer":
                self.fprod.on_writer_moved(what)
            elif kind == "join":  # over a state maybe taken before the join
                self._join(what)
            elif kind == "leave":
                self._join(what, leave=True)
            else:
                self.fprod.replay_avail(what)
        self.missed = []
        v = self.catchup.version
        self.mode = nxt
        self.catchup = None
        return self.fcons.csyncs(v) + self.fcons.reverse_dead_sources() + self.fprod.out.psyncs(v)

    # -- the whole segment's state (DESIGN 4.6) --------------------------------------
    def get_state(self, skip=()) -> dict:
        """The whole segment; the operators in ``skip`` have ``None`` (moved in pieces)."""
        ops = self.chain.get_state(skip) if skip else self.chain.get_state()
        state = {"operators": ops, "fcons": self.fcons.get_state(),
                 "fprod": self.fprod.get_state()}
        if self.cuts.latest is not None:  # checkpoints are taken (DESIGN 10)
            state["cuts"] = self.cuts.to_state()
        if self.outputs is not None:  # the new replica's outputs since the cut begin here
            state["outputs"] = self.outputs.to_state()
        moves = self.moves_state()
        if moves is not None:  # a live move was seen here (DESIGN 13)
            state["moves"] = moves
        return state

    def install_state(self, state: dict, skip=()) -> None:
        """Install ``get_state(skip)`` with the buffers reversed; ``skip`` operators stay."""
        if skip:
            self.chain.install_state(state["operators"], skip)
        else:
            self.chain.install_state(state["operators"])
        self.fcons.install_state(state["fcons"])
        self.fprod.install_state(state["fprod"], reverse=True)
        if "cuts" in state:  # a cut the active has not crossed yet
            self.cuts.install_state(state["cuts"])
            self.fcons.moves_crossed = self.cuts.moves_crossed
            self.fprod.out.cut = self.cuts.latest
            self.fprod.out.move_cuts = self.cuts.move_cuts
        if self.outputs is not None:
            self.outputs.install_state(state.get("outputs"))
        if "moves" in state:
            self.install_moves_state(state["moves"])

    def _install_moved(self, state: dict) -> None:
        """Phase 2 at the new replica: the bulk parts are in; apply each keyed store's
        changes, install the rest whole (a state without deltas is a whole segment)."""
        deltas = state.get("deltas")
        if deltas is None:
            if self.parts_received:
                raise RemoteProtocolError(f"{self.addr}: a whole state after {self.parts_received} "
                                          f"bulk parts")
            self.install_state(state)
            self.installed = {"parts": 0, "deltas": 0}
            return
        if state.get("parts") != self.parts_received:
            raise RemoteProtocolError(f"{self.addr}: {self.parts_received} bulk parts installed, "
                                      f"the active sent {state.get('parts')!r}")
        stores = self._stores()
        keyed = [i for i, _ in deltas]
        if any(not (type(i) is int and 0 <= i < len(stores) and stores[i] is not None) for i in keyed):
            raise RemoteProtocolError(f"{self.addr}: deltas for operators {keyed} without a keyed store")
        self.install_state(state, skip=keyed)
        for i, delta in deltas:
            stores[i].apply_delta(delta)
        self.installed = {"parts": self.parts_received, "deltas": len(deltas),
                          "delta_keys": sum(len(d["set"]) + len(d["deleted"]) for _, d in deltas)}
        self.parts_received = 0


def _tagged(i: int, slices) -> Iterator[tuple]:
    """Operator ``i``'s slices as bulk parts ``(i, (keys, values))``."""
    for part in slices:
        yield (i, part)
