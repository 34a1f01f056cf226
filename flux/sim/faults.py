"""The faults the simulator injects: crashes, cut hosts, processes that go unheard, the
zombies they make, and damaged files of the checkpoint store.

- a crash stops a process at once; what it had sent and was still in flight survives
  only as a prefix of each of its outgoing queues (TCP delivers some of it), and
  everything addressed to it is lost. A crash the kernel reports (its connection drops)
  is followed by a ``detect`` step; a *silent* one (a machine that dies without a FIN)
  only stops being heard;
- a *cut* freezes every link of a host (TCP retransmits: nothing is lost, everything
  waits) until it heals; the host's processes keep running;
- a *starved* process is not heard for a while but runs and hears everyone (a false
  suspicion when it lasts past the timeout);
- a process declared dead while it runs is a *zombie*: it keeps stepping with whoever
  has not yet applied the view that fenced it, until its lease runs out or, heard again,
  it is told to stop;
- a file of the checkpoint store is damaged (altered or lost) while its checksum,
  recorded when it was written, stays (DESIGN 10).
"""
from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Optional, Tuple

from flux.addresses import Addr
from flux.sim.config import EGRESS_HOST, INGRESS_HOST, ZombieMachine
from flux.sim.store import StoredFile
from flux.state_codec import pack_state, unpack_state

#: the share of damaged files that are lost outright rather than altered
REMOVED_SHARE = 0.25


class Faults:
    """Who crashed, who is cut off or unheard, who runs as a zombie."""

    def __init__(self, world, corrupt_rng: random.Random):
        self.world = world
        self.crashed: List[str] = []
        #: every replica address whose process halted (a checkpoint whose writer halted
        #: before writing never completes: the next one does)
        self.halted_replicas: set = set()
        #: which file is damaged, and how: a stream of its own
        self.corrupt_rng = corrupt_rng
        self.corruptions_left = world.config.corrupt_checkpoints
        self.reset()

    def placed(self, addr, name: str) -> None:
        """The controller placed replica ``addr`` on ``name``: one that halted already never
        makes it, and its writing is lost as a halted replica's."""
        if not self.world.alive.get(name, True):
            self.halted_replicas.add(addr)

    def reset(self) -> None:
        """A new incarnation of the job: nobody cut, unheard or a zombie."""
        self.starved: Dict[str, float] = {}  # live but unheard until this tick
        self.cut: Dict[str, float] = {}  # host -> the tick its links heal
        self.zombies: set = set()  # declared dead while running
        self.told: set = set()  # zombies heard again: a Stop is on its way

    # -- crashes ------------------------------------------------------------------
    def crash(self, name: str, keep: Optional[Dict] = None, silent: bool = False) -> Dict:
        """Fail-stop: the process halts; a prefix of what it sent is still delivered.
        Its connections drop (a ``detect`` step follows) unless the crash is ``silent``.

        Returns how many messages each outgoing channel kept, so a replay (``keep``)
        truncates exactly as the original run did."""
        detection = self.world.detection
        kept = self.halt(name, keep, self.world.rng)
        self.crashed.append(name)
        if name in detection.declared:
            pass  # a zombie (declared already) crashed for real
        elif silent:
            detection.silent_crashes.add(name)
        else:
            detection.crashed_undetected.append(name)
        return kept

    def halt(self, name: str, keep: Optional[Dict] = None,
             rng: Optional[random.Random] = None) -> Dict:
        """The process stops: nothing more from it, a prefix of its in-flight messages
        survives, everything addressed to it is lost."""
        w = self.world
        rng = rng or w.fault_rng
        w.alive[name] = False
        mine = set(w.hosts[name].addresses())
        # and the replicas the controller placed there that it had not made yet (a join
        # or an avail it had not applied): their writing is lost as well
        self.halted_replicas |= mine | {a for a, n in w.recovery.node_of.items() if n == name}
        if name in self.zombies:
            self.zombies.discard(name)
            self.told.discard(name)
            w.outcome.zombie_stops.append(name)
            w.steps.forget(ZombieMachine(name, a) for a in mine)
        else:
            w.steps.forget(mine)
        return w.net.halt(name, mine, keep, rng)

    # -- the network hides a process ------------------------------------------------
    def starve(self, name: str, ticks: float) -> None:
        """``name`` runs but is not heard for ``ticks`` (a false suspicion if that lasts)."""
        self.starved[name] = self.world.detection.now + ticks

    def cut_host(self, name: str, ticks: float) -> None:
        """Every link of ``name`` is down for ``ticks``; its processes keep running."""
        self.cut[name] = self.world.detection.now + ticks

    def heard(self, name: str) -> bool:
        """Do ``name``'s beats reach the controller now?"""
        return self.world.alive[name] and name not in self.starved and name not in self.cut

    # -- who may be hit next --------------------------------------------------------
    def safe_victims(self) -> List[str]:
        """Live nodes and standbys whose crash leaves one replica of every pair alive."""
        w = self.world
        rec, detection = w.recovery, w.detection
        gone = set(rec.missing)
        for name in (detection.crashed_undetected + sorted(detection.silent_crashes)
                     + sorted(self.starved) + sorted(self.cut)):
            gone |= rec.hosted.get(name, set())
        victims = []
        for name in w.hosts:
            if (not w.alive[name] or name in (INGRESS_HOST, EGRESS_HOST)
                    or name in detection.declared):
                continue
            if all(Addr(a.stage, a.partition, 1 - a.replica) not in gone
                   for a in rec.hosted.get(name, ())):
                victims.append(name)
        return victims

    def faultable(self) -> List[str]:
        """Live workers not declared, cut or starved: who may be cut or starved next."""
        w = self.world
        return [n for n in w.detection.detector.live() if w.alive[n] and n not in self.cut
                and n not in self.starved]

    # -- damaged checkpoint files -----------------------------------------------------
    def damage(self) -> None:
        """One file of the store is damaged, its recorded checksum unchanged: a number in
        its operators' state changed (a restore of it gives a wrong state), or the file
        lost (also when it holds no number). The file is one a complete checkpoint reads if
        there is one (else any: a checkpoint may complete over a damaged file)."""
        self.corruptions_left -= 1
        rng, store, outcome = self.corrupt_rng, self.world.store, self.world.outcome
        read = sorted({f for _, chains in store.manifests.values() for chain in chains.values()
                       for f, _ in chain if f in store.files})
        fid = rng.choice(read or list(store.files))
        state = unpack_state(store.files[fid].data)
        numbers = _numbers(state["operators"]) + [
            n for _, delta in state.get("changes", ()) for n in _numbers(delta)]
        if numbers and rng.random() >= REMOVED_SHARE:
            holder, key = rng.choice(numbers)
            holder[key] += 1
            store.files[fid] = StoredFile(pack_state(state), state)
            outcome.damaged.append((fid, "altered"))
        else:
            del store.files[fid]
            outcome.damaged.append((fid, "removed"))


def _numbers(value: Any) -> List[Tuple[Any, Any]]:
    """Where a state holds a finite number: ``(container, index or key)`` of each."""
    found: List[Tuple[Any, Any]] = []
    items = (enumerate(value) if isinstance(value, list)
             else value.items() if isinstance(value, dict) else ())
    for key, item in items:
        if isinstance(item, (list, dict)):
            found.extend(_numbers(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item):
            found.append((value, key))
    return found
