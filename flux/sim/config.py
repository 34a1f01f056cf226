"""The simulated world's settings, what a run records, and the names its steps use."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from controller.failure_detector import Timings
from flux.addresses import Addr
from flux.protocol.buffer import Buffer
from flux.protocol.host import Host
from flux.protocol.segment import Segment
from controller.topology import EGRESS_PROCESS, INGRESS_PROCESS

INGRESS_HOST = INGRESS_PROCESS
EGRESS_HOST = EGRESS_PROCESS
#: a process step takes one input (``process``) or up to this many (``process_ready``,
#: as the runtime's loop steps a segment)
PROCESS_LIMITS = (1, 2, 3, 8, 64)

#: the detector's timings in ticks, in the runtime's proportions (0.5 s silence, 2 s for a
#: last replica, a 3 s lease: README, failure timings)
SIM_TIMINGS = Timings(timeout=8, last_replica_timeout=32, stuck_after=16, stuck_timeout=480)
SIM_LEASE = 48
#: ticks a catch-up attempt may take before the controller aborts and retries it
SIM_CATCHUP_DEADLINE = 64

#: who takes the "log" steps: the durable input log's writes (DESIGN 10)
INPUT_LOG = "input-log"
#: who takes the "corrupt" steps: the checkpoint store, where files get damaged
CHECKPOINT_STORE = "checkpoint-store"
#: who takes the failure detector's steps ("detect", "tick")
CONTROLLER = "controller"

#: a file of the checkpoint store: (checkpoint, stage, partition, replica), as the
#: runtime names them (one per replica in each checkpoint's folder)
FileId = Tuple[int, int, int, int, int]  # checkpoint, stage, partition, replica, writer's inc
#: the files that rebuild a partition's state, each with the checksum its writer recorded
Chain = Tuple[Tuple[FileId, str], ...]


class ZombieMachine(NamedTuple):
    """The key of a zombie's machine: its address may already name a new replica
    elsewhere, and both run until the zombie stops."""

    name: str
    addr: Addr

    def __hash__(self) -> int:
        # a str's hash differs from process to process: the world's sets of machines would
        # be walked in another order, and a seed would not replay in another process
        return hash((zlib.crc32(self.name.encode()), self.addr))


@dataclass
class WorldConfig:
    #: each restart runs at the next of these partition counts (DESIGN 13), placed by
    #: ``placement_for(count)``
    rescale_to: Tuple[int, ...] = ()
    placement_for: Optional[Callable[[int], Any]] = None
    #: False: a broken variant installs old partition p's state whole in new partition p
    split_rescaled: bool = True
    #: False: broken variants of a drained rescale (a sink per partition): the source
    #: keeps giving inputs past the rescale's cut; the cut falls under what a sink committed
    drain_stops_inputs: bool = True
    drain_past_sinks: bool = True
    capacity: int = 4
    ingress_capacity: int = 4
    batch_size: int = 2
    #: the most inputs in one item; the scheduler cuts items of any size up to it
    batch_rows: int = 4
    buffer_factory: Callable[[int], Buffer] = Buffer
    segment_class: type = Segment
    standbys: int = 0
    chunk_size: int = 64
    #: two-phase catch-up: keyed pairs per bulk part, and whether the active hands
    #: out one part per local "part" step (else all of them at sm_ready)
    bulk_pairs: int = 2
    bulk_per_step: bool = True
    #: back-pressure: tuples a consumer may hold untaken per connection (None: no credits)
    window: Optional[int] = None
    #: the chance that an envelope between two StateMovers is lost (a lossy mover link)
    mover_loss: float = 0.0
    host_class: type = Host
    #: checkpoints the ingress takes at moments of the scheduler's choosing (DESIGN 10)
    checkpoints: int = 0
    #: a lost pair restarts the whole job from its last complete checkpoint, this many
    #: times at most (0: the run ends as pair-lost)
    restarts_on_pair_lost: int = 0
    #: False: an operator of the run is not deterministic (a variant), and the digests
    #: compared at the cuts are expected to find it (DESIGN 14)
    deterministic: bool = True
    #: attributes of the segments' class for this world (a variant's draw)
    segment_settings: dict = field(default_factory=dict)
    #: a replica's snapshots are whole once in this many, else its keyed stores' changes
    full_every: int = 1
    #: the source's own partitions (each input's, by position): with more than one, the
    #: ingress logs the SNs it gives before inputs leave, and after a restart the inputs
    #: the log does not cover come in another interleaving (DESIGN 10)
    source_parts: Optional[List[int]] = None
    #: a broken variant's ingress (None: ``Ingress``, or ``EpochIngress`` for several)
    ingress_class: Optional[type] = None
    #: the sink also commits between cuts (an exactly-once sink's ``commit_every``): what
    #: it holds then may lie beyond the last checkpoint, and a restart must give those
    #: outputs' inputs the same SNs again
    sink_commits: bool = False
    #: the store keeps this many complete checkpoints (and every file their chains read),
    #: and the input log what the oldest of them does not cover (None: everything)
    keep: Optional[int] = None
    #: files of the store damaged at moments of the scheduler's choosing (their recorded
    #: checksums unchanged)
    corrupt_checkpoints: int = 0
    #: a restart restores the newest complete checkpoint whose files all verify (False:
    #: the newest, unread)
    verify_restores: bool = True
    #: a complete checkpoint a restart skipped (a file did not verify) is no longer one:
    #: not kept, not restorable (False: its manifest stays and counts among the kept, a
    #: broken rule random schedules rarely reach: tests drive it to the violation)
    forget_skipped: bool = True
    #: after a restart the ingress's next cut may be any input after the restored cut, as
    #: the runtime's (else only one after every cut chosen before the restart)
    cuts_follow_restore: bool = False
    #: one egress merging every partition (False: an egress and a sink per last-stage
    #: partition, docs/design/parallel_io.md)
    ordered_output: bool = True
    #: each partition's egress is a sink's writer on a node (``SinkWriter``), committing
    #: at least every ``commit_every`` items (None: the last stage's capacity)
    writers_on_nodes: bool = False
    commit_every: Optional[int] = None
    writer_class: Optional[type] = None  # a broken variant's writer
    egress_class: Optional[type] = None  # a broken variant's egress of one partition
    #: True: a broken variant that moves the last stage's groups at a cut below what a
    #: sink partition committed (``SimMoves.floor``)
    move_last_without_floor: bool = False
    #: several ingresses: which reads each input, in which epoch (``flux.sim.ingresses``);
    #: None: one ingress reading every input
    epochs: Optional[Any] = None
    #: several ingresses log the SNs they give before items leave (with restarts)
    log_epochs: bool = False
    #: how many epochs an ingress may run ahead of the slowest (None: no limit)
    epoch_skew: Optional[int] = None
    #: each of the several ingresses a pair of replicas on the nodes, crashing with them
    #: (``flux.protocol.ingress_pair``)
    ingress_pairs: bool = False
    #: live moves of key-group ranges, each at a checkpoint's cut (``flux.sim.moves``)
    moves: int = 0
    #: the key groups spread over the first count's pairs, then each next count reached
    #: live (``flux.sim.moves``)
    live_rescales: Tuple[int, ...] = ()
    #: the pairs past the first live rescale's count are dormant (no process) until a
    #: live rescale needs them, and join then on standbys (docs/design/rescaling.md)
    dormant: bool = False
    #: the cut that gives joined pairs groups waits for every process to apply the join
    #: (False: a broken variant, docs/design/rescaling.md)
    join_waits_for_views: bool = True
    #: pairs leave only once both replicas of each crossed the cut that took their
    #: groups and hold nothing (False: a broken variant leaves once they crossed it)
    leave_waits_for_acks: bool = True
    #: the leave's view tells the cut that took the pairs' groups, for their egresses
    #: (False: a broken variant: an egress per partition learns it only in band)
    leave_tells_cut: bool = True
    #: joined replicas start from the maps after the last cut that moved groups (False:
    #: a broken variant builds them with the job's maps)
    join_with_maps: bool = True


@dataclass
class Outcome:
    delivered: List[Any] = field(default_factory=list)
    takeovers: List[Addr] = field(default_factory=list)
    pair_lost: List[Addr] = field(default_factory=list)
    #: restarts that rebuilt a lost replica set from a checkpoint cut after the loss
    sets_rebuilt: int = 0
    #: restarts at another partition count, their states split by key group (DESIGN 13)
    rescales: int = 0
    #: drained rescales (a sink per partition): (cut, count) of each, in order
    drains: List[Tuple[int, int]] = field(default_factory=list)
    #: drained rescales given up: their checkpoint could not complete
    rescales_given_up: int = 0
    #: the divergence the pairs' digests found, which stopped the job (DESIGN 14)
    diverged: str = ""
    catchups: List[Addr] = field(default_factory=list)
    failed_transfers: List[Any] = field(default_factory=list)
    #: two-phase catch-up, counted at installs: bulk parts, keyed deltas, keys in them
    bulk_parts: int = 0
    deltas: int = 0
    delta_keys: int = 0
    #: bulk parts handed to a mover by "part" steps (phase 1 interleaved with processing)
    part_steps: int = 0
    #: live processes declared dead (false suspicions, cut hosts), and how they stopped
    zombies: List[str] = field(default_factory=list)
    zombie_stops: List[str] = field(default_factory=list)
    #: mover envelopes lost, and catch-up attempts aborted by their deadline
    mover_lost: int = 0
    deadlines: int = 0
    #: checkpoints: cuts chosen, snapshots taken, those complete (every report in)
    cuts: List[Tuple[int, int]] = field(default_factory=list)
    snapshots: int = 0
    snapshots_skipped: int = 0  # crossed by the replica that does not write
    snapshot_deltas: int = 0  # snapshots written as changes over the writer's last one
    complete: List[int] = field(default_factory=list)
    #: whole-job restarts, and the checkpoint each started from (None: the beginning)
    restarts: List[Optional[int]] = field(default_factory=list)
    #: files damaged (file, "altered" or "removed"), complete checkpoints a restart skipped
    #: because a file did not verify, and why the job stopped when none verified
    damaged: List[Tuple[FileId, str]] = field(default_factory=list)
    fallbacks: List[int] = field(default_factory=list)
    checkpoint_corrupt: str = ""
    #: snapshots not written: a delta whose chain lost a file (the runtime's writer refuses)
    failed_writes: int = 0
    #: sinks' writers started again beside a survivor (their node died)
    writer_moves: int = 0
    #: splits whose durable epoch log numbered inputs past a restart's cut (pairs of
    #: ingresses: the restarted pair followed its items)
    log_replays: int = 0
