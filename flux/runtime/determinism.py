"""Is a dataflow deterministic? Run it twice in fresh processes and compare (DESIGN 4.1).

Flux is right only if both replicas of a partition compute the same outputs and state
from the same inputs. An operator that iterates a ``set`` or a ``dict`` keyed by
strings in hash order, reads the clock or draws random numbers breaks that silently:
the next failover delivers the other replica's different output. Python randomizes
string hashes per process (``PYTHONHASHSEED``), so the two replicas of a pair, in two
processes, iterate such a set in different orders.

``check_deterministic`` runs the failure-free reference (``flux.reference``) over the
same records in two fresh interpreters with different hash seeds, each recording what
every stage took in and every operator's state at the end, and compares: the first
stage whose input differs names the stage before it as the one that produced
differently; a state that differs names the operator. It raises ``DataflowError``
saying which, and why that matters.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any, Iterable, List, Optional, Sequence

from flux.dataflow import Dataflow, factory_name
from flux.errors import DataflowError
from flux.operator import wire_form
from flux.reference import ReferenceRun

#: two different hash seeds: set and dict orders of strings differ between them
SEEDS = ("1", "2")


def run_once(dataflow: Dataflow, records: Sequence[Any], partitions: int) -> dict:
    """What the check compares, from one process: every stage's inputs, the outputs, and
    a digest of every operator's state (msgpack'd, as catch-up and checkpoints move it: a
    digest, so that 100 MB of state per partition does not cross the pipe)."""
    import hashlib

    import msgpack

    taken: List[list] = [[] for _ in dataflow.stages]  # what every stage took in, in order
    run = ReferenceRun(dataflow, partitions,
                       watch=lambda s, sn, record: taken[s].append((tuple(sn), wire_form(record))))
    outputs = [(tuple(sn), wire_form(r)) for record in records for sn, r in run.feed(record)]
    states = [[[hashlib.blake2b(msgpack.packb(op.get_state(), use_bin_type=True)).digest()
                 for op in chain.operators]
               for chain in stage] for stage in run.chains]
    return {"taken": taken, "outputs": outputs, "states": states}


def _in_fresh_process(seed: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": seed,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen([sys.executable, "-m", "flux.runtime.determinism"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _result(proc: subprocess.Popen, payload: bytes, seed: str, timeout: float) -> dict:
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise DataflowError(f"the determinism check did not finish within {timeout} s "
                            f"(PYTHONHASHSEED={seed})") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise DataflowError(f"the dataflow failed in a fresh process (PYTHONHASHSEED="
                            f"{seed}): {tail[0]}")
    return pickle.loads(out)


def check_deterministic(dataflow: Dataflow, records: Iterable[Any], partitions: int = 4,
                        timeout: float = 120.0) -> None:
    """Raise ``DataflowError`` if ``dataflow`` over ``records`` computes other outputs or
    other state in two fresh processes with different hash seeds (``records`` are sent
    to them pickled: they and the dataflow must pickle, as a job needs anyway)."""
    import cloudpickle

    records = list(records)
    if not records:
        return
    payload = cloudpickle.dumps((dataflow, records, partitions))
    procs = [_in_fresh_process(seed) for seed in SEEDS]  # side by side
    try:
        first, second = (_result(p, payload, s, timeout) for p, s in zip(procs, SEEDS))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    problem = _first_difference(dataflow, first, second, len(records))
    if problem is not None:
        raise DataflowError(problem)


def _first_difference(dataflow: Dataflow, a: dict, b: dict, n: int) -> Optional[str]:
    why = ("the two replicas of a partition run in two processes and must compute the same "
           "outputs and state (DESIGN 4.1): iterate sets and dicts in a sorted order, and "
           "take no clock or random numbers of their own")
    stages = dataflow.stages
    for s in range(1, len(stages)):  # what stage s took in is what stage s - 1 made
        if a["taken"][s] != b["taken"][s]:
            return (f"stage {s} ({stages[s - 1].name!r}: {_names(stages[s - 1])}) gives other "
                    f"outputs from the same {n} records in two fresh processes with different "
                    f"hash seeds ({_first_unequal(a['taken'][s], b['taken'][s])}): {why}")
    if a["outputs"] != b["outputs"]:
        s = len(stages)
        return (f"stage {s} ({stages[-1].name!r}: {_names(stages[-1])}) gives other outputs "
                f"from the same {n} records in two fresh processes with different hash seeds "
                f"({_first_unequal(a['outputs'], b['outputs'])}): {why}")
    for s, (stage_a, stage_b) in enumerate(zip(a["states"], b["states"]), 1):
        for p, (chain_a, chain_b) in enumerate(zip(stage_a, stage_b)):
            for k, (state_a, state_b) in enumerate(zip(chain_a, chain_b)):
                if state_a != state_b:
                    name = factory_name(stages[s - 1].operators[k])
                    return (f"stage {s} ({stages[s - 1].name!r}), operator {name}: its state "
                            f"after the same {n} records differs between two fresh processes "
                            f"with different hash seeds (partition {p}): {why}")
    return None


def _names(stage) -> str:
    return ", ".join(factory_name(f) for f in stage.operators)


def _first_unequal(a: list, b: list) -> str:
    for x, y in zip(a, b):
        if x != y:
            return f"first {_short(x)} against {_short(y)}"
    return f"{len(a)} against {len(b)} records"


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


if __name__ == "__main__":  # one side of the check: payload on stdin, result on stdout
    from flux.state_codec import paused_gc

    with paused_gc():  # big states are acyclic: collecting while they are built costs 4x
        dataflow, records, partitions = pickle.loads(sys.stdin.buffer.read())
        result = run_once(dataflow, records, partitions)
    sys.stdout.buffer.write(pickle.dumps(result))
