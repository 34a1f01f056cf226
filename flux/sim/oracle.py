"""The oracle of DESIGN 8: failure transparency, checked as the run goes.

- every delivered prefix is a prefix of the failure-free output;
- at quiescence everything was delivered (else: a deadlock or a stall);
- at quiescence no buffer or merge queue still holds a tuple (buffers stay
  bounded: nothing is kept forever waiting for an ack that never comes);
- every live replica's operator state equals the failure-free state of its
  partition, so the two replicas of a pair are equal.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from flux.addresses import S, Addr
from flux.operator import wire_form


class Violation(Exception):
    """The run broke a property a user relies on."""


class PrefixOracle:
    """Checks each delivered item against the reference as it arrives.

    Items are compared in msgpack's wire form: state that moved to a new
    replica travelled as msgpack, so its tuples come back as lists."""

    def __init__(self, reference: Sequence[Any]):
        self.reference = [wire_form(item) for item in reference]
        self.checked = 0

    def check(self, delivered: Sequence[Any]) -> None:
        ref = self.reference
        for pos in range(self.checked, len(delivered)):
            got = wire_form(delivered[pos])
            if pos >= len(ref):
                raise Violation(f"extra output #{pos}: {got!r} (reference has {len(ref)})")
            if got != ref[pos]:
                raise Violation(f"output #{pos} is {got!r}, reference has {ref[pos]!r}")
        self.checked = len(delivered)


def writer_lost(world, k: int) -> bool:
    """Checkpoint ``k`` may stay incomplete only because a partition's writer halted
    before writing: every partition it waits for was crossed by the replica that does
    not write, and the S replica (the writer) was on a process that halted."""
    c = world.coordinator.checkpoints.get(k)
    if c is None:
        return False
    waiting = [(s, p) for s in range(1, world.coordinator.stages + 1)
               for p in range(world.coordinator.partitions) if (s, p) not in c.parts]
    return bool(waiting) and c.has_position and c.has_sink and all(
        (k, s, p) in world.store.skipped and Addr(s, p, S) in world.faults.halted_replicas
        for s, p in waiting)


def final_checks(world, expected: int, reference_states) -> Optional[str]:
    """What is wrong at quiescence, or None."""
    delivered = world.outcome.delivered
    problems: List[str] = []
    if len(delivered) != expected:
        problems.append(f"stalled: delivered {len(delivered)} of {expected} outputs")
    cuts = world.outcome.cuts
    # every checkpoint completes, or a later one completes (it is abandoned), or its writer
    # was lost, or a later one's was: a replica that learns of two cuts at once crosses only
    # the newer, and if that one's writer is then lost, the older one waits forever: harmless;
    # so does one a snapshot of which could not be written (its chain lost a file)
    settled = [k for k, _ in cuts if k in world.outcome.complete or writer_lost(world, k)
               or k in world.store.write_failed]
    unfinished = [k for k, _ in cuts if k not in world.outcome.complete
                  and k not in world.coordinator.abandoned()
                  and not any(j >= k for j in settled)]
    if unfinished:
        problems.append(f"checkpoints {unfinished} never completed: " + "; ".join(
            f"{k} waits for {', '.join(world.coordinator.missing(k))}" for k in unfinished))
    rec = world.recovery
    if rec.missing and (rec.free or rec.attempts):
        problems.append(f"catch-up stalled: {sorted(map(str, rec.missing))} still missing "
                        f"with standbys {rec.free or sorted(a.standby for a in rec.attempts.values())}")
    for addr, m in world.live_machines():
        m.check_invariants()
        if not m.idle():
            problems.append(f"{addr} still holds tuples at quiescence: {describe(m)}")
        chain = getattr(m, "chain", None)
        if chain is not None and reference_states is not None:
            want = wire_form(reference_states[addr.stage - 1][addr.partition])
            got = wire_form(chain.get_state())
            if got != want:
                problems.append(f"{addr} state differs from the failure-free state: {got!r} != {want!r}")
    return "; ".join(problems) if problems else None


def describe(m) -> str:
    parts = []
    fprod = getattr(m, "fprod", None) or getattr(m, "out", None)
    out = getattr(fprod, "out", fprod)
    if out is not None and hasattr(out, "buffers"):
        parts += [f"buffer[{i}]={b!r}" for i, b in enumerate(out.buffers) if len(b)]
    fcons = getattr(m, "fcons", None)
    if fcons is not None and fcons.merge.queued():
        parts.append(repr(fcons.merge))
    return ", ".join(parts)
