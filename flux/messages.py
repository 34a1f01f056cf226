"""Addresses, data-plane messages and the effects protocol machines return.

Machines never do I/O: they take events and return effects as data
(``Send``, ``Deliver``, ``Report``); a driver (the simulator or the runtime)
carries them out. Messages are small frozen records so a trace can print them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Tuple

from flux.sequence import SN

#: Replica labels of a pair. Chained declustering puts replica P of partition k
#: on node k and replica S on node k+1.
P = 0
S = 1


def other(replica: int) -> int:
    """The other replica of a pair (the paper's ``p(dest)``)."""
    return 1 - replica


class Addr(NamedTuple):
    """A protocol endpoint: one replica of one partition of one stage.

    The ingress is stage 0 and the egress is stage ``stages + 1``; both have a
    single partition 0 and are replica P.
    """

    stage: int
    partition: int
    replica: int

    def __str__(self) -> str:
        return f"{self.stage}.{self.partition}{'PS'[self.replica]}"


class ProcAddr(NamedTuple):
    """A whole process (a node, a standby, the ingress, the egress, the controller):
    the endpoint of views, heartbeats and reports."""

    name: str

    def __str__(self) -> str:
        return f"@{self.name}"


CONTROLLER = ProcAddr("controller")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A process is alive (DESIGN 6): the controller declares it dead when these stop."""


@dataclass(frozen=True, slots=True)
class Register:
    """A Spark task asks to join: its task index, incarnation (taskAttemptId), socket
    address, process ids (for kill_node), the job's secret, and where its StateMover
    listens (its own thread and socket; empty if it has none)."""

    task: int
    inc: int
    address: str
    pid: int
    executor_pid: int
    secret: str
    mover_address: str = ""


@dataclass(frozen=True, slots=True)
class Welcome:
    """The controller's answer: the name this incarnation runs as (node or standby), and,
    for a process joining a running job, the current view, where every segment lives
    now and the incarnations already fenced: it starts from there, not from view 0."""

    name: str
    view: int = 0
    where: tuple = ()  # ((addr, process name), ...)
    dead_incs: tuple = ()


@dataclass(frozen=True, slots=True)
class Members:
    """Where every process listens and its incarnation; sent before any view naming them."""

    addresses: tuple  # ((name, address, inc), ...)


@dataclass(frozen=True, slots=True)
class Failed:
    """A task could not start its node (before its loop ran): why. Spark retries it,
    so the controller stops the job when the same failure keeps coming back."""

    task: int
    inc: int
    reason: str
    secret: str


@dataclass(frozen=True, slots=True)
class OperatorFailed:
    """A node's operator code raised (``flux.operator.OperatorError``): the controller stops
    the job with this error rather than fail over (the other replica would raise too)."""

    what: str
    stage: int
    partition: int
    sn: tuple
    error: str
    secret: str


@dataclass(frozen=True, slots=True)
class StateInstalled:
    """Effect of a host: the state of a catch-up ``transfer`` arrived (``nbytes``) and is
    installed. The runtime times the movement; the protocol does not need it."""

    transfer: tuple
    nbytes: int


@dataclass(frozen=True, slots=True)
class StateMoved:
    """A node tells the controller (for metrics): ``addr``'s state, ``nbytes`` long, moved
    in ``seconds`` from both movers being ready to its installation (the pause and
    drain of the sources, 5.3.1, included)."""

    addr: Addr
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Stop:
    """The job is over (or failed): stop and close every socket."""

    reason: str


#: the reason of the ``Stop`` that ends a job normally; any other end of a node (fenced,
#: lease lost) is a failure of its task, which Spark re-runs as a fresh standby
JOB_STOPPED = "job stopped"


Item = Tuple[SN, Any]


@dataclass(frozen=True, slots=True)
class Batch:
    """Data from a producer: tuples in SN order, then a progress bound (DESIGN 4.3)."""

    items: Tuple[Item, ...]
    bound: SN


@dataclass(frozen=True, slots=True)
class Ack:
    """Cumulative ack: the consumer holds every SN <= ``hwm`` of this connection (3.1.3)."""

    hwm: SN


@dataclass(frozen=True, slots=True)
class Reverse:
    """Consumer to the surviving producer: send me data from after ``hwm`` (Figure 4, 5.2)."""

    hwm: SN


@dataclass(frozen=True, slots=True)
class Pause:
    """Consumer A to a data source: stop sending to me, answer after your last data (5.3.1)."""

    version: int


@dataclass(frozen=True, slots=True)
class PauseAck:
    """Producer to A, after its last data: nothing more until your csync (5.3.1)."""

    version: int


@dataclass(frozen=True, slots=True)
class CSync:
    """Fold-in, from both replicas of a rebuilt consumer to its producers (5.3.2)."""

    version: int


@dataclass(frozen=True, slots=True)
class PSync:
    """Fold-in, from both replicas of a rebuilt producer to its consumers (5.3.2)."""

    version: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message on the wire: sender, destination, the sender's view, the sender's
    incarnation and the destination incarnation the sender meant.

    A rebuilt replica reuses its address, so fencing is by incarnation both ways
    (DESIGN 4.4): a dead sender's messages are dropped, and a message meant for
    a dead incarnation never reaches its successor (as TCP to a dead process).
    ``dst_inc`` None means "whoever holds the address" (the StateMovers, whose
    ids name one incarnation already)."""

    src: Addr
    dst: Addr
    view: int
    msg: Any
    inc: int = 0
    dst_inc: Any = None


@dataclass(frozen=True, slots=True)
class Send:
    """Effect: put ``msg`` on the FIFO connection from ``src`` to ``dst``."""

    src: Addr
    dst: Addr
    msg: Any


@dataclass(frozen=True, slots=True)
class Deliver:
    """Effect of the egress: these items leave the dataflow, in order."""

    items: Tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class FoldedIn:
    """Effect: ``reporter`` processed both syncs of ``addr``'s catch-up ``version`` (DESIGN 4.6)."""

    reporter: Addr
    addr: Addr
    version: int


@dataclass(frozen=True, slots=True)
class TakeoverDone:
    """Effect: the producer at ``addr`` finished take-over for every consumer (DESIGN 4.5)."""

    addr: Addr


class ProtocolError(Exception):
    """A peer sent something no state of this machine can accept."""


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
