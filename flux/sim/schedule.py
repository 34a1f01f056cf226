"""One simulated run: a seed picks the workload, the knobs, every step and every crash.

The same seed always gives the same run, so a violation is reproduced by
running its seed again (``python -m flux.sim --seed S --schedules 1 -v``).
"""
from __future__ import annotations

import os

import random
from bisect import bisect_right as bisect
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from typing import Any, List, Optional, Tuple

from controller.placement import ChainedDeclustering, ClusterPairs, OneSegmentPerNode
from flux.data_messages import Batch
from flux.protocol.host import Host
from flux.operator import wire_form
from flux.sim.oracle import PrefixOracle, Violation, final_checks, settled_parts
from flux.sim.ingresses import SKEWS, EpochPlan
from flux.sim.moves import expected_state, final_states
from flux.sim.variants import (DivergenceDraw, HOST_VARIANTS, INGRESS_VARIANTS, VARIANTS,
                               WORLD_VARIANTS)
from flux.sim.world import CHECKPOINT_STORE, INPUT_LOG, World, WorldConfig
from flux.state_codec import unpack_state
from controller.topology import node_name

#: relative speeds a process may get for one schedule
SPEEDS = (0.05, 0.2, 1.0, 1.0, 1.0, 4.0)
#: the same for the input log's writes: a slow store lags the pipeline by whole outputs
LOG_SPEEDS = (0.001, 0.01, 0.2, 1.0)
#: the same for the damage of a checkpoint file: rare next to the job's steps, so it falls
#: anywhere in a schedule, not just after the first file is written
STORE_SPEEDS = (0.002, 0.005, 0.02)

TRIGGERS = ("any", "during", "after")
#: tuples a consumer may hold untaken per connection, for one schedule (None: no credits)
WINDOWS = (1, 2, 3, 4, 5, 8, None)
BATCH_ROWS = (1, 1, 2, 3, 4, 8)
#: the chance, at each step of a catch-up, that a "during" crash strikes
DURING_RATE = 0.05
#: how long a cut or a starved process lasts, in ticks of the detector's clock: below the
#: timeout (8), up to the grace of a last replica (32), past the lease (48)
FAULT_TICKS = (1, 90)

#: the steps a chooser injects (faults, restarts) rather than picks among the enabled ones
INJECTED = frozenset(("crash", "cut", "starve", "restart", "rescale"))

OK = "ok"
VIOLATION = "violation"
PAIR_LOST = "pair-lost"
#: a restart found complete checkpoints, none of whose files all verified (the runtime's
#: CheckpointCorrupt): the job stops; what the sink holds must still be a prefix
CHECKPOINT_CORRUPT = "checkpoint-corrupt"
#: the pairs' digests found a divergence (a nondeterministic operator) and the job stopped
DIVERGED = "diverged"
#: a machine raised in a run with a nondeterministic operator: the protocol's rules assume
#: deterministic operators (DESIGN 4.1), so its machines may fail in any way once the
#: replicas differ; not a violation of the protocol
UNDEFINED = "nondeterminism-raised"

#: where the replicas live: Flux's chained declustering, one segment per node, or the
#: paper's cluster pairs (4.2: a whole replica set per half of the nodes, plain
#: exchanges inside a set, a lost set rebuilt from the other)
PLACEMENTS = {
    "chained": ChainedDeclustering,
    "single": OneSegmentPerNode,
    "cluster-pairs": lambda stages, partitions: ClusterPairs(stages, partitions, partitions),
}


@dataclass(frozen=True)
class SimParams:
    stages: int = 2
    partitions: int = 4
    crashes: int = 2
    inputs: int = 24
    dataflow: str = "counter"
    variant: str = "none"
    placement: str = "chained"
    standbys: int = 0
    #: crash these nodes (node numbers or host names, in order) instead of random safe victims
    victims: Tuple = ()
    #: when each planned crash may happen: "any" step, "during" a catch-up, or "after"
    #: every catch-up so far completed (sequences of failures separated by recoveries)
    triggers: Tuple[str, ...] = ()
    #: links of a random live host cut this many times (each heals after 1 to 90 ticks of
    #: the detector's clock; crashes are then silent half of the time, DESIGN 6)
    cuts: int = 0
    #: a random live process goes unheard this many times for 1 to 90 ticks while it runs
    false_suspicions: int = 0
    #: the chance that an envelope between StateMovers is lost
    lossy_mover: float = 0.0
    #: checkpoints the ingress takes, each at a moment the scheduler picks (DESIGN 10)
    checkpoints: int = 0
    #: whole-job restarts (the driver killed: everything stops at once) at random steps;
    #: with checkpoints, a lost pair also restarts the job (up to 3 times)
    restarts: int = 0
    #: a replica's snapshots are whole once in this many (0: drawn per seed, 1 to 4)
    full_every: int = 0
    #: the source's own partitions: with more than one, the ingress logs the SNs it gives
    #: and a restart reads the inputs the log does not cover in another interleaving
    source_partitions: int = 1
    #: files of the checkpoint store damaged per schedule, each at a moment the scheduler
    #: picks (a number of the state changed, or the file lost; its checksum unchanged)
    corrupt_checkpoints: int = 0
    #: complete checkpoints the store keeps (0: 2 with --corrupt-checkpoints, else all)
    keep_checkpoints: int = 0
    #: an egress and a sink per last-stage partition instead of one ordered egress
    partitioned_egress: bool = False
    #: each partition's egress a sink's writer on a node, moving when its node dies
    writers_on_nodes: bool = False
    #: ingresses reading a source partition each, numbering in epochs (DESIGN 12)
    ingresses: int = 1
    #: each ingress a pair of replicas on the nodes, dying with them
    ingress_pairs: bool = False
    #: each restart of the job runs at the next of these partition counts, its state split
    #: by key group from the restored checkpoint (DESIGN 13); () keeps ``partitions``
    rescale_to: Tuple[int, ...] = ()
    #: rescales asked for while the job runs (``job.rescale``), each at a random step: a
    #: checkpoint cut at once, and the job restarted from it at the next count
    rescale_cuts: int = 0
    #: live moves of a key-group range from one running partition to another, each
    #: carried by a checkpoint's cut (DESIGN 13)
    moves: int = 0
    #: live rescales: the job's keys start spread over the first of these counts of its
    #: ``partitions`` pairs (the others own no group yet), and each next count is reached
    #: by the moves of one checkpoint's cut (DESIGN 13)
    live_rescales: Tuple[int, ...] = ()
    #: with live rescales: the pairs past the first count are dormant (no process) until
    #: a live rescale needs them, then join on standbys (docs/design/rescaling.md)
    dormant: bool = False
    max_steps: int = 200_000

    @property
    def egress_per_partition(self) -> bool:
        return self.partitioned_egress or self.writers_on_nodes

    def validate(self) -> None:
        if self.stages < 1:
            raise ValueError(f"--stages must be >= 1, got {self.stages}")
        if self.partitions < 2:
            raise ValueError(f"--partitions must be >= 2, got {self.partitions}")
        if self.crashes < 0:
            raise ValueError(f"--crashes must be >= 0, got {self.crashes}")
        if self.standbys < 0:
            raise ValueError(f"--standbys must be >= 0, got {self.standbys}")
        if self.inputs < 1:
            raise ValueError(f"--inputs must be >= 1, got {self.inputs}")
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; one of {sorted(VARIANTS)}")
        if self.dataflow not in DATAFLOWS:
            raise ValueError(f"unknown dataflow {self.dataflow!r}; one of {', '.join(DATAFLOWS)}")
        if any(t not in TRIGGERS for t in self.triggers):
            raise ValueError(f"crash triggers must be among {TRIGGERS}, got {self.triggers}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; one of {', '.join(PLACEMENTS)}")
        if self.cuts < 0 or self.false_suspicions < 0:
            raise ValueError(f"--cuts and --false-suspicions must be >= 0, got {self.cuts} "
                             f"and {self.false_suspicions}")
        if self.checkpoints < 0 or self.restarts < 0:
            raise ValueError(f"--checkpoints and --restarts must be >= 0, got "
                             f"{self.checkpoints} and {self.restarts}")
        if self.corrupt_checkpoints < 0 or self.keep_checkpoints < 0:
            raise ValueError(f"--corrupt-checkpoints and --keep-checkpoints must be >= 0, got "
                             f"{self.corrupt_checkpoints} and {self.keep_checkpoints}")
        if self.source_partitions < 1:
            raise ValueError(f"--source-partitions must be >= 1, got {self.source_partitions}")
        if self.full_every < 0:
            raise ValueError(f"--full-every must be >= 0, got {self.full_every}")
        if self.ingresses < 1:
            raise ValueError(f"--ingresses must be >= 1, got {self.ingresses}")
        if self.ingresses > 1 and self.source_partitions > 1:
            raise ValueError("--ingresses and --source-partitions: each ingress reads one "
                             "source partition (--ingresses K models K of them)")
        if self.ingress_pairs and (self.ingresses < 2 or self.placement == "cluster-pairs"):
            raise ValueError("--ingress-pairs: pairs of several ingresses (--ingresses K, K >= "
                             "2), under chained or single placement")
        if not 0.0 <= self.lossy_mover < 1.0:
            raise ValueError(f"--lossy-mover is a probability below 1, got {self.lossy_mover}")
        if self.moves < 0:
            raise ValueError(f"--moves must be >= 0, got {self.moves}")
        if self.live_rescales and (len(self.live_rescales) < 2 or not all(
                1 <= n <= self.partitions for n in self.live_rescales)):
            raise ValueError(f"--live-rescales are two counts or more, each at most "
                             f"--partitions ({self.partitions}) pairs, got {self.live_rescales}")
        keyed_by_stage = self.dataflow == "regroup" or (self.dataflow == "packets"
                                                         and self.stages <= 2)
        if (self.moves or self.live_rescales) and (
                not self.checkpoints or not keyed_by_stage or
                self.rescale_to and self.live_rescales):
            raise ValueError("--moves and --live-rescales are carried by checkpoints' cuts "
                             "(--checkpoints N) with state keyed by its stages' keys "
                             "(--dataflow regroup, or packets of at most 2 stages: the "
                             "third counts per app); --moves may come with rescales from "
                             "a checkpoint (--rescale-to), live rescales not (they spread "
                             "the groups over a fixed number of pairs)")
        if self.dormant and (len(self.live_rescales) < 2 or min(self.live_rescales) < 2 or
                             self.dataflow != "regroup" or self.moves or
                             self.placement != "chained" or self.ingresses > 1 or
                             self.writers_on_nodes or self.standbys < 2):
            raise ValueError("--dormant starts and stops pairs at live rescales "
                             "(--live-rescales, each count at least 2) of the regrouping dataflow, without "
                             "--moves, with one ingress, one ordered egress or one per "
                             "partition in the egress process (not writers on the nodes), "
                             "chained placement and 2 standbys at least (what is modelled "
                             "so far)")
        if self.rescale_cuts and not self.rescale_to:
            raise ValueError("--rescale-cuts needs the counts to rescale to (--rescale-to)")
        if self.rescale_to:
            if any(n < 2 for n in self.rescale_to):
                raise ValueError(f"--rescale-to counts must be >= 2, got {self.rescale_to}")
            if not self.checkpoints or self.dataflow != "regroup":
                raise ValueError("--rescale-to restarts from checkpoints (--checkpoints N) "
                                 "with --dataflow regroup (state keyed by its stages' keys)")
            if self.egress_per_partition and not self.rescale_cuts:
                raise ValueError("--rescale-to with an egress per partition: drained rescales "
                                 "(--rescale-cuts K); each sink partition "
                                 "committed up to its own SN, so a restart at another count "
                                 "from any other cut would repeat or lose outputs")


@dataclass
class ScheduleResult:
    seed: int
    status: str
    reason: str = ""
    steps: int = 0
    crashed: List[str] = field(default_factory=list)
    trace: List[Tuple[tuple, Any]] = field(default_factory=list)
    delivered: int = 0
    expected: int = 0
    takeovers: List = field(default_factory=list)
    catchups: List = field(default_factory=list)
    #: two-phase catch-up: bulk parts and keyed deltas installed, "part" steps taken
    bulk_parts: int = 0
    deltas: int = 0
    part_steps: int = 0
    #: processes declared dead while they ran, mover envelopes lost, deadlines hit
    zombies: List[str] = field(default_factory=list)
    mover_lost: int = 0
    deadlines: int = 0
    #: checkpoints chosen (number, cut), snapshots taken, checkpoints complete
    cuts: List[Tuple[int, int]] = field(default_factory=list)
    snapshots: int = 0
    snapshot_deltas: int = 0
    complete: List[int] = field(default_factory=list)
    #: whole-job restarts, each with the checkpoint it started from (None: the beginning),
    #: and how many rebuilt a lost replica set (cluster pairs)
    restarts: List[Optional[int]] = field(default_factory=list)
    sets_rebuilt: int = 0
    rescales: int = 0
    #: drained rescales (a sink per partition): (cut, count) each; those given up
    drains: List[Tuple[int, int]] = field(default_factory=list)
    rescales_given_up: int = 0
    #: live moves of key-group ranges asked, and those whose range both replicas of the
    #: destination installed
    moves: int = 0
    moves_done: int = 0
    moves_restored: int = 0
    moves_rescaled: int = 0  # segments restored at another count from moved groups
    moves_by_changes: int = 0
    moves_last: int = 0
    moves_stuck: int = 0
    live_rescales: int = 0
    joins: int = 0
    onto_joined: int = 0
    leaves: int = 0
    rejoins: int = 0
    #: checkpoint files damaged ((file, how)), complete checkpoints restarts skipped as
    #: unverified, snapshots not written (a delta whose chain lost a file)
    damaged: List = field(default_factory=list)
    #: sinks' writers started again beside a survivor (their node died)
    writer_moves: int = 0
    #: splits whose durable epoch log numbered inputs past a restart's cut
    log_replays: int = 0
    fallbacks: List[int] = field(default_factory=list)
    failed_writes: int = 0
    #: pairs of replicas' digests compared at the cuts (DESIGN 14); divergences whose
    #: replicas were asked for the keys that differ, and how many named one
    digests_compared: int = 0
    keys_probed: int = 0
    keys_named: int = 0


#: the dataflows a schedule can run
DATAFLOWS = ("counter", "regroup", "packets", "packets-ttl")


def build_dataflow(params: SimParams, seed: int):
    from flux.testing import dataflows, workloads

    if params.dataflow in ("counter", "regroup"):
        make = dataflows.counting_dataflow if params.dataflow == "counter" \
            else dataflows.regrouping_dataflow
        return make(params.stages), workloads.keyed_workload(params.inputs, seed, keys=6)
    # packets-ttl: sessions and idle keys expire within a schedule (ts grows ~3 a packet),
    # so expiries fall before, during and after catch-ups (flux/expiry.py)
    ttl = {"session_ttl": 24, "idle_ttl": 45} if params.dataflow == "packets-ttl" else {}
    return (dataflows.packet_dataflow(params.stages, **ttl),
            # concurrent=3: about half the packets end a session, so the stats stage
            # has input (with the workload's default of 1000 open sessions, 6 pairs
            # never end one within a schedule and the packet dataflow had no output)
            workloads.packet_workload(params.inputs, seed, pairs=6, apps=2, sources=3,
                                     concurrent=3))


def make_world(params: SimParams, seed: int, rng: random.Random):
    dataflow, inputs = build_dataflow(params, seed)
    plan = numbers = None
    if params.ingresses > 1:  # which ingress reads each input, in which epoch: its SN
        plan = EpochPlan(inputs, params.ingresses, random.Random(f"ingresses {seed}"))
        inputs, numbers = plan.inputs, plan.numbers
    reference, outputs_upto, states_after, states, parts_at = reference_run(dataflow, inputs,
                                                                            params, numbers)
    parts = list(parts_at[params.partitions])
    placement = PLACEMENTS[params.placement](
        params.stages, params.live_rescales[0] if params.dormant else params.partitions)
    config = WorldConfig(
        capacity=rng.randint(1, 6),
        ingress_capacity=rng.randint(1, 6),
        batch_size=rng.randint(1, 4),
        buffer_factory=VARIANTS[params.variant][0],
        segment_class=VARIANTS[params.variant][1],
        standbys=params.standbys,
        chunk_size=rng.choice((16, 64, 1 << 20)),
        # two-phase catch-up: bulk parts of 1 to 3 keyed pairs (or one part), handed out
        # one per "part" step while the active processes, or all at once at sm_ready
        bulk_pairs=rng.choice((1, 2, 3, 1 << 13)),
        bulk_per_step=rng.random() < 0.75,
        # back-pressure: small windows, so credits decide when data moves; drawn from a
        # stream of their own, so a seed's other draws are what they were before credits
        window=random.Random(f"window {seed}").choice(WINDOWS),
        # items (DESIGN 11): at most this many inputs each, cut at random below it; 1 is
        # the per-record protocol's traffic (many sub-items, full windows), larger ones
        # group inputs; a stream of its own
        batch_rows=random.Random(f"items {seed}").choice(BATCH_ROWS),
        mover_loss=params.lossy_mover,
        checkpoints=params.checkpoints,
        restarts_on_pair_lost=3 if params.checkpoints else 0,
        # incremental snapshots: drawn from a stream of their own, so a seed's other draws
        # are what they were before them
        full_every=params.full_every or random.Random(f"full {seed}").randint(1, 4),
        host_class=HOST_VARIANTS.get(params.variant, Host),
        ingress_class=INGRESS_VARIANTS.get(params.variant),
        sink_commits=bool(params.checkpoints or params.restarts),
        source_parts=[parts.randrange(params.source_partitions) for parts in
                      [random.Random(f"source {seed}")] for _ in inputs]
        if params.source_partitions > 1 else None,
        keep=params.keep_checkpoints or (2 if params.corrupt_checkpoints else None),
        corrupt_checkpoints=params.corrupt_checkpoints,
        # a fallback abandons complete checkpoints past the restored one: the next cuts
        # may lie before theirs (without damage, as before: after every earlier cut)
        cuts_follow_restore=bool(params.corrupt_checkpoints),
        ordered_output=not params.egress_per_partition,
        writers_on_nodes=params.writers_on_nodes,
        # a writer commits at least every this many items (at most the capacity): drawn
        # from a stream of its own
        commit_every=random.Random(f"commits {seed}").randint(1, 6),
        epochs=plan,
        ingress_pairs=params.ingress_pairs,
        rescale_to=params.rescale_to,
        moves=params.moves,
        live_rescales=params.live_rescales,
        dormant=params.dormant,
        placement_for=partial(PLACEMENTS[params.placement], params.stages),
        log_epochs=bool(params.checkpoints or params.restarts),
        epoch_skew=random.Random(f"skew {seed}").choice(SKEWS),
        **WORLD_VARIANTS.get(params.variant, {}),
        **nondeterminism(params, seed),
    )
    # a keyed digest's whole pass at every 1st to 4th checkpoint, else kept from the
    # changed keys (DESIGN 14): drawn from a stream of its own
    whole = random.Random(f"whole {seed}")
    config.segment_settings.setdefault("digest_whole_every", whole.randint(1, 4))
    # and a store rewritten between cuts records no changes for 0 to 3 cuts
    config.segment_settings.setdefault("digest_hot_skip", whole.randint(0, 3))
    world = World(dataflow, inputs, params.partitions, placement, config, rng,
                  fault_rng=random.Random(f"faults {seed}"),
                  corrupt_rng=random.Random(f"corrupt {seed}"),
                  moves_rng=random.Random(f"moves {seed}"))
    if params.checkpoints and config.deterministic:
        world.judge_snapshot = partial(judge_snapshot, states_after, world.position,
                                       lambda: world.partitions)
        if params.moves or params.live_rescales:  # as the moves left them at the cut
            world.judge_snapshot = partial(judge_moved_snapshot, states_after,
                                           world.moves, world.position)
        world.judge_commit = partial(judge_commit, outputs_upto, world.position)

    def reorder(new_inputs, new_numbers=None):
        """The failure-free run of the inputs' new order (its lists changed in place)."""
        for old, new in zip((reference, outputs_upto, states_after, states, parts_at),
                            reference_run(dataflow, new_inputs, params, new_numbers)):
            if isinstance(old, dict):
                old.clear()
                old.update(new)
            else:
                old[:] = new
        redraw()

    def redraw():
        """Each output's sink partition and the outputs each holds after n inputs, with
        the drained rescales so far (``drained_parts``) or the last stage's live moves
        (``moved_parts``)."""
        numbers = world.epochs.plan.numbers if world.epochs is not None else \
            range(1, len(world.inputs) + 1)
        if "groups" in parts_at:  # live moves of the last stage, and drained rescales
            width = max((params.partitions, *params.rescale_to))
            parts[:], outputs_upto[:] = moved_parts(reference, parts_at["groups"],
                                                    world.moves.sinks.last_stage_maps(), numbers,
                                                    width)
            settled_parts(world, parts)
        elif params.egress_per_partition and world.outcome.drains:
            parts[:], outputs_upto[:] = drained_parts(reference, parts_at, params.partitions,
                                                      world.outcome.drains, numbers)
        else:  # ``outputs_upto`` as the reference run gave it
            parts[:] = parts_at[params.partitions]

    def judge_drain(cut):
        due = outputs_upto[world.position(cut)]
        for p, want in enumerate(due):
            held = world.sink.committed.get(p, 0)
            if held != want:
                raise Violation(f"a drained rescale from cut {cut}: sink partition {p} "
                                f"committed {held} outputs, the inputs up to the cut make "
                                f"{want} of it")

    world.on_reorder = reorder
    world.on_parts_changed = redraw
    if params.egress_per_partition and params.rescale_to and config.deterministic:
        world.judge_drain = judge_drain
    redraw()
    return world, reference, states, parts if params.egress_per_partition else None


def moved_parts(reference, groups, maps, numbers, partitions: int) -> tuple:
    """Each output's sink partition with a sink per partition and live moves of the last
    stage: the owner of its last-stage key group (``groups``) in the map in force for its
    input (``maps``: ``(cut, owners)`` in cut order, the first at cut 0), and ``[n]``: how
    many outputs each sink partition holds after the first n inputs."""
    held = [0] * partitions
    parts, upto = [], [tuple(held)]
    i, m = 0, 0
    for number in numbers:
        while m + 1 < len(maps) and number > maps[m + 1][0]:
            m += 1
        owners = maps[m][1]
        while i < len(reference) and reference[i][0][0] == number:
            p = owners[groups[i]]
            parts.append(p)
            held[p] += 1
            i += 1
        upto.append(tuple(held))
    return parts, upto


def drained_parts(reference, parts_at, first: int, drains, numbers) -> tuple:
    """Each output's sink partition with a sink per partition: its partition at the count
    in force for its input (``first``, then each drained rescale's count for the inputs
    after its cut), and ``[n]``: how many outputs each sink partition holds after the first
    n inputs. ``numbers``: the inputs' SNs, in order (one ingress: 1, 2, ...); an output's
    SN starts with its input's, and a cut is an SN."""
    width = max([first, *(count for _, count in drains)])
    held = [0] * width
    parts, upto = [], [tuple(held)]
    i = 0
    for number in numbers:
        count = first
        for cut, later in drains:
            if number > cut:
                count = later
        while i < len(reference) and reference[i][0][0] == number:
            p = parts_at[count][i]
            parts.append(p)
            held[p] += 1
            i += 1
        upto.append(tuple(held))
    return parts, upto


def nondeterminism(params: SimParams, seed: int) -> dict:
    """The ``nondeterministic`` variant's settings: where its operator strikes, drawn from
    a stream of its own (DESIGN 14)."""
    if not params.variant.startswith("nondeterministic"):
        return {}
    draw = random.Random(f"diverge {seed}")
    return {"deterministic": False, "segment_settings": {"diverge": DivergenceDraw(
        draw.randint(1, params.stages), draw.randrange(params.partitions),
        draw.randrange(max(1, params.inputs // params.partitions)))}}


def reference_run(dataflow, inputs, params: SimParams, numbers=None):
    """The failure-free run of ``inputs``: its outputs, how many the first n inputs make
    (with an egress per partition: per partition, ``[n][p]``), the operators' states after
    n inputs (with checkpoints) and at the end, each per partition count the run may have
    (``{count: states}``: ``partitions`` and those of ``rescale_to``), and each output's
    last-stage partition at each of those counts (``{count: [partition, ...]}``).
    ``numbers``: the inputs' SNs (several ingresses); None: 1, 2, 3..."""
    run, reference, outputs_upto, states_after = _reference(dataflow, inputs, params,
                                                            params.partitions, numbers)
    after = {params.partitions: states_after}
    states = {params.partitions: [[c.get_state() for c in stage] for stage in run.chains]}
    parts_at = {params.partitions: list(run.output_partitions)}
    if run.output_groups is not None:  # where a live move of the last stage sends each
        parts_at["groups"] = list(run.output_groups)
    for n in params.rescale_to:
        if n in after:
            continue
        other, outputs, _, after[n] = _reference(dataflow, inputs, params, n, numbers)
        if outputs != reference:
            raise ValueError(f"the dataflow's output at {n} partitions is not its output at "
                             f"{params.partitions}: a rescale cannot keep it")
        states[n] = [[c.get_state() for c in stage] for stage in other.chains]
        parts_at[n] = list(other.output_partitions)
    return reference, outputs_upto, after, states, parts_at


def _reference(dataflow, inputs, params: SimParams, partitions: int, numbers):
    from flux.reference import ReferenceRun

    moving_sinks = params.egress_per_partition and bool(params.moves or params.live_rescales)
    run = ReferenceRun(dataflow, partitions, groups=moving_sinks)
    reference: list = []
    outputs_upto = [0]  # [n]: how many reference outputs the first n inputs make

    def operator_states():
        return [[wire_form(c.get_state()) for c in stage] for stage in run.chains]

    states_after = [operator_states()] if params.checkpoints else []  # [n]: after n inputs
    per_part = [0] * partitions
    if params.egress_per_partition:
        outputs_upto = [tuple(per_part)]
    for k, record in enumerate(inputs):
        made = run.feed(record, None if numbers is None else numbers[k])
        reference += made
        if params.egress_per_partition:
            for p in run.output_partitions[len(reference) - len(made):]:
                per_part[p] += 1
            outputs_upto.append(tuple(per_part))
        else:
            outputs_upto.append(len(reference))
        if params.checkpoints:
            states_after.append(operator_states())
    return run, reference, outputs_upto, states_after


def judge_snapshot(states_after, position, partitions, snap) -> None:
    """A checkpoint's snapshot is the failure-free state of its partition after exactly
    the inputs up to its cut (DESIGN 10), at the job's partition count (``partitions()``).
    ``position``: how many inputs an SN covers."""
    got = wire_form(unpack_state(snap.data)["operators"])
    want = states_after[partitions()][position(snap.cut)][snap.addr.stage - 1][
        snap.addr.partition]
    if got != want:
        raise Violation(f"checkpoint {snap.number} (cut {snap.cut}): {snap.addr}'s snapshot "
                        f"{got!r} is not the state after input {snap.cut}: {want!r}")


def judge_moved_snapshot(states_after, moves, position, snap) -> None:
    """``judge_snapshot`` where live moves changed which groups a partition holds."""
    got = wire_form(unpack_state(snap.data)["operators"])
    want = expected_state(states_after, moves, position, snap)
    if got != want:
        raise Violation(f"checkpoint {snap.number} (cut {snap.cut}): {snap.addr}'s snapshot "
                        f"{got!r} is not the state of its key groups after input "
                        f"{snap.cut}: {want!r}")


def judge_commit(outputs_upto, position, commit, delivered: int) -> None:
    """When the egress passes a cut, every output of the inputs up to it is delivered (of
    its partition, with an egress per partition)."""
    due = outputs_upto[position(commit.cut)]
    if isinstance(due, tuple):
        due = due[commit.partition]
    if delivered < due:
        raise Violation(f"checkpoint {commit.number}: the sink commits at cut {commit.cut} "
                        f"with {delivered} outputs, {due} are due")


def run_schedule(seed: int, params: SimParams, crash_window: int) -> ScheduleResult:
    """Run one schedule; crashes fall at uniformly chosen steps below ``crash_window``."""
    return execute(seed, params, RandomChooser(seed, params, crash_window))


class Speeds(dict):
    """Each process's speed; one that comes later (a rescale's new nodes) draws its own
    from a stream of its own, so a seed's other draws are what they were."""

    def __init__(self, later: random.Random):
        super().__init__()
        self.later = later

    def __missing__(self, host: str) -> int:
        speed = self[host] = self.later.choice(SPEEDS)
        return speed


class RandomChooser:
    """Picks each step at random, weighted by per-process speed; crashes at planned steps."""

    def __init__(self, seed: int, params: SimParams, crash_window: int):
        self.seed = seed
        self.params = params
        self.crash_window = crash_window
        self.victims = [node_name(v) if isinstance(v, int) else v for v in params.victims]
        self.crash_at: Optional[List[int]] = None
        self.speed = None
        # Timed faults are planned from a stream of their own: a seed without them runs
        # exactly as it did before they existed.
        self.plan = random.Random(f"fault plan {seed}")
        self.log_speed = random.Random(f"input log {seed}")
        self.faults = sorted(
            (self.plan.randrange(max(1, crash_window)), kind, self.plan.randint(*FAULT_TICKS))
            for kind, n in (("cut", params.cuts), ("starve", params.false_suspicions),
                            ("restart", params.restarts), ("rescale", params.rescale_cuts))
            for _ in range(n))

    def __call__(self, world: World, rng: random.Random, t: int):
        if self.crash_at is None:  # drawn after the world, from the same stream
            self.crash_at = sorted(rng.randrange(max(1, self.crash_window))
                                   for _ in range(self.params.crashes))
            # Unequal speeds make replicas drift apart, the case the buffers exist for.
            self.speed = Speeds(random.Random(f"speeds {self.seed}"))
            self.speed.update((h, rng.choice(SPEEDS)) for h in list(world.hosts) +
                              ["controller"])
            # the input log's writes have a speed of their own (a slow store lags), drawn
            # from a stream of its own so a seed's other draws stay what they were
            self.speed[INPUT_LOG] = self.log_speed.choice(LOG_SPEEDS)
            if self.params.corrupt_checkpoints:
                self.speed[CHECKPOINT_STORE] = random.Random(
                    f"store {self.seed}").choice(STORE_SPEEDS)
            self.triggers = list(self.params.triggers)
            if not self.triggers and self.params.standbys:
                # Later crashes strike at any step, inside a catch-up, or once every
                # catch-up so far completed: sequences of failures separated by
                # recoveries.
                self.triggers = ["any"] + [rng.choice(TRIGGERS)
                                           for _ in range(self.params.crashes - 1)]
        options = None
        while self.crash_at:
            # A planned crash waits for its time and its trigger while the world can
            # still move, but happens even if the world went quiet first.
            trigger = self.triggers[0] if self.triggers else "any"
            rec = world.recovery
            if trigger == "during":  # anywhere inside a catch-up, whatever the time
                due = bool(rec.attempts) and rng.random() < DURING_RATE
            elif trigger == "after":
                due = (self.crash_at[0] <= t and not rec.pending()
                       and not world.detection.crashed_undetected)
            else:
                due = self.crash_at[0] <= t
            if not due and (options := world.choosable())[0]:
                break
            if self.triggers:
                self.triggers.pop(0)
            self.crash_at.pop(0)
            choices = [self.victims.pop(0)] if self.victims else world.safe_victims()
            if self.params.checkpoints and self.plan.random() < 0.5:
                # with checkpoints a lost pair restarts the job: double failures too
                choices = [n for n in world.faultable() if n not in choices] or choices
            if choices:
                victim = rng.choice(choices)
                if self.params.cuts and self.plan.random() < 0.5:
                    return ("crash", victim, "silent"), None  # a machine dies: no FIN
                return ("crash", victim), None
        while self.faults and self.faults[0][0] <= t:
            _, kind, ticks = self.faults.pop(0)
            if kind == "restart":
                return ("restart",), None  # the driver dies: the whole job restarts
            if kind == "rescale":
                return ("rescale",), None  # job.rescale: a cut now, a restart from it
            choices = world.faultable()
            if choices:
                return (kind, self.plan.choice(choices), ticks), None
        steps, hosts = options if options is not None else world.choosable()
        if not steps:
            return None
        # rng.choices(steps, weights)[0], without its checks: the same draw, the same pick
        speed = self.speed
        cumulative = list(accumulate(map(speed.__getitem__, hosts)))
        return steps[bisect(cumulative, rng.random() * cumulative[-1], 0, len(steps) - 1)], "pick"


def execute(seed: int, params: SimParams, choose) -> ScheduleResult:
    """Build the world for ``seed`` and apply the steps ``choose`` gives until it gives None."""
    rng = random.Random(seed)
    world, reference, states, parts = make_world(params, seed, rng)
    oracle = PrefixOracle(reference, parts)
    reorder = world.on_reorder

    def on_reorder(new_inputs, new_numbers=None):
        reorder(new_inputs, new_numbers)
        # what the sink holds is judged again, against the new order
        oracle.set_reference(reference, parts)

    redraw = world.on_parts_changed

    def on_parts_changed():  # a drained rescale, a live move of the last stage
        redraw()  # the outputs past the cut go to the new count's partitions
        oracle.set_reference(reference, parts)

    world.on_reorder = on_reorder
    world.on_parts_changed = on_parts_changed
    result = ScheduleResult(seed, OK, expected=len(reference))
    # a nondeterministic operator has no one failure-free run to compare with: what is
    # judged is the digests' comparison (flux.sim.divergence) and the machines' own rules
    judged = world.config.deterministic
    trace = result.trace
    outcome = world.outcome
    t = 0
    try:
        while True:
            chosen = choose(world, rng, t)
            if chosen is None:
                break
            step, how = chosen
            kind = step[0]
            if kind in INJECTED:
                if kind == "crash":
                    kept = world.crash(step[1], how if isinstance(how, dict) else None,
                                       silent="silent" in step)
                    result.crashed.append(step[1])
                    trace.append((step, kept))
                    continue
                if kind in ("cut", "starve"):
                    (world.cut_host if kind == "cut" else world.starve)(step[1], step[2])
                    trace.append((step, None))
                    continue
                if kind == "rescale":
                    world.restarts.rescale_asked()
                    trace.append((step, None))
                    continue
                world.restart()
                oracle.rewind(world.sink)
                trace.append((step, None))
                if outcome.checkpoint_corrupt:
                    result.status, result.reason = CHECKPOINT_CORRUPT, outcome.checkpoint_corrupt
                    break
                continue
            trace.append((step, _payload(world, step)))
            restarts, drops = len(outcome.restarts), world.sink.drops
            world.apply(step)
            if kind == "corrupt":
                trace[-1] = (step, outcome.damaged[-1])
            if outcome.checkpoint_corrupt or len(outcome.restarts) > restarts or \
                    world.sink.drops > drops:
                # the sink dropped what it had not committed (a restart, a new writer)
                oracle.rewind(world.sink)
            if judged and len(outcome.delivered) != oracle.checked:
                oracle.check(world.sink)
            if outcome.pair_lost:
                result.status = PAIR_LOST
                result.reason = "both replicas lost: " + ", ".join(
                    f"stage {a.stage} partition {a.partition}" for a in outcome.pair_lost)
                break
            if outcome.checkpoint_corrupt:
                result.status, result.reason = CHECKPOINT_CORRUPT, outcome.checkpoint_corrupt
                break
            if outcome.diverged:
                result.status, result.reason = DIVERGED, outcome.diverged
                break
            t += 1
            if t >= params.max_steps:
                raise Violation(f"no quiescence after {t} steps (livelock)")
        if result.status == OK:
            result.expected = len(reference)  # a restart may have changed the inputs' order
            final = states[world.partitions]
            if params.moves or params.live_rescales:  # the groups the moves left it
                final = final_states(final, world.moves)
            problem = final_checks(world, len(reference), final) if judged else None
            if problem:
                result.status, result.reason = VIOLATION, problem
    except Violation as exc:
        result.status, result.reason = VIOLATION, str(exc)
    except Exception as exc:  # a machine raised: a protocol error is a violation too
        if os.environ.get("FLUX_SIM_RAISE"):  # to read where: the traceback, not a verdict
            raise
        result.status = VIOLATION if judged else UNDEFINED
        result.reason = f"{type(exc).__name__}: {exc}"
    result.steps = t
    result.delivered = len(world.outcome.delivered)
    result.takeovers = list(world.outcome.takeovers)
    result.catchups = list(world.outcome.catchups)
    result.bulk_parts = world.outcome.bulk_parts
    result.deltas = world.outcome.deltas
    result.part_steps = world.outcome.part_steps
    result.zombies = list(world.outcome.zombies)
    result.mover_lost = world.outcome.mover_lost
    result.deadlines = world.outcome.deadlines
    result.cuts = list(world.outcome.cuts)
    result.snapshots = world.outcome.snapshots
    result.snapshot_deltas = world.outcome.snapshot_deltas
    result.complete = list(world.outcome.complete)
    result.restarts = list(world.outcome.restarts)
    result.sets_rebuilt = world.outcome.sets_rebuilt
    result.rescales = world.outcome.rescales
    result.drains = list(world.outcome.drains)
    result.rescales_given_up = world.outcome.rescales_given_up
    result.moves = params.moves - world.moves.left
    result.live_rescales = world.moves.rescaled
    result.joins = world.moves.pairs.joins
    result.onto_joined = world.moves.pairs.onto_joined
    result.leaves = world.moves.pairs.leaves
    result.rejoins = world.moves.pairs.rejoins
    result.moves_done = len(world.moves.done)
    result.moves_restored = world.moves.restores_split
    result.moves_rescaled = world.moves.restores_rescaled
    result.moves_by_changes = world.moves.by_changes
    result.moves_last = world.moves.sinks.moved
    result.moves_stuck = world.moves.sinks.stuck_restarts
    result.damaged = list(world.outcome.damaged)
    result.writer_moves = world.outcome.writer_moves
    result.log_replays = world.outcome.log_replays
    result.fallbacks = list(world.outcome.fallbacks)
    result.failed_writes = world.outcome.failed_writes
    result.digests_compared = world.divergence.compared
    result.keys_probed, result.keys_named = world.divergence.probed, world.divergence.named
    return result


def first_violation(params: SimParams, seeds, crash_window: int) -> Optional[ScheduleResult]:
    """The first schedule among ``seeds`` that violates, replayed once to prove it
    reproduces; None if every schedule passes."""
    for seed in seeds:
        result = run_schedule(seed, params, crash_window)
        if result.status == VIOLATION:
            again = run_schedule(seed, params, crash_window)
            if (again.status, again.reason) != (result.status, result.reason):
                raise AssertionError(f"seed {seed} does not reproduce: {again.reason!r}")
            return result
    return None


def _payload(world: World, step: tuple) -> Optional[Any]:
    if step[0] == "deliver":
        return world.net.head(step[1])
    if step[0] == "view":
        return world.net.views[step[1]][0]
    return None


def format_step(step: tuple, payload: Any) -> str:
    kind = step[0]
    if kind == "deliver":
        env = payload
        msg = env.msg
        if isinstance(msg, Batch):
            sns = ",".join(_sn(sn) for sn, _ in msg.items)
            body = f"Batch[{sns}] bound={_sn(msg.bound)}"
        elif hasattr(msg, "hwm"):
            body = f"{type(msg).__name__}({_sn(msg.hwm)})"
        elif hasattr(msg, "sn"):
            body = f"{type(msg).__name__}({_sn(msg.sn)})"
        elif hasattr(msg, "version"):
            body = f"{type(msg).__name__}(v{msg.version})"
        elif hasattr(msg, "transfer"):
            body = f"{type(msg).__name__}{msg.transfer}"
        else:
            body = type(msg).__name__
        return f"{env.src}->{env.dst} {body}"
    if kind == "view":
        what = []
        if payload.failed:
            what.append(f"fail({','.join(sorted(map(str, payload.failed)))})")
        for a in payload.avail:
            what.append(f"avail({a.addr}@{a.node} v{a.version})")
        return f"view{payload.number}@{step[1]} {' '.join(what)}"
    if kind == "flush" and step[2] < 0:  # an ingress replica's log to its twin
        return f"flush {step[1]}->twin"
    if kind == "flush":
        return f"flush {step[1]}->[{step[2]}]{'PS'[step[3]]}"
    if kind == "process":
        return f"process {step[1]}"
    if kind == "part":
        return f"part {step[1]}"
    if kind == "credit":
        return f"credit {step[1]}"
    if kind == "crash":
        return f"CRASH {step[1]}" + (" (silent)" if "silent" in step else "")
    if kind == "cut":
        return f"CUT {step[1]} for {step[2]} ticks"
    if kind == "starve":
        return f"UNHEARD {step[1]} for {step[2]} ticks"
    if kind == "told":
        return f"told {step[1]} to stop"
    if kind == "checkpoint":
        return "CHECKPOINT (ingress cut)"
    if kind == "restart":
        return "RESTART (everything stops at once)"
    if kind == "rescale":
        return "RESCALE asked (a checkpoint cut now, then a restart from it)"
    if kind == "drain-stuck":
        return "DRAIN STUCK (no checkpoint at the drained cut completes: cut again, or give up)"
    if kind == "move-stuck":
        return "MOVE STUCK (a last-stage move's checkpoint will not complete: restart)"
    if kind == "corrupt":
        if payload is None:
            return "CORRUPT (a checkpoint file damaged)"
        (k, stage, partition, replica, _), how = payload
        return f"CORRUPT checkpoint {k}'s file of {stage}.{partition}{'PS'[replica]}: {how}"
    if kind == "snapshot":
        return f"snapshot {step[1]}"
    if kind == "detect":
        return f"detect {step[1]}"
    return " ".join(map(str, step))


def _sn(sn) -> str:
    return ".".join(map(str, sn)) if sn else "-"


def format_trace(result: ScheduleResult, last: Optional[int] = None, interesting_only=False) -> str:
    items = result.trace if last is None else result.trace[-last:]
    lines = []
    for step, payload in items:
        if interesting_only and step[0] in ("accept",):
            continue
        lines.append(format_step(step, payload))
    return "\n".join(lines)
