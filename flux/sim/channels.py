"""The connections of the simulated cluster: a reliable FIFO queue per pair of endpoints
(paper 2.2), and the queue of views each process has still to apply.

Nothing on a live connection is dropped, duplicated or reordered; a crash keeps only a
prefix of what its process had in flight (``halt``), and loses what was addressed to it.

Whether the message at the head of a connection may be taken (``Host.accepts``) depends
on that message and on the process it reaches alone, so the answer is kept per
connection and asked again only when the head changed, the destination took a step, or
the routes changed (a zombie, a replica placed elsewhere, a halt). The deliver steps are
offered in the order their connections last became non-empty, as before the answers
were kept.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from flux.addresses import MoverAddr
from flux.control_messages import View
from flux.envelope import Envelope

Key = Tuple[Any, Any]


class Channels:
    """The FIFO links and view queues of one incarnation of the job (a restart makes new
    ones)."""

    def __init__(self, world):
        self.world = world
        self.queues: Dict[Key, Deque[Envelope]] = {}
        #: the non-empty connections, in the order they became so, each with its deliver
        #: step when its head may be taken (else None); and (same keys, same order) the
        #: process its head reaches then (else None)
        self.busy: Dict[Key, Optional[tuple]] = {}
        self.busy_hosts: Dict[Key, Optional[str]] = {}
        #: busy connections whose answer must be asked again
        self.stale: Set[Key] = set()
        #: process -> endpoint -> connections into it whose answer is kept (stale once the
        #: endpoint takes a step, or the process applies a view)
        self.waiting: Dict[str, Dict[Any, Set[Key]]] = {}
        self.views: Dict[str, Deque[View]] = {h: deque() for h in world.hosts}
        self.queued_views = 0
        #: mover channels that lost an envelope since the last one delivered on them
        self.mover_gaps: set = set()
        self.host_by_inc = {h.inc: n for n, h in world.hosts.items()}

    # -- routes ----------------------------------------------------------------
    def route(self, env: Envelope) -> str:
        """The process an envelope reaches: the incarnation it was meant for if that is a
        zombie (TCP to it still works), else whoever hosts the address now."""
        meant = self.host_by_inc.get(env.dst_inc)
        return meant if meant in self.world.faults.zombies else self.world.host_of[env.dst]

    def touched(self, name: str, addr: Any = None) -> None:
        """Endpoint ``addr`` of process ``name`` took a step (``None``: the whole process,
        as a view or its StateMover does): what it accepts may have changed."""
        if addr is None:
            for keys in self.waiting.pop(name, {}).values():
                self.stale |= keys
        else:
            keys = self.waiting.get(name, {}).pop(addr, None)
            if keys:
                self.stale |= keys

    def invalidate(self) -> None:
        """The routes changed (zombies, placements, halts): ask every connection again."""
        self.stale.update(self.busy)
        self.waiting.clear()

    # -- sending and delivering -------------------------------------------------
    def send(self, envelopes: List[Envelope]) -> None:
        world = self.world
        loss = world.config.mover_loss
        zombies, host_of, alive = world.faults.zombies, world.host_of, world.alive
        queues, busy = self.queues, self.busy
        for env in envelopes:
            dst_host = self.route(env) if zombies else host_of.get(env.dst)
            if dst_host is None or not alive[dst_host]:
                continue  # the peer is gone: TCP would fail the send
            if loss and isinstance(env.dst, MoverAddr) and world.fault_rng.random() < loss:
                world.outcome.mover_lost += 1
                self.mover_gaps.add((env.src, env.dst))  # the next one shows the gap
                continue  # a lossy mover link
            key = (env.src, env.dst)
            q = queues.get(key)
            if q is None:
                q = queues[key] = deque()
            if not q:
                busy[key] = self.busy_hosts[key] = None
                self.stale.add(key)
            q.append(env)

    def deliveries(self, steps: List[tuple], hosts: List[str], cut: Dict[str, float]) -> None:
        """Append the deliver steps enabled now (and the process each reaches)."""
        if self.stale:
            self._ask(cut)
        if cut:
            queues, by_inc, busy_hosts = self.queues, self.host_by_inc, self.busy_hosts
            for key, step in self.busy.items():
                if step is not None:
                    dst = busy_hosts[key]
                    if by_inc.get(queues[key][0].inc) in cut or dst in cut:
                        continue  # a cut link: TCP holds it until the cut heals
                    steps.append(step)
                    hosts.append(dst)
        else:
            steps += filter(None, self.busy.values())
            hosts += filter(None, self.busy_hosts.values())

    def _ask(self, cut: Dict[str, float]) -> None:
        """Ask the stale connections' destinations whether their heads may be taken; a
        cut link is not asked (it stays stale until the cut heals)."""
        world = self.world
        zombies, host_of, hosts = world.faults.zombies, world.host_of, world.hosts
        busy, busy_hosts, queues, by_inc = self.busy, self.busy_hosts, self.queues, self.host_by_inc
        blocked = []
        for key in self.stale:
            if key not in busy:
                continue
            head = queues[key][0]
            dst = self.route(head) if zombies else host_of[key[1]]
            if cut and (by_inc.get(head.inc) in cut or dst in cut):
                busy[key] = busy_hosts[key] = None
                blocked.append(key)
                continue
            if hosts[dst].accepts(head):
                busy[key], busy_hosts[key] = ("deliver", key), dst
            else:
                busy[key] = busy_hosts[key] = None
            into = self.waiting.get(dst)
            if into is None:
                self.waiting[dst] = {key[1]: {key}}
            else:
                keys = into.get(key[1])
                if keys is None:
                    into[key[1]] = {key}
                else:
                    keys.add(key)
        self.stale.clear()
        self.stale.update(blocked)

    def take(self, key: Key) -> Envelope:
        """The head of connection ``key``, taken off it."""
        q = self.queues[key]
        env = q.popleft()
        if q:
            self.stale.add(key)
        else:
            del self.busy[key], self.busy_hosts[key]
        return env

    def head(self, key: Key) -> Envelope:
        return self.queues[key][0]

    # -- views -----------------------------------------------------------------
    def view_steps(self, steps: List[tuple], hosts: List[str], cut: Dict[str, float]) -> None:
        if self.queued_views:
            for name, q in self.views.items():
                if q and name not in cut:
                    steps.append(("view", name))
                    hosts.append(name)

    def queue_views(self, views: List[View], alive: Dict[str, bool], declared: set) -> None:
        for view in views:
            for h, q in self.views.items():
                if alive[h] and h not in declared:
                    q.append(view)
                    self.queued_views += 1

    def take_view(self, name: str) -> View:
        self.queued_views -= 1
        return self.views[name].popleft()

    # -- a process halts --------------------------------------------------------
    def halt(self, name: str, mine: set, keep: Optional[Dict], rng) -> Dict:
        """Process ``name`` (owning the endpoints ``mine``) stopped: its views and what was
        addressed to it are lost (not what a zombie's connections carry to the zombie on a
        channel of the same addresses), and of its own in-flight messages on each channel
        a prefix survives (``keep``: how many, as a replay recorded them; else drawn).
        Returns how many each channel kept."""
        world = self.world
        self.queued_views -= len(self.views[name])
        self.views[name].clear()
        kept: Dict = {}
        for key in list(self.busy):
            src, dst = key
            q = self.queues[key]
            if dst in mine and world.host_of.get(dst) == name:
                if world.faults.zombies:  # a zombie's messages share the channel: its own
                    q = self.queues[key] = deque(e for e in q if self.route(e) != name)
                else:
                    q.clear()
            elif src in mine:  # its own messages: a prefix survives (others share the
                inc = world.hosts[name].inc  # channel: a rebuilt replica of its address)
                own = [e for e in q if e.inc == inc]
                if own:
                    n = keep.get(key, len(own)) if keep is not None else rng.randint(0, len(own))
                    kept[key] = n
                    lost = {id(e) for e in own[n:]}
                    if lost:
                        q = self.queues[key] = deque(e for e in q if id(e) not in lost)
            if not q:
                del self.busy[key], self.busy_hosts[key]
        self.invalidate()
        return kept
