"""Shrink a violating schedule to a short trace that still violates.

A schedule is replayed from a *script*: the recorded steps (crashes with the
exact channel truncation they made). A scripted step that is not enabled any
more is skipped; when the script runs out the run goes on deterministically
(first enabled step) to quiescence, so the oracle's end checks still apply.
Shrinking removes chunks of the script (delta debugging) while the replay
still reports a violation.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from flux.sim.schedule import VIOLATION, ScheduleResult, SimParams, execute

Script = List[Tuple[tuple, object]]


class ScriptedChooser:
    """Replays a script, then finishes the run with the first enabled step each time."""

    def __init__(self, script: Script):
        self.script = list(script)
        self.pos = 0

    def __call__(self, world, rng, t):
        while self.pos < len(self.script):
            step, payload = self.script[self.pos]
            self.pos += 1
            if step[0] == "restart":
                return step, None
            if step[0] in ("crash", "cut", "starve"):
                if world.alive[step[1]]:
                    return step, payload if isinstance(payload, dict) else {}
                continue
            if step in world.enabled():
                return step, None
        steps = world.enabled()
        return (steps[0], None) if steps else None


def replay(seed: int, params: SimParams, script: Script) -> ScheduleResult:
    return execute(seed, params, ScriptedChooser(script))


def script_of(result: ScheduleResult) -> Script:
    return [(step, payload if step[0] == "crash" else None) for step, payload in result.trace]


def category(reason: str) -> str:
    """The kind of a violation, so shrinking keeps the same failure, not just any."""
    head = reason.split(":", 1)[0]
    if head.endswith("Error") or head.endswith("Misuse"):
        return head
    for kind, marker in (("output", "output #"), ("stall", "stalled"), ("state", "state differs"),
                         ("buffer", "still holds"), ("livelock", "no quiescence")):
        if marker in reason:
            return kind
    return reason


def shrink(seed: int, params: SimParams, script: Script, max_replays: int = 2000) -> Tuple[Script, ScheduleResult]:
    """The shortest script found whose replay still shows the same kind of violation."""
    best = replay(seed, params, script)
    if best.status != VIOLATION:
        raise ValueError(f"seed {seed}: the script does not reproduce a violation ({best.status})")
    kind = category(best.reason)
    replays = 1
    chunks = 2
    while len(script) >= 2 and replays < max_replays:
        size = max(1, len(script) // chunks)
        reduced = False
        for start in range(0, len(script), size):
            candidate = script[:start] + script[start + size:]
            result = replay(seed, params, candidate)
            replays += 1
            if result.status == VIOLATION and category(result.reason) == kind:
                script, best, reduced = candidate, result, True
                chunks = max(2, chunks - 1)
                break
            if replays >= max_replays:
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(script), chunks * 2)
    return script, best


def shrink_result(result: ScheduleResult, params: SimParams,
                  max_replays: int = 2000) -> Optional[Tuple[Script, ScheduleResult]]:
    """Shrink a violation found by ``run_schedule`` (None if it does not replay)."""
    try:
        return shrink(result.seed, params, script_of(result), max_replays)
    except ValueError:
        return None
