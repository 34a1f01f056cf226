"""The controller's view logic: failures, standbys and bottom-up catch-up.

Pure: it takes events (a node failed, a neighbour folded a new replica in)
and returns the totally ordered views to broadcast (paper 3.2.1, 3.3; DESIGN
4.4, 4.6). The rules:

- A failed node's replicas become *missing*. Losing both replicas of a pair
  is not maskable: ``PairLost`` names the partition.
- A missing replica is rebuilt on a standby: the whole failed node is
  replaced by one standby, which receives its replicas stage by stage.
- Bottom-up (5.3): only the lowest stage with missing replicas catches up;
  the next stage starts once every catch-up below has folded in everywhere,
  i.e. every live producer and consumer of the pair reported both syncs.
- A standby is taken on a host that holds none of the survivors of the node it
  replaces, when hosts are known; with none free there, the pair
  stays vulnerable until one registers.
- Each attempt has a fresh version. A standby that dies mid-attempt simply
  fails like any node; its replicas are missing again and go to the next
  standby (3.4).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from controller.hosts import standby_away_from
from flux.addresses import Addr, MoverAddr, P, S
from flux.control_messages import Avail, Joined, View
from flux.errors import PairLost
from controller.topology import Topology
from controller.writers import WriterPlacement


@dataclass
class Attempt:
    version: int
    standby: str
    expected: Set[Addr]
    reported: Set[Addr] = field(default_factory=set)


class Recovery:
    """Membership and catch-up orchestration for one job."""

    def __init__(self, topology: Topology, hosts: Optional[Mapping[str, str]] = None,
                 writers: bool = False):
        """``writers``: each last-stage partition's sink writer runs on a node, and moves
        when that node fails (``controller.writers``)."""
        self.topology = topology
        #: process -> its machine, when pairs must span machines (unknown: its own)
        self.host_of: Dict[str, str] = dict(hosts or {})
        self.stages, self.partitions = topology.stages, topology.partitions
        self.placement = topology.placement
        self.inc = dict(topology.incarnations)
        self.hosted: Dict[str, Set[Addr]] = {n: set(topology.endpoints_of(n))
                                             for n in topology.nodes}
        self.node_of: Dict[Addr, str] = {a: n for n, addrs in self.hosted.items() for a in addrs}
        self.free: List[str] = list(topology.standbys)
        self.ingress, self.egress = topology.ingress, topology.egress
        self.view = 0
        self.version = 0
        self.missing: Dict[Addr, str] = {}  # replica -> the failed node it was lost with
        self.replacement: Dict[str, str] = {}  # failed node -> its standby
        self.attempts: Dict[Addr, Attempt] = {}
        self.dead: Set[str] = set()
        self.completed: List[Addr] = []
        #: the dormant partitions started so far (a process joining later is told them)
        self.joined: Set[int] = set()
        #: the partitions taken out since (a process joining later is told them too)
        self.left: Set[int] = set()
        self._first_seen: Dict[tuple, float] = {}  # (addr, version) -> for ``overdue``
        self.writers = WriterPlacement(self.stages, self.partitions, self.node_of) \
            if writers else None
        for addr in list(self.node_of):  # replicas a placement never has (replication "none")
            if addr.twin not in self.node_of:
                self.missing[addr.twin] = "absent"

    # -- events ------------------------------------------------------------------
    def node_failed(self, node: str) -> List[View]:
        """Declare ``node`` dead in the next view (with the nodes that fail with it: its
        replica set, under cluster pairs); then schedule catch-up."""
        if node in self.dead:
            return []
        group = self._failure_group(node)
        self.dead.update(group)
        lost = set().union(*(self.hosted.pop(n, set()) for n in group))
        # An attempt with a producer or consumer among the lost aborts (DESIGN 4.6):
        # its new replica is declared failed with them, and is rebuilt later, bottom-up.
        aborted = {addr for addr, a in self.attempts.items()
                   if addr not in lost and a.expected & lost}
        for addr in aborted:
            del self.attempts[addr]
            standby = self.node_of.pop(addr)
            self.hosted[standby].discard(addr)
        failed = frozenset(lost | aborted | {MoverAddr(n) for n in group})
        for addr in lost:
            self.missing[addr] = self.node_of.pop(addr, node)
            self.attempts.pop(addr, None)
        for addr, owner in list(self.missing.items()):  # replicas this standby was to receive
            if self.replacement.get(owner) in group:
                self.missing[addr] = self.replacement[owner]
        self.replacement = {k: v for k, v in self.replacement.items() if v not in group}
        self.free = [n for n in self.free if n not in group]
        for addr in sorted(self.missing):
            if addr.twin in self.missing:
                raise PairLost(addr.stage, addr.partition)
        incs = frozenset(self.inc[n] for n in group)
        moves = self.writers.after_failure(group, self.node_of, self.missing, self.inc) \
            if self.writers else ()
        views = [self._next_view(failed=failed, failed_incs=incs, writers=moves)]
        return views + self._schedule()

    def folded_in(self, reporter: Addr, addr: Addr, version: int) -> List[View]:
        """A neighbour processed both syncs of ``addr``'s catch-up ``version``."""
        attempt = self.attempts.get(addr)
        if attempt is None or attempt.version != version:
            return []  # a report about an aborted attempt
        attempt.reported.add(reporter)
        return self._schedule()

    def transfer_failed(self, stage: int, partition: int, version: int) -> List[View]:
        """A state transfer failed with both ends alive (e.g. a checksum mismatch): abort
        the attempt like a dead neighbour would, declaring the new replica failed, and retry."""
        addr = next((a for a, at in self.attempts.items()
                     if (a.stage, a.partition, at.version) == (stage, partition, version)), None)
        if addr is None:
            return []  # about an attempt already over
        del self.attempts[addr]
        standby = self.node_of.pop(addr)
        self.hosted[standby].discard(addr)
        return [self._next_view(failed=frozenset({addr}))] + self._schedule()

    def overdue(self, now: float, deadline: float) -> List[Tuple[Addr, int, float]]:
        """Catch-up attempts not folded in ``deadline`` after ``overdue`` first saw them,
        as ``(addr, version, age)``: the caller aborts them (``transfer_failed``) and they
        are retried (3.4). Time comes in as an argument."""
        live = {(addr, a.version) for addr, a in self.attempts.items()}
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in live}
        late = []
        for addr, version in sorted(live):
            age = now - self._first_seen.setdefault((addr, version), now)
            if age > deadline:
                late.append((addr, version, age))
        return late

    # -- scheduling -----------------------------------------------------------------
    def _schedule(self) -> List[View]:
        for addr, attempt in list(self.attempts.items()):
            if attempt.expected & self._live_endpoints() <= attempt.reported:
                del self.attempts[addr]
                del self.missing[addr]
                self.completed.append(addr)
        if self.attempts or not self.missing or not self.placement.rebuilds:
            return []
        stage = min(a.stage for a in self.missing)  # 0: a replica of a pair of ingresses
        avails = []
        for addr in sorted(a for a in self.missing if a.stage == stage):
            standby = self._standby_for(self.missing[addr])
            if standby is None:
                continue  # no standby yet: the pair stays vulnerable until one registers
            self.version += 1
            active_node = self.node_of[addr.twin]
            avails.append(Avail(addr, self.inc[standby], self.version, standby, active_node))
            self.attempts[addr] = Attempt(self.version, standby, self._neighbours(addr))
            self.hosted[standby].add(addr)
            self.node_of[addr] = standby
        return [self._next_view(avail=tuple(avails))] if avails else []

    def _failure_group(self, node: str) -> List[str]:
        """``node`` and the live nodes that fail with it (its replica set, 4.2)."""
        return [n for n in self.topology.failure_group(node)
                if n == node or (n not in self.dead and n in self.hosted)]

    def lost_set(self) -> Optional[int]:
        """The replica set (P or S) all of whose replicas are lost, where a node's failure
        fails its set (cluster pairs, 4.2), or None. The set is not rebuilt by catch-up:
        the job restarts from a checkpoint cut after the loss (DESIGN 7)."""
        if not self.placement.fails_by_set or not self.missing:  # (asked at every turn)
            return None
        for r in (P, S):
            if all(Addr(s, i, r) in self.missing for s in range(1, self.stages + 1)
                   for i in range(self.partitions)):
                return r
        return None

    def holds_last_replica(self, node: str) -> bool:
        """Would the failure of ``node`` lose a pair? (Its replicas' twins are missing.)"""
        hosted = set().union(*(self.hosted.get(n, set()) for n in self._failure_group(node)))
        return any(addr.twin in self.missing for addr in hosted)

    def _standby_for(self, lost_with: str) -> Optional[str]:
        """The standby that replaces ``lost_with``: the same for all its replicas, chosen
        once, away from the hosts of the replicas' survivors."""
        standby = self.replacement.get(lost_with)
        if standby is None:
            survivors = {self.node_of[a.twin] for a, owner in self.missing.items()
                         if owner == lost_with and a.twin in self.node_of}
            avoid = {self.host_of.get(n, n) for n in survivors}
            standby = standby_away_from(self.free, avoid, self.host_of)
            if standby is None:
                return None
            self.free.remove(standby)
            self.replacement[lost_with] = standby
            self.hosted.setdefault(standby, set())
        return standby

    def join(self, partitions: Sequence[int], groups: tuple = (),
             moves_seen: int = 0, cut: tuple = ()) -> List[View]:
        """Dormant partitions start on free standbys, fresh (docs/design/rescaling.md), in
        a chain of their own: standby k holds replica P of the k-th and replica S of the
        one before (one partition: P on one standby, S on another). Nothing (an empty
        list) while a replica is missing (a fresh machine knows every peer as live) or
        with too few standbys free. ``groups``, ``moves_seen``, ``cut``: where the
        joined replicas start (``Joined``)."""
        parts = sorted(partitions)
        need = max(2, len(parts))
        if not parts or self.missing or self.attempts or len(self.free) < need:
            return []
        nodes, self.free = self.free[:need], self.free[need:]
        self.joined.update(parts)
        self.left.difference_update(parts)
        joined = []
        for k, q in enumerate(parts):
            for s in range(1, self.stages + 1):
                for addr, node in ((Addr(s, q, P), nodes[k]), (Addr(s, q, S), nodes[k - 1])):
                    self.hosted.setdefault(node, set()).add(addr)
                    self.node_of[addr] = node
                    joined.append(Joined(addr, self.inc[node], node, groups, moves_seen,
                                         cut))
        return [self._next_view(joined=tuple(joined))]

    def leave(self, partitions: Sequence[int], cut: tuple = ()) -> List[View]:
        """Partitions a live rescale took every group from stop (docs/design/rescaling.md):
        their replicas leave the placement, and a node left holding nothing is a standby
        again. Nothing (an empty list) while a replica is missing or being rebuilt (its
        catch-up expects every neighbour it had). ``cut``: the cut ``(k, n)`` that took
        their last groups (``View.left_cut``)."""
        parts = sorted(partitions)
        if not parts or self.missing or self.attempts:
            return []
        left, nodes = [], set()
        for q in parts:
            for s in range(1, self.stages + 1):
                for addr in (Addr(s, q, P), Addr(s, q, S)):
                    node = self.node_of.pop(addr, None)
                    if node is not None:
                        self.hosted[node].discard(addr)
                        left.append(addr)
                        nodes.add(node)
        for node in sorted(nodes):
            if not self.hosted[node] and node not in self.dead and node not in self.free:
                self.free.append(node)
        self.joined.difference_update(parts)
        self.left.update(parts)
        return [self._next_view(left=tuple(left), left_cut=tuple(cut))]

    def add_standby(self, node: str, inc: int, host: Optional[str] = None) -> List[View]:
        """A new standby registered (in Spark: a restarted task), on ``host`` if known."""
        self.inc[node] = inc
        if host is not None:
            self.host_of[node] = host
        self.free.append(node)
        return self._schedule()

    # -- helpers ---------------------------------------------------------------------
    def _neighbours(self, addr: Addr) -> Set[Addr]:
        s = addr.stage
        if s == 0:  # a replica of a pair of ingresses: it feeds every stage-1 replica
            return {Addr(1, k, r) for k in range(self.partitions) for r in (P, S)}
        below = set(self.topology.stage1_producers) if s == 1 else {
            Addr(s - 1, j, r) for j in range(self.partitions) for r in (P, S)}
        above = {self._egress_of(addr)} if s == self.stages else {
            Addr(s + 1, k, r) for k in range(self.partitions) for r in (P, S)}
        return below | above

    def _egress_of(self, addr: Addr) -> Addr:
        """The egress a last-stage replica feeds: the one, or its partition's."""
        egresses = self.topology.egresses
        return egresses[addr.partition] if len(egresses) > 1 else egresses[0]

    def _live_endpoints(self) -> Set[Addr]:
        live = {a for a in self.node_of if a not in self.missing}
        driver = () if self.topology.ingress_pairs else self.topology.stage1_producers
        return live | set(driver) | set(self.topology.egresses)

    def _next_view(self, **kw) -> View:
        self.view += 1
        return View(self.view, **kw)

    def placed(self) -> Dict[Addr, str]:
        """Where every replica, and every sink's writer on a node, lives now."""
        where = dict(self.node_of)
        if self.writers is not None:
            where.update((self.writers.writer(p), n) for p, n in self.writers.node.items())
        return where

    def pair_states(self) -> Dict[tuple, str]:
        """Per ``(stage, partition)``: "whole" (both replicas live), "catching-up" (one is
        being rebuilt), "degraded" (one is lost and waits for a standby) or "single" (the
        placement never had a twin: replication "none"), or "dormant" (no replica placed:
        a pair not started, or left, docs/design/rescaling.md); for monitoring."""
        missing, attempts = dict(self.missing), dict(self.attempts)
        states = {}
        for stage in range(1, self.stages + 1):
            for partition in range(self.partitions):
                pair = (Addr(stage, partition, P), Addr(stage, partition, S))
                lost = [a for a in pair if a in missing]
                states[stage, partition] = (
                    "dormant" if not lost and not any(a in self.node_of for a in pair)
                    else "whole" if not lost
                    else "single" if missing[lost[0]] == "absent"
                    else "catching-up" if lost[0] in attempts else "degraded")
        return states

    def pending(self) -> bool:
        """Replicas still missing or being rebuilt."""
        return bool(self.missing)
