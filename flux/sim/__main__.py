"""python -m flux.sim --schedules N --seed S [--stages K] [--partitions P] [--crashes C]
[--cuts N] [--false-suspicions N] [--lossy-mover P] [--checkpoints N] [--restarts N]
[--full-every N] [--source-partitions K] [--corrupt-checkpoints N] [--keep-checkpoints N]
[--fingerprint] [--jobs J]

Runs N seeded schedules (seeds S, S+1, ..., S+N-1), prints one line per
violation with its seed and a short trace, then the line ``schedules=N violations=V``
(the last of stdout), and after it on stderr the rate: ``# R schedules/s, ...``. Exit
status is non-zero exactly when V > 0. With ``--fingerprint`` a line
``fingerprint=HEX`` comes just before it: one digest over every schedule's steps, what each
carried and how each schedule ended, so two versions of the simulator or the protocol can
be shown to take exactly the same steps. With ``--jobs J`` the schedules run in J
processes; what is printed (violations, counts, fingerprint) is the same, in the seeds'
order, whatever J. From the command line J is every CPU the process may use unless
given; ``main(argv)`` called with arguments runs in one process unless told.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import multiprocessing
import multiprocessing.reduction
import os
import sys
import time
from typing import Iterator, List, Optional, Tuple

from flux.runtime.gc_tuning import data_path_gc
from flux.sim.schedule import (
    CHECKPOINT_CORRUPT,
    DATAFLOWS,
    DIVERGED,
    UNDEFINED,
    PAIR_LOST,
    PLACEMENTS,
    VIOLATION,
    SimParams,
    format_trace,
    run_schedule,
)
from flux.sim.shrink import shrink_result
from flux.sim.variants import VARIANTS


def crash_window(params: SimParams) -> int:
    """Steps of a failure-free run: crashes are spread uniformly over that span.

    Computed from a fixed seed so that ``--seed S --schedules 1`` replays
    schedule S of any longer run exactly."""
    quiet = SimParams(**{**params.__dict__, "crashes": 0, "victims": (), "cuts": 0,
                         "false_suspicions": 0, "restarts": 0, "corrupt_checkpoints": 0})
    return max(1, run_schedule(0, quiet, 1).steps)


def fingerprint(result) -> bytes:
    """One schedule's steps (each with what it carried: the envelope delivered, the view,
    what a crash kept) and its ending, as bytes to digest."""
    parts = [f"{result.seed} {result.status} {result.steps} {result.delivered} "
             f"{result.expected} {result.reason!r}"]
    parts.extend(f"{step!r} {canonical(payload)}" for step, payload in result.trace)
    return "\n".join(parts).encode()


def canonical(value) -> str:
    """``repr`` with sets sorted and memory views as their bytes, so the text is the same
    whatever the hash seed and wherever the bytes lie."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(canonical, value))) + "}"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(map(canonical, value)) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{canonical(k)}: {canonical(v)}"
                                      for k, v in value.items())) + "}"
    if isinstance(value, memoryview):
        return repr(bytes(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__ + "(" + ", ".join(
            f"{f.name}={canonical(getattr(value, f.name))}"
            for f in dataclasses.fields(value)) + ")"
    return repr(value)


def _run_one(job: Tuple[int, SimParams, int, bool]):
    """One schedule in a worker process: its result without the trace (what the parent
    counts), the trace kept for a violation (printed, maybe shrunk), and its fingerprint's
    bytes if asked."""
    seed, params, window, want_fingerprint = job
    result = run_schedule(seed, params, window)
    digest = fingerprint(result) if want_fingerprint else None
    if result.status != VIOLATION:
        result = dataclasses.replace(result, trace=[])
    return result, digest


def _as_bytes(view: memoryview):
    return bytes, (view.tobytes(),)


def run_schedules(seeds: range, params: SimParams, window: int, jobs: int,
                  want_fingerprint: bool) -> Iterator[Tuple[object, Optional[bytes]]]:
    """Every schedule's (result, fingerprint bytes) in the seeds' order, run in ``jobs``
    processes. Schedules share nothing (each is one seed), so running them apart changes
    none of them."""
    work = [(seed, params, window, want_fingerprint) for seed in seeds]
    # A schedule allocates a world of small objects that refer to each other, and the
    # cycle collector ran often (py-spy: about 7% of a run). With the nodes' thresholds
    # (flux.runtime.gc_tuning) a run takes 0.98 of the time; forked workers inherit them.
    with data_path_gc():
        if jobs <= 1:
            yield from map(_run_one, work)
            return
        # a violation's trace goes back whole, and a state transfer's chunks are memory
        # views of the part they cut: they travel as their bytes
        multiprocessing.reduction.ForkingPickler.register(memoryview, _as_bytes)
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            yield from pool.imap(_run_one, work, chunksize=4)


def schedules(params: SimParams, seeds, jobs: Optional[int] = None) -> List[object]:
    """The results of the schedules of ``seeds``, in their order, run in ``jobs`` processes
    (default: two, or one on a single CPU), each with ``crash_window(params)``: what the
    tests of many schedules use. Only a violation keeps its trace."""
    if jobs is None:
        jobs = min(2, len(os.sched_getaffinity(0)))
    window = crash_window(params)
    return [result for result, _ in run_schedules(seeds, params, window, jobs, False)]


def print_shrunk(result, params: SimParams) -> None:
    shrunk = shrink_result(result, params)
    if shrunk is None:
        print("  (the violation did not replay from its script)")
        return
    script, replayed = shrunk
    print(f"  shrunk to {len(script)} scripted steps; replay: {replayed.reason}")
    print("    " + format_trace(replayed).replace("\n", "\n    "), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flux.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--crashes", type=int, default=2)
    ap.add_argument("--standbys", type=int, default=0, help="standby nodes for catch-up")
    ap.add_argument("--inputs", type=int, default=24, help="input records per schedule")
    ap.add_argument("--dataflow", choices=list(DATAFLOWS), default="counter")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="none",
                    help="run a deliberately broken protocol variant")
    ap.add_argument("--placement", choices=sorted(PLACEMENTS), default="chained")
    ap.add_argument("--cuts", type=int, default=0,
                    help="cut every link of a live host this many times (it heals; crashes "
                         "are then silent half of the time)")
    ap.add_argument("--false-suspicions", type=int, default=0,
                    help="a running process goes unheard by the controller this many times")
    ap.add_argument("--lossy-mover", type=float, default=0.0, metavar="P",
                    help="lose each envelope between StateMovers with probability P")
    ap.add_argument("--checkpoints", type=int, default=0,
                    help="checkpoints the ingress takes per schedule (DESIGN 10); a lost "
                         "pair then restarts the job from the last complete one")
    ap.add_argument("--restarts", type=int, default=0,
                    help="whole-job restarts (everything stops at once) per schedule")
    ap.add_argument("--source-partitions", type=int, default=1, metavar="K",
                    help="the source's own partitions: with K > 1 the ingress logs the SNs "
                         "it gives before inputs leave, and a restart reads what the log "
                         "does not cover in another interleaving (DESIGN 10)")
    ap.add_argument("--full-every", type=int, default=0, metavar="N",
                    help="a replica's checkpoint snapshots are whole once in N, else the "
                         "changes of its keyed stores (0: N drawn per schedule, 1 to 4)")
    ap.add_argument("--corrupt-checkpoints", type=int, default=0, metavar="N",
                    help="damage a file of the checkpoint store N times per schedule (its "
                         "checksum unchanged): a restart falls back to an older checkpoint "
                         "that verifies, or the job stops as checkpoint-corrupt")
    ap.add_argument("--keep-checkpoints", type=int, default=0, metavar="N",
                    help="complete checkpoints the store keeps, and the input log what the "
                         "oldest of them covers (0: 2 with --corrupt-checkpoints, else all)")
    ap.add_argument("--partitioned-egress", action="store_true",
                    help="an egress and a sink per last-stage partition, each committing by "
                         "itself at the cuts (docs/design/parallel_io.md)")
    ap.add_argument("--writers-on-nodes", action="store_true",
                    help="each last-stage partition's egress a sink's writer on a node, "
                         "acking at its commits and started again beside the survivor when "
                         "its node dies (docs/design/parallel_io.md)")
    ap.add_argument("--ingresses", type=int, default=1, metavar="K",
                    help="K ingresses, each reading a source partition of its own and "
                         "numbering its inputs in epochs (DESIGN 12)")
    ap.add_argument("--ingress-pairs", action="store_true",
                    help="each of the --ingresses a pair of replicas on the nodes, dying with "
                         "them: a stage-1 replica whose ingress replica dies reverses to its "
                         "twin (docs/design/parallel_io.md)")
    ap.add_argument("--rescale-to", default="", metavar="M[,M2...]",
                    help="every restart runs at the next of these partition counts, each "
                         "partition's state split by key group from the checkpoint "
                         "(DESIGN 13; with --checkpoints and --dataflow regroup); with a "
                         "sink per partition only the drained cuts of --rescale-cuts do "
                         "(docs/design/rescaling.md)")
    ap.add_argument("--moves", type=int, default=0, metavar="K",
                    help="K live moves of a key-group range from one running partition to "
                         "another, each carried by a checkpoint's cut (DESIGN 13; with "
                         "--checkpoints and --dataflow regroup)")
    ap.add_argument("--live-rescales", default="", metavar="N,M[,M2...]",
                    help="the keys start spread over N of the --partitions pairs (the others "
                         "own no group yet); each next count is reached live, by the moves "
                         "of one checkpoint's cut (DESIGN 13)")
    ap.add_argument("--dormant", action="store_true",
                    help="with --live-rescales: the pairs past the first count have no "
                         "process until a live rescale needs them; they join then, on "
                         "standbys (docs/design/rescaling.md)")
    ap.add_argument("--rescale-cuts", type=int, default=0, metavar="K",
                    help="K rescales asked for while the job runs (job.rescale), each at a "
                         "random step: a checkpoint cut at once, and the job restarted from "
                         "it at the next count of --rescale-to")
    ap.add_argument("--fingerprint", action="store_true",
                    help="print a digest of every schedule's steps and outcome (to compare "
                         "two versions: the same digest, the same schedules)")
    ap.add_argument("--jobs", type=int, default=None, metavar="J",
                    help="run the schedules in J processes (the same output, faster on J "
                         "cores; default: every CPU this process may use)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the whole trace of violations")
    ap.add_argument("--shrink", action="store_true",
                    help="shrink each violation to a short script and print its trace")
    from_command_line = argv is None
    args = ap.parse_args(argv)
    if args.jobs is None:
        args.jobs = len(os.sched_getaffinity(0)) if from_command_line else 1
    if args.schedules < 1:
        ap.error("--schedules must be >= 1")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    params = SimParams(stages=args.stages, partitions=args.partitions, crashes=args.crashes,
                       inputs=args.inputs, dataflow=args.dataflow, variant=args.variant,
                       placement=args.placement, standbys=args.standbys, cuts=args.cuts,
                       false_suspicions=args.false_suspicions, lossy_mover=args.lossy_mover,
                       checkpoints=args.checkpoints, restarts=args.restarts,
                       full_every=args.full_every,
                       source_partitions=args.source_partitions,
                       corrupt_checkpoints=args.corrupt_checkpoints,
                       keep_checkpoints=args.keep_checkpoints,
                       partitioned_egress=args.partitioned_egress,
                       writers_on_nodes=args.writers_on_nodes,
                       ingresses=args.ingresses, ingress_pairs=args.ingress_pairs,
                       rescale_to=tuple(int(n) for n in args.rescale_to.split(",") if n),
                       rescale_cuts=args.rescale_cuts, moves=args.moves,
                       live_rescales=tuple(int(n) for n in args.live_rescales.split(",") if n),
                       dormant=args.dormant)
    try:
        params.validate()
    except ValueError as exc:
        ap.error(str(exc))
    window = crash_window(params)
    violations = pair_lost = steps = catchups = bulk_parts = deltas = part_steps = 0
    zombies = mover_lost = deadlines = cuts = snapshots = complete = restarts = 0
    snapshot_deltas = damaged = fallbacks = corrupt_stops = failed_writes = 0
    compared = diverged = undefined = probed = named = sets_rebuilt = rescales = 0
    drains = given_up = moves = moves_done = live = by_changes = moves_last = stuck = 0
    moved_rescaled = joins = onto_joined = leaves = rejoins = 0
    digest = hashlib.sha256()
    started = time.perf_counter()
    seeds = range(args.seed, args.seed + args.schedules)
    for result, schedule_digest in run_schedules(seeds, params, window, args.jobs,
                                                 args.fingerprint):
        seed = result.seed
        if schedule_digest is not None:
            digest.update(schedule_digest)
        steps += result.steps
        catchups += len(result.catchups)
        bulk_parts += result.bulk_parts
        deltas += result.deltas
        part_steps += result.part_steps
        zombies += len(result.zombies)
        mover_lost += result.mover_lost
        deadlines += result.deadlines
        cuts += len(result.cuts)
        snapshots += result.snapshots
        snapshot_deltas += result.snapshot_deltas
        complete += len(result.complete)
        restarts += len(result.restarts)
        sets_rebuilt += result.sets_rebuilt
        rescales += result.rescales
        drains += len(result.drains)
        given_up += result.rescales_given_up
        moves += result.moves
        moves_done += result.moves_done
        by_changes += result.moves_by_changes
        moves_last += result.moves_last
        stuck += result.moves_stuck
        moved_rescaled += result.moves_rescaled
        live += result.live_rescales
        joins += result.joins
        leaves += result.leaves
        rejoins += result.rejoins
        onto_joined += result.onto_joined
        damaged += len(result.damaged)
        fallbacks += len(result.fallbacks)
        failed_writes += result.failed_writes
        compared += result.digests_compared
        probed += result.keys_probed
        named += result.keys_named
        if result.status == DIVERGED:
            diverged += 1
        elif result.status == UNDEFINED:
            undefined += 1
        elif result.status == PAIR_LOST:
            pair_lost += 1
        elif result.status == CHECKPOINT_CORRUPT:
            corrupt_stops += 1
        elif result.status == VIOLATION:
            violations += 1
            crashes = ",".join(result.crashed) or "none"
            short = format_trace(result, last=None if args.verbose else 6).replace("\n", " | ")
            print(f"violation seed={seed} crashed={crashes} steps={result.steps}: {result.reason}"
                  f"\n  trace: {short}", flush=True)
            if args.shrink:
                print_shrunk(result, params)
    elapsed = time.perf_counter() - started
    corruption = (f"damaged files={damaged}, fallbacks={fallbacks}, "
                  f"checkpoint-corrupt={corrupt_stops}, failed writes={failed_writes}, "
                  if params.corrupt_checkpoints else "")
    print(f"# pair_lost={pair_lost}, catch-ups={catchups}, bulk parts installed={bulk_parts} "
          f"(part steps={part_steps}), deltas installed={deltas}, zombies={zombies}, "
          f"mover envelopes lost={mover_lost}, catch-up deadlines={deadlines}, "
          f"checkpoints={cuts} (snapshots={snapshots}, of them deltas={snapshot_deltas}, "
          f"complete={complete}), "
          f"digest pairs compared={compared}, diverged={diverged} (key named {named}/{probed}), "
          f"{f'nondeterminism-raised={undefined}, ' if undefined else ''}"
          f"restarts={restarts}{f' (sets rebuilt {sets_rebuilt})' if sets_rebuilt else ''}"
          f"{f' (rescaled {rescales})' if rescales else ''}"
          f"{f' (segments restored from moved groups at another count {moved_rescaled})' if moved_rescaled else ''}"
          f"{f' (drained {drains}, given up {given_up})' if drains or given_up else ''}, "
          f"{f'live moves={moves} (installed by both replicas {moves_done}, packs of changes since a bulk {by_changes}), ' if moves else ''}"
          f"{f'cuts moving the last stage with a sink per partition={moves_last} (restarts for one whose checkpoint could not complete {stuck}), ' if moves_last else ''}"
          f"{f'live rescales={live}, ' if params.live_rescales else ''}"
          f"{f'joins of dormant pairs={joins} (live rescales onto them {onto_joined}, of pairs that had left {rejoins}), leaves={leaves}, ' if params.dormant else ''}"
          f"{corruption}"
          f"crash_window={window} steps",
          file=sys.stderr)
    if args.fingerprint:
        print(f"fingerprint={digest.hexdigest()}")
    print(f"schedules={args.schedules} violations={violations}", flush=True)
    jobs = f", {args.jobs} processes" if args.jobs > 1 else ""
    print(f"# {args.schedules / elapsed:.1f} schedules/s, {steps / elapsed:.0f} steps/s "
          f"({args.schedules} schedules in {elapsed:.1f} s{jobs})", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
