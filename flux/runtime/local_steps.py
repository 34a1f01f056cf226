"""The local work of one process's machines, as the runtime drives it (DESIGN 3).

Each turn a machine does what its ``LocalWork`` says it does: a checkpoint's
snapshot before the next input (DESIGN 10), the inputs its merge releases
(Figure 3 action 1), the credits for them (back-pressure), its batches, and
a bulk part of a catch-up between inputs (paper 5.3). Only machines that may
have changed since they last had nothing to do are asked: the guards are
functions of a machine's state alone (sans-I/O), and asking every machine at
every turn cost a node ~200 us a turn, most of its CPU at low rates.

Both rules below let a batch wait only while its consumer is busy (Nagle's rule):
every item costs each replica it reaches a fixed amount (~6.8 ms of CPU across the
paper's job on 4 nodes, docs/results/throughput.md), so items and messages should
grow with the load, and never wait when nothing is gained by waiting.

A connection with something to send sends at once if its consumer took everything
sent on it (``keeps_up``) and it sent nothing within ``flush_delay``; otherwise it
waits until ``flush_delay`` since it could first send, and what came meanwhile
leaves as one batch (SPARK_NOTES: a message per tuple costs ~10x). The ingress's
pending inputs leave as an item not full (a full one leaves at once) once stage 1
took every item sent to it (``all_taken``) and they waited ``item_delay`` for more,
or at once if no item left within ``item_delay``: items grow while the dataflow is
busy, and a slow feed's input waits for nothing. An operator
on Arrow batches pays ~0.4-0.6 ms a batch in each of 2 x partitions replicas per
stage: at 20K inputs/s, items cut whenever the source had nothing at hand were a
few rows each and the failover job's median latency was 0.74 s; with this rule
0.13 s, as with per-record operators (DESIGN 11).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

from flux.dataflow import ITEM_DELAY
from flux.protocol.host import Host
from flux.protocol.machine import Flushes

#: items one segment processes before the loop looks at its other work: one (up to
#: ``batch_rows`` inputs), so acks, credits and flushes wait for no more than one item
PROCESS_PER_STEP = 1


class LocalSteps:
    """Which machines to ask for local work, and since when each connection waits."""

    def __init__(self, host: Host, emit: Callable[[List, List], None],
                 clock: Callable[[], float], flush_delay: float,
                 keeps_snapshot: Callable[[Any, bool], bool], item_delay: float = ITEM_DELAY,
                 cut_began: Callable[[float], None] = lambda t: None):
        """``emit`` carries the effects of a step out; ``keeps_snapshot(addr, both)``: does this
        replica pack its snapshot, or cross the cut without (its twin writes it; ``both``:
        the cut wants both replicas' snapshots)?
        ``cut_began(t)``: a step that crosses a cut begins (live moves time theirs)."""
        self.host = host
        self.emit = emit
        self.clock = clock
        self.flush_delay = flush_delay
        self.item_delay = item_delay
        #: since when each machine that gathers items has inputs pending, and when it
        #: last let an item go
        self._pending_since: Dict[Any, float] = {}
        self._last_cut: Dict[Any, float] = {}
        self.keeps_snapshot = keeps_snapshot
        self.cut_began = cut_began
        #: machines whose state may have changed since ``run`` last found nothing to do
        #: for them, and each machine's flushable connections as last computed
        self._dirty: set = set(host.machines)
        self._ready: Dict[Any, list] = {}
        self._flush_wait: Dict[Tuple[Any, int, int], float] = {}  # since when flushable
        #: when each connection last sent: one whose consumer took all it sent may send
        #: at once, if it did not send within ``flush_delay`` (DESIGN 11)
        self._last_sent: Dict[Tuple[Any, int, int], float] = {}
        #: the machines hosted when the three above were last pruned of the gone
        self._hosted: set = set(host.machines)

    def touch(self, addr=None) -> None:
        """``addr``'s machine (every machine, for None) may have changed: ``run`` asks it."""
        if addr is None:
            self._dirty.update(self.host.machines)
        else:
            self._dirty.add(addr)

    def flush_due(self) -> Optional[float]:
        """When the connection that waits longest may flush (None: none waits)."""
        return min(self._flush_wait.values()) + self.flush_delay if self._flush_wait else None

    def cut_due(self) -> Optional[float]:
        """When the first pending item that waits only for time may leave (None: none
        does; one that waits for stage 1 to take what it was sent, or for room, is woken
        by the message that changes that, so the loop does not spin meanwhile)."""
        due = None
        for addr, since in self._pending_since.items():
            work = self.host.work.get(addr)
            if work is None or not (work.items.all_taken() and work.items.can_cut()):
                continue
            at = self._may_leave_at(addr, since)
            due = at if due is None else min(due, at)
        return due

    def _may_leave_at(self, addr: Any, since: float) -> float:
        """When pending inputs since ``since`` may leave, as far as time goes: once they
        waited ``item_delay``, or ``item_delay`` after the last item (at once, if none)."""
        return min(since, self._last_cut.get(addr, -math.inf)) + self.item_delay

    def _cut(self, addr: Any, items: Any) -> bool:
        """Let the pending inputs go as an item once stage 1 took the ones before and they
        waited ``item_delay``, or no item left within ``item_delay``."""
        if not items.pending_rows():
            self._pending_since.pop(addr, None)
            return False
        now = self.clock()
        since = self._pending_since.setdefault(addr, now)
        if now < self._may_leave_at(addr, since):
            return False
        if not items.all_taken() or not items.can_cut():
            return False
        items.cut_item()
        del self._pending_since[addr]
        self._last_cut[addr] = now
        return True

    def run(self) -> bool:
        """Ask every machine that may have changed for its local work; did any do some?"""
        host, moved = self.host, False
        if host.machines.keys() != self._hosted:  # a segment came or went: forget the gone
            self._hosted = set(host.machines)
            for waits in (self._flush_wait, self._last_sent):
                for key in [k for k in waits if k[0] not in host.machines]:
                    del waits[key]
            for by_addr in (self._ready, self._pending_since, self._last_cut):
                for addr in [a for a in by_addr if a not in host.machines]:
                    del by_addr[addr]
        dirty, self._dirty = self._dirty, set()
        for addr, work in list(host.work.items()):
            if addr not in dirty:  # nothing changed it: only a batch may be due by now
                if addr in self._pending_since and self._cut(addr, work.items):
                    self._dirty.add(addr)
                    moved = True
                if addr in self._ready and self._ready[addr]:
                    moved |= self._flush(addr, work.flushes, fresh=False)
                continue
            did = work.items is not None and self._cut(addr, work.items)
            processes, snapshots = work.processes, work.snapshots
            left = PROCESS_PER_STEP
            while left > 0:
                if snapshots is not None and snapshots.snapshot_due():
                    # a checkpoint's cut: before the next input
                    self.cut_began(self.clock())
                    keep = self.keeps_snapshot(addr, snapshots.both_replicas_write())
                    self.emit(*host.run_local(snapshots.snapshot(keep)))
                    did = True
                if processes is None or not processes.can_process():
                    break
                taken = processes.process_ready(left)  # stops at a cut's guard by itself
                if not taken:
                    break
                left -= taken
                did = True
            if processes is not None and processes.credits_due():
                # back-pressure: what it took may be replaced
                self.emit(*host.run_local(processes.send_credits()))
                did = True
            if work.flushes is not None:
                did |= self._flush(addr, work.flushes, fresh=True)
            if work.parts is not None and work.parts.has_part():
                # catch-up's bulk, a part at a time between inputs
                self.emit(*host.run_local(work.parts.send_part()))
                did = True
            if did:
                self._dirty.add(addr)  # it changed: ask it again
                moved = True
        return moved

    def _flush(self, addr, machine: Flushes, fresh: bool = True) -> bool:
        """Send each connection's batch once it has waited ``flush_delay``, or at once to
        a consumer that keeps up if the connection sent nothing within ``flush_delay`` (a
        connection that stays flushable, a backlog, goes on sending at every turn).
        ``fresh`` False: the machine is as it was when its flushable connections were
        last asked."""
        now, flushed, delay = self.clock(), False, self.flush_delay
        waiting, last_sent = self._flush_wait, self._last_sent
        ready = machine.flushable() if fresh or addr not in self._ready else self._ready[addr]
        keeps_up = machine.keeps_up
        for i, d in ready:
            key = (addr, i, d)
            since = waiting.setdefault(key, now)
            if now - since < delay and not (keeps_up(i, d) and
                                            now - last_sent.get(key, -math.inf) >= delay):
                continue
            self.emit(*self.host.run_local(machine.flush(i, d)))
            last_sent[key] = now
            flushed = True
        if flushed:
            ready = machine.flushable()
            self._dirty.add(addr)
        self._ready[addr] = ready
        still = set(ready)
        for key in [k for k in waiting if k[0] == addr and (k[1], k[2]) not in still]:
            del waiting[key]  # sent all it had, or cannot send now (paused, standby)
        return flushed
