"""Membership and control: what processes and the controller say to each other.

Registration (a Spark task joins), the controller's views (paper 3.2.1, DESIGN
4.4), liveness, and the reports nodes send to the controller (take-over and
fold-in done, state moved, a failure to start, an operator that raised).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from flux.addresses import Addr
from flux.digests import Digest


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A process is alive (DESIGN 6): the controller declares it dead when these stop.
    ``lag``: seconds since the sender's loop last turned (its beats come from a thread
    of their own, so a busy loop is reported, not taken for a death); ``late``: how
    much later than its interval the beat left (its thread starved of the CPU or of the
    interpreter's lock: a silence the transport did not cause)."""

    lag: float = 0.0
    late: float = 0.0


@dataclass(frozen=True, slots=True)
class Register:
    """A Spark task asks to join: its task index, incarnation (taskAttemptId), socket
    address, process ids (for kill_node), the job's secret, where its StateMover
    listens (its own thread and socket; empty if it has none), the machine and
    executor it runs on (no pair on one host), and its kernel's boot id (its
    process ids mean something only to a process under the same kernel)."""

    task: int
    inc: int
    address: str
    pid: int
    executor_pid: int
    secret: str
    mover_address: str = ""
    host: str = ""
    executor: str = ""
    boot: str = ""


@dataclass(frozen=True, slots=True)
class Ready:
    """A node built what its placement gives it (its operators, maybe big) and its loop
    turns: the job starts its data once every node is ready, not while operators are
    still being built (their inputs would queue, and a failure then finds no pair)."""


@dataclass(frozen=True, slots=True)
class Welcome:
    """The controller's answer: the name this incarnation runs as (node or standby), and,
    for a process joining a running job, the current view, where every segment lives
    now and the incarnations already fenced: it starts from there, not from view 0."""

    name: str
    view: int = 0
    where: tuple = ()  # ((addr, process name), ...)
    dead_incs: tuple = ()
    #: the dormant partitions joined in this incarnation of the job so far, and the
    #: partitions taken out since: the process is built as the job started and told
    #: them (docs/design/rescaling.md)
    joined: tuple = ()
    left: tuple = ()


@dataclass(frozen=True, slots=True)
class Members:
    """Where every process listens and its incarnation; sent before any view naming them."""

    addresses: tuple  # ((name, address, inc), ...)


@dataclass(frozen=True, slots=True)
class Failed:
    """A task could not start its node (before its loop ran): why. Spark retries it,
    so the controller stops the job when the same failure keeps coming back; a node that
    registered and then could not build (``fatal``: restoring its checkpoint failed, say)
    stops the job at once, since the job cannot begin without it. ``corrupt``: the
    checkpoint file that did not verify, and why, or empty."""

    task: int
    inc: int
    reason: str
    secret: str
    fatal: bool = False
    corrupt: Tuple = ()


@dataclass(frozen=True, slots=True)
class OperatorFailed:
    """A node's operator code raised (``flux.errors.OperatorError``): the controller stops
    the job with this error rather than fail over (the other replica would raise too)."""

    what: str
    stage: int
    partition: int
    sn: tuple
    error: str
    secret: str


@dataclass(frozen=True, slots=True)
class CutDigest:
    """A node tells the controller: replica ``addr`` crossed a cut with ``digest`` (its
    states and outputs), to be compared with its twin's (DESIGN 14)."""

    addr: Addr
    digest: Digest


@dataclass(frozen=True, slots=True)
class ProbeKeys:
    """The controller asks a node: replica ``addr``'s pairs of operator ``operator`` in
    ``groups`` of its digest, as they were at the cut ``(number, cut)`` where its twin's
    digest differed (DESIGN 14: to name the first key that differs)."""

    addr: Addr
    number: int
    cut: int
    operator: int
    groups: tuple


@dataclass(frozen=True, slots=True)
class ProbedKeys:
    """A node answers ``ProbeKeys``: ``pairs`` (``[key, pair digest]``, ``flux.digests``)
    or None when the replica cannot say its state at that cut any more."""

    addr: Addr
    number: int
    cut: int
    operator: int
    pairs: Optional[tuple]


@dataclass(frozen=True, slots=True)
class StateMoved:
    """A node tells the controller (for metrics): ``addr``'s state, ``nbytes`` long, moved
    in ``seconds`` from both movers being ready to its installation (the pause and
    drain of the sources, 5.3.1, included)."""

    addr: Addr
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CatchUpPaused:
    """A node tells the controller (for metrics): the active of ``addr``'s catch-up held
    its sources paused for ``seconds`` (phase 2: drain, the delta, resume)."""

    addr: Addr
    seconds: float


@dataclass(frozen=True, slots=True)
class SnapshotWritten:
    """A node tells the controller: replica ``addr``'s snapshot for checkpoint ``number``
    is in the checkpoint store as ``name`` (``nbytes``, written in ``seconds``), or could
    not be written (``error``: then the checkpoint never completes; DESIGN 10).
    ``chain``: the files that rebuild the state, ``[checkpoint, name]`` pairs from a whole
    snapshot through the deltas to this one (flux.snapshot_chain); empty: ``name`` alone.
    ``digests``: each chain file's checksum, in the chain's order (the manifest records
    them, and a restore verifies every file it reads against them)."""

    number: int
    addr: Addr
    name: str
    nbytes: int
    seconds: float
    error: str = ""
    chain: Tuple = ()
    digests: Tuple = ()


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """One segment replica's counters, as its node last saw them (for monitoring).
    ``taken``/``emitted``: inputs taken from its merge, outputs it produced, since it was
    built; ``queued``: tuples in its merge; ``buffered``: tuples in its buffers;
    ``in_flight``: tuples sent and not yet credited, over every connection it sends on;
    ``blocked``: those connections whose window is full; ``routed``: rows it routed to
    each key group of the next stage (``exchange.group_load``; empty: none by groups);
    ``moves_crossed``: the newest move cut it crossed, and ``idle``: it holds nothing
    (merge and buffers empty, all it sent acked): a pair a live rescale took every
    group from leaves once both its replicas say both (docs/design/rescaling.md)."""

    addr: Addr
    taken: int
    emitted: int
    queued: int
    buffered: int
    in_flight: int
    blocked: int
    routed: Tuple[int, ...] = ()
    moves_crossed: int = 0
    idle: bool = False


@dataclass(frozen=True, slots=True)
class NodeStats:
    """A node's report of every segment it hosts, every second or so."""

    segments: tuple = ()  # SegmentStats, ...


@dataclass(frozen=True, slots=True)
class FoldedIn:
    """``reporter`` processed both syncs of ``addr``'s catch-up ``version`` (DESIGN 4.6).
    A machine returns it as an effect; its node reports it to the controller."""

    reporter: Addr
    addr: Addr
    version: int


@dataclass(frozen=True, slots=True)
class TakeoverDone:
    """The producer at ``addr`` finished take-over for every consumer (DESIGN 4.5).
    A machine returns it as an effect; its node reports it to the controller."""

    addr: Addr


@dataclass(frozen=True, slots=True)
class Stopping:
    """A node ends while the job goes on (its lease ran out, messages from a peer were
    lost in transit, it was fenced): why. Said before its task fails, so the reason is
    in the driver's log, not only in an executor's; the controller fails it at once."""

    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The job is over (or failed): stop and close every socket."""

    reason: str


#: the reason of the ``Stop`` that ends a job normally; any other end of a node (fenced,
#: lease lost) is a failure of its task, which Spark re-runs as a fresh standby
JOB_STOPPED = "job stopped"


@dataclass(frozen=True, slots=True)
class Avail:
    """A standby replica for ``addr`` exists at incarnation ``inc`` on node ``node``; its
    catch-up is ``version`` and copies the active replica on node ``active_node``."""

    addr: Addr
    inc: int
    version: int
    node: str
    active_node: str


@dataclass(frozen=True, slots=True)
class WriterProgress:
    """A node tells the controller how far partition ``partition``'s writer got: no
    output at or below ``bound`` (its merge's frontier) can still come, and every output
    of inputs up to ``settled`` is in its sink (docs/design/parallel_io.md); ``outputs``:
    how many this writer has committed to its sink since it started on that node (the
    driver's metrics count the job's outputs from them)."""

    partition: int
    bound: Tuple[int, ...]
    settled: int
    outputs: int = 0


@dataclass(frozen=True, slots=True)
class IngressEnded:
    """An ingress replica on a node read every input of its split (``flux.SplitSource``)
    and cut its last item: split ``split``'s inputs end at SN ``last`` and it took
    ``inputs`` of them. The driver's end of the job waits for every split's
    (docs/design/parallel_io.md)."""

    split: int
    last: int
    inputs: int


@dataclass(frozen=True, slots=True)
class CheckpointDone:
    """The controller to every egress of one partition, where it runs now: checkpoint
    ``number``, cut at ``cut``, is complete (its manifest written), or the newest when
    the egress was made. An egress that holds its output past a move of the last stage's
    key groups at a cut up to it lets it go (docs/design/rescaling.md)."""

    number: int
    cut: int


@dataclass(frozen=True, slots=True)
class CutAtEpoch:
    """The driver's checkpoint coordinator to every node: checkpoint ``number``'s cut is
    at the end of epoch ``epoch`` (a ``flux.SplitSource``'s ingresses number in epochs;
    docs/design/parallel_io.md). The replicas of the pairs that decide stamp it, and
    switch their routing for the live ``moves`` of key groups it carries (``GroupMove``s,
    DESIGN 13) as they end that epoch."""

    number: int
    epoch: int
    moves: tuple = ()


@dataclass(frozen=True, slots=True)
class HoldInputs:
    """The driver to every node while a rescale drains (DESIGN 13, docs/design/
    rescaling.md): no ingress replica that decides takes an input into an epoch after
    ``after_epoch`` (its epochs still end, empty); None: take inputs again."""

    after_epoch: Optional[int]


@dataclass(frozen=True, slots=True)
class SplitCutPassed:
    """A replica of split ``split``'s pair of ingresses passed checkpoint ``number``'s cut
    ``cut`` having read ``read`` inputs of its split: where a restart from that
    checkpoint reads the split from; ``mark``: where the split's source stood at a count
    at or before ``read`` (``[count, position]`` as JSON; "": none known, or the source
    cannot seek), which a restart seeks to."""

    number: int
    cut: int
    split: int
    read: int
    mark: str = ""


@dataclass(frozen=True, slots=True)
class SinkCommitted:
    """A writer's sink committed at checkpoint ``number``'s cut: its last output ``sn``
    (None: none yet), for the checkpoint's manifest (DESIGN 10)."""

    number: int
    sn: Optional[Tuple[int, ...]]
    partition: int


@dataclass(frozen=True, slots=True)
class WriterMove:
    """A sink's writer ``addr`` starts again on node ``node`` (incarnation ``inc``), from
    what its sink committed: the node it ran on died (docs/design/parallel_io.md)."""

    addr: Addr
    inc: int
    node: str


@dataclass(frozen=True, slots=True)
class Joined:
    """Replica ``addr`` of a dormant partition starts on node ``node`` (incarnation
    ``inc``), fresh: its partition runs from this view on (docs/design/rescaling.md),
    routing by ``groups`` (``((stage, owners), ...)``: the maps after the move cuts up to
    ``moves_seen``; empty: the job's). ``cut``: the newest checkpoint cut ``(k, n)`` chosen
    before it, whose snapshots are not its to write (a partition that left at a cut
    still open wrote its own there)."""

    addr: Addr
    inc: int
    node: str
    groups: tuple = ()
    moves_seen: int = 0
    cut: tuple = ()


@dataclass(frozen=True, slots=True)
class View:
    """A controller view update (paper 3.2.1): endpoints that failed, with the
    incarnations now fenced, and standbys that became available.

    Views are numbered, delivered to every process in the same order, and each
    is applied completely before the next (DESIGN 4.4).
    """

    number: int
    failed: frozenset = frozenset()
    failed_incs: frozenset = frozenset()
    avail: tuple = ()
    writers: tuple = ()  # WriterMove, after the failures that made them
    joined: tuple = ()  # Joined: dormant partitions started, after the rest
    left: tuple = ()  # Addr: the replicas of partitions a live rescale took out, last
    #: with ``left``: the cut ``(k, n)`` that took their last groups, crossed by all they
    #: sent: an egress of one of them learns it here (no stamp of theirs may bring it)
    left_cut: tuple = ()


@dataclass(frozen=True, slots=True)
class RangePacked:
    """A replica of a live move's source partition crossed the move's cut (checkpoint
    ``number``) and took the range's state out of its stores: ``data``, packed (DESIGN
    13). Both replicas report it; the controller keeps the first and hands it to the
    destination's replicas (``InstallRange``). A prepare's (``move.prepare``) is the
    range's bulk, kept in the stores; ``over``: the checkpoint of the bulk this pack
    is the changes since (None: the whole range). ``took``: the seconds the replica's
    step that packed it took (the runtime's measure)."""

    number: int
    move: Any
    addr: Addr
    data: bytes
    over: Optional[int] = None
    took: float = 0.0


@dataclass(frozen=True, slots=True)
class InstallRange:
    """To a replica of a live move's destination partition: the range's state at the
    move's cut (checkpoint ``number``); it processes nothing past the cut before it
    installed it (DESIGN 13). ``over``: as ``RangePacked``'s."""

    number: int
    move: Any
    data: bytes
    over: Optional[int] = None


@dataclass(frozen=True, slots=True)
class RangeInstalled:
    """``addr``, a replica of a live move's destination, holds the range of the move
    at checkpoint ``number``: the controller need not send it again. ``waited``: the
    seconds it processed nothing, from the step that crossed the cut to the end of the
    install (the runtime's measure)."""

    number: int
    move: Any
    addr: Addr
    waited: float = 0.0
