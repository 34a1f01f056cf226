"""The steps the scheduler may choose, and carrying one out.

The enabled steps come in a fixed order: deliveries (by connection), views, detections,
stops told to zombies, a tick of the detector's clock, every machine's local steps, the
sinks' opens (a writer started again) and own commits, and the damage of a checkpoint
file. A seed replays only if that order never changes, so whatever is kept between
steps is kept in it.

A machine's local steps depend on its own state alone: they are kept per machine and
asked again only for the machines a step touched (``dirty``), each with the process
whose speed decides how soon it happens (``host_of_step``).
"""
from __future__ import annotations

import random
from dataclasses import replace
from itertools import chain
from typing import List, Optional, Tuple

from flux.addresses import Addr, MoverAddr
from flux.effects import Snapshot
from flux.protocol.host import Host
from flux.protocol.ingress import INGRESS
from flux.protocol.machine import LocalWork
from flux.sim.config import (
    CHECKPOINT_STORE,
    CONTROLLER,
    EGRESS_HOST,
    INGRESS_HOST,
    INPUT_LOG,
    PROCESS_LIMITS,
    ZombieMachine,
)
from flux.sim.ingresses import ingress_took_over
from flux.state_codec import pack_state
from statemover.messages import LinkLost


#: the process whose speed decides the pace of steps of these kinds
PROCESS_OF_STEP = {"detect": CONTROLLER, "tick": CONTROLLER, "log": INPUT_LOG,
                   "corrupt": CHECKPOINT_STORE, "sink-commit": EGRESS_HOST,
                   "install-range": CONTROLLER, "join": CONTROLLER, "leave": CONTROLLER}


class Steps:
    """The enabled steps of a world, kept up to date, and how each is taken."""

    def __init__(self, world):
        self.world = world
        #: how many inputs a process step takes (``PROCESS_LIMITS``): its own stream, so
        #: the schedules' draws stay those of each seed
        self.batch_rng = random.Random(0)

    def reset(self) -> None:
        """A new incarnation of the job: every machine's local steps are to be asked."""
        #: machine key -> its local steps; and the process of each (same keys, same order)
        self.local: dict = {}
        self.local_hosts: dict = {}
        self.dirty = {a for a in self.world.host_of if isinstance(a, Addr)}

    # -- the enabled steps ------------------------------------------------------
    def collect(self) -> Tuple[List[tuple], List[str]]:
        """The enabled steps, and the process whose speed decides each one's pace."""
        w = self.world
        steps: List[tuple] = []
        hosts: List[str] = []
        if w.stopped:
            return steps, hosts
        faults, detection = w.faults, w.detection
        cut = faults.cut
        w.net.deliveries(steps, hosts, cut)
        w.net.view_steps(steps, hosts, cut)
        w.moves.steps(steps, hosts)  # ranges of live moves sent to their destinations
        for name in detection.crashed_undetected:
            steps.append(("detect", name))
            hosts.append(CONTROLLER)
        for name in sorted(faults.told):
            if name not in cut:  # the controller's Stop waits for the link too
                steps.append(("told", name))
                hosts.append(name)
        if detection.clock_runs():
            steps.append(("tick",))
            hosts.append(CONTROLLER)
        self._refresh()  # the machines a step touched
        steps.extend(chain.from_iterable(self.local.values()))
        hosts.extend(chain.from_iterable(self.local_hosts.values()))
        w.writers.steps(steps, hosts)  # sinks opened, and their own commits
        if faults.corruptions_left and w.store.files:
            steps.append(("corrupt",))  # a file of the store is damaged
            hosts.append(CHECKPOINT_STORE)
        if not steps and (stuck := w.restarts.stuck()):  # a drain's or a move's checkpoint
            steps, hosts = [stuck], [INGRESS_HOST]  # will not complete: the driver acts
        if not steps and w.recovery.attempts and w.config.mover_loss:
            steps.append(("tick",))  # a catch-up waits for what a lossy link lost: its
            hosts.append(CONTROLLER)  # deadline is long next to a healthy transfer
        return steps, hosts

    def _refresh(self) -> None:
        w = self.world
        local, local_hosts, zombies = self.local, self.local_hosts, w.faults.zombies
        for key in self.dirty:
            if isinstance(key, ZombieMachine):
                zombie = w.hosts[key.name]
                if key.name in zombies and key.addr in zombie.machines:
                    steps = local[key] = [("zombie", key.name, s) for s in
                                          self.local_steps(key.addr, zombie.work[key.addr])]
                    local_hosts[key] = [key.name] * len(steps)
                else:
                    local.pop(key, None)
                    local_hosts.pop(key, None)
            elif key in local or self._is_live_worker(key):
                steps = local[key] = self.local_steps(key)
                local_hosts[key] = self._hosts(key, steps)
        self.dirty.clear()

    def _hosts(self, key, steps: List[tuple]) -> List[str]:
        """``host_of_step`` of each of a machine's local steps."""
        if isinstance(key, Addr) and key.stage == 0:  # an ingress's are of several kinds
            return [self.host_of_step(s) for s in steps]
        if isinstance(key, ZombieMachine):
            return [key.name] * len(steps)
        return [self.world.host_of[key]] * len(steps)

    def rehost(self) -> None:
        """An address moved to another process: the paces of the steps kept follow it."""
        for key, steps in self.local.items():
            self.local_hosts[key] = self._hosts(key, steps)

    def _is_live_worker(self, addr: Addr) -> bool:
        w = self.world
        name = w.host_of.get(addr)
        return (name is not None and w.alive[name] and name != EGRESS_HOST
                and name not in w.faults.zombies and addr in w.hosts[name].machines)

    def local_steps(self, addr: Addr, work: Optional[LocalWork] = None) -> List[tuple]:
        """Machine ``addr``'s local steps, by its declared ``LocalWork`` (``work``: a zombie's)."""
        w = self.world
        if addr.stage == 0 and work is not None:  # a zombie's ingress replica: its flushes
            return [("flush", addr, i, d) for i, d in work.flushes.flushable()]
        if addr.stage == 0 and w.epochs is not None:  # one of several ingresses
            ingress = w.machine(addr)
            # of ingress 0's leader only (a follower's steps stay as they were when it moves)
            checkpoint = ingress is w.ingresses[0] and not w.restarts.draining() and bool(
                (w.checkpoints_left > 0 or w.restarts.rebuild_cut)
                and w.moves.sinks.open_checkpoint() is None
                and w.epochs.cut_epochs(w.ingresses, w.last_cut))
            slowest = min(ingress.epoch for ingress in w.ingresses)
            return [("flush", addr, i, d) for i, d in ingress.flushable()] + \
                w.epochs.steps(ingress, checkpoint, slowest, w.restarts.drain_epoch())
        if addr == INGRESS:
            ingress = w.ingress
            steps = [("flush", INGRESS, i, d) for i, d in ingress.flushable()]
            if w.next_input < len(w.inputs) and ingress.can_accept(w.inputs[w.next_input]) \
                    and w.restarts.gives_inputs():
                steps.append(("accept",))
            if ingress.can_cut():
                steps.append(("item",))  # the pending inputs leave as an item (DESIGN 11)
            if w.restarts.may_cut(ingress.accepted) and w.moves.sinks.open_checkpoint() is None:
                steps.append(("checkpoint",))
            if ingress.log_due():
                steps.append(("log",))  # the input log made durable up to here
            return steps
        work = work if work is not None else w.hosts[w.host_of[addr]].work[addr]
        flushes, processes, parts, snapshots = (work.flushes, work.processes, work.parts,
                                                work.snapshots)
        steps = [("flush", addr, i, d) for i, d in flushes.flushable()] if flushes else []
        if processes is not None:
            if processes.can_process():
                steps.append(("process", addr))
            if processes.credits_due():
                steps.append(("credit", addr))  # back-pressure: what it took may be replaced
        if parts is not None and parts.has_part():
            steps.append(("part", addr))  # phase 1 of catch-up: one bulk part out
        if snapshots is not None and snapshots.snapshot_due():
            steps.append(("snapshot", addr))  # a checkpoint's cut crossed
        return steps

    def host_of_step(self, step: tuple) -> str:
        """The process whose speed decides how soon ``step`` happens."""
        w = self.world
        kind = step[0]
        if kind == "deliver":
            return w.net.route(w.net.head(step[1])) if w.faults.zombies else w.host_of[step[1][1]]
        if kind in ("view", "told", "zombie", "sink-open"):
            return step[1]
        if kind in PROCESS_OF_STEP:
            return PROCESS_OF_STEP[kind]
        if kind in ("accept", "item", "checkpoint", "epoch", "drain-stuck"):  # a pair's: its node's
            return w.host_of[step[1]] if w.config.ingress_pairs else INGRESS_HOST
        return w.host_of[step[1]]

    # -- machines that stop or change hands ---------------------------------------
    def key(self, name: str, addr: Addr):
        """The key of machine ``addr`` of process ``name`` among the local steps."""
        return ZombieMachine(name, addr) if name in self.world.faults.zombies else addr

    def forget(self, keys) -> None:
        for key in keys:
            self._drop(key)

    def _drop(self, key) -> None:
        self.local.pop(key, None)
        self.local_hosts.pop(key, None)

    def become_zombie(self, name: str) -> None:
        """Process ``name`` was declared dead while it runs: its steps go on under keys
        of its own (its addresses may name new replicas elsewhere)."""
        w = self.world
        for a in w.hosts[name].machines:
            if w.host_of.get(a) == name:
                self._drop(a)
                self.dirty.discard(a)
            self.dirty.add(ZombieMachine(name, a))

    # -- taking a step ---------------------------------------------------------
    def apply(self, step: tuple) -> None:
        w = self.world
        kind = step[0]
        if kind == "deliver":
            net = w.net
            env = net.take(step[1])
            host = w.hosts[net.route(env) if w.faults.zombies else w.host_of[env.dst]]
            # the StateMover's signals reach the host's segments
            net.touched(host.name, None if isinstance(env.dst, MoverAddr) else env.dst)
            if step[1] in net.mover_gaps:  # the transport sees the gap before this one
                net.mover_gaps.discard(step[1])
                w.effects(*host.on_envelope(replace(env, msg=LinkLost(0, 1))), host=host)
            self.dirty.add(self.key(host.name, env.dst))
            if isinstance(env.dst, MoverAddr):  # mover signals reach its segments
                self.dirty.update(self.key(host.name, a) for a in host.machines)
            w.effects(*host.on_envelope(env), host=host)
        elif kind == "view":
            self._apply_view(step[1])
        elif kind == "detect":
            w.detection.detect(step[1])
        elif kind == "tick":
            w.detection.tick()
        elif kind == "told":
            w.faults.halt(step[1])  # a zombie heard again: the controller told it to stop
        elif kind == "zombie":  # a local step of a machine of a zombie
            self._apply_local(step[2], w.hosts[step[1]])
        elif kind == "checkpoint" and w.epochs is not None:
            self._cut_at_epoch()
        elif kind in ("accept", "item", "epoch", "log") and w.epochs is not None:
            addr = step[1]
            ingress, host = w.machine(addr), w.hosts[w.host_of[addr]]
            w.net.touched(host.name, addr)
            epoch = ingress.epoch
            effects = w.epochs.apply(kind, ingress)
            w.effects(*host.run_local(effects))
            if effects or ingress.epoch != epoch:  # the others' steps look at its epoch
                self.dirty.update(self.key(w.host_of[i.addr], i.addr) for i in w.ingresses)
            self.dirty.add(addr)  # (a follower is none of ``ingresses``, the leaders)
        elif kind in ("accept", "item", "log", "checkpoint"):
            self._apply_ingress(kind)
        elif kind in ("sink-commit", "sink-open"):  # a sink's own commit; one opened
            self.dirty.update(w.writers.apply(step))
        elif kind == "drain-stuck":  # cut again, or the rescale given up: the source goes on
            if w.restarts.recut():
                self._cut_at_epoch() if w.epochs is not None else self._apply_ingress("checkpoint")
            self.dirty.update(self.key(w.host_of[i.addr], i.addr) for i in w.ingresses)
        elif kind == "corrupt":
            w.faults.damage()
        elif kind in ("install-range", "move-stuck", "join", "leave"):  # a range to a
            self.dirty.update(w.moves.apply(step))  # replica, a restart, pairs started, left
        else:
            self._apply_local(step, w.hosts[w.host_of[step[1]]])

    def _apply_view(self, name: str) -> None:
        w = self.world
        view = w.net.take_view(name)
        host = w.hosts[name]
        effects = host.on_view(view)
        w.net.touched(name)
        machines, host_of = host.machines, w.host_of
        for key in [k for k in self.local if
                    (k.addr if isinstance(k, ZombieMachine) else k) not in machines
                    and (k.name if isinstance(k, ZombieMachine) else host_of.get(k)) == name]:
            self._drop(key)  # a discarded replica has no more steps
        self.dirty.update(self.key(name, a) for a in machines)
        w.effects(*effects, host=host)
        if w.config.ingress_pairs:
            ingress_took_over(w)

    def _cut_at_epoch(self) -> None:
        w = self.world
        w.net.touched(INGRESS_HOST, None)
        w.restarts.cut_at_epoch()
        self.dirty.update(self.key(w.host_of[i.addr], i.addr) for i in w.ingresses)

    def _apply_ingress(self, kind: str) -> None:
        w = self.world
        ingress = w.ingress
        w.net.touched(INGRESS_HOST, INGRESS)
        if kind == "accept":
            ingress.accept(w.inputs[w.next_input])
            w.next_input += 1
            self.dirty.add(INGRESS)
        elif kind == "item":
            ingress.cut_item()
            self.dirty.add(INGRESS)
        elif kind == "log":
            n = ingress.accepted
            w.restarts.logged_inputs = max(w.restarts.logged_inputs, n)
            w.effects(*w.hosts[INGRESS_HOST].run_local(ingress.inputs_logged(n)))
            self.dirty.add(INGRESS)
        else:
            number = w.restarts.take_cut(ingress.accepted)
            self.dirty.add(INGRESS)
            cut = ingress.choose_cut(number, w.moves.choose(  # (the last stage's: past
                number, ingress.accepted, last_blocked=w.restarts.drain_cut()))  # sinks)
            w.effects(*w.hosts[INGRESS_HOST].run_local(cut))

    def _apply_local(self, step: tuple, host: Host) -> None:
        w = self.world
        kind, addr = step[0], step[1]
        machine, work = host.machines[addr], host.work[addr]
        self.dirty.add(self.key(host.name, addr))
        w.net.touched(host.name, None if kind == "part" else addr)  # a part goes by its mover
        if kind == "process":  # one input, or as the runtime does, several in one step
            limit = self.batch_rng.choice(PROCESS_LIMITS)
            if limit == 1:
                work.processes.process()
            else:
                work.processes.process_ready(limit)
        elif kind == "part":
            w.outcome.part_steps += 1
            w.effects(*host.run_local(work.parts.send_part()))
        elif kind == "credit":
            w.effects(*host.run_local(work.processes.send_credits()))
        elif kind == "flush":
            w.effects(*host.run_local(work.flushes.flush(*step[2:])))
        elif kind == "snapshot":
            # one replica of a pair writes (the runtime's rule, DESIGN 10; both at some
            # cuts): its twin crosses without packing; the oracle judges the state it crossed
            keep = w.store.writes(host, addr) or work.snapshots.both_replicas_write()
            envelopes, others = host.run_local(work.snapshots.snapshot(keep))
            for e in others:
                if isinstance(e, Snapshot) and e.data is None:
                    w.judge_snapshot(replace(e, data=pack_state(
                        {"operators": machine.chain.get_state()})))
            w.effects(envelopes, others, host=host)
        else:
            raise ValueError(f"unknown step {step}")
