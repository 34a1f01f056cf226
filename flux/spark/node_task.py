"""What one long-running Spark task runs: a Flux node (or a standby).

The task registers with the driver's controller (its ``taskAttemptId`` is its
incarnation, DESIGN 4.4), learns its name (``node{k}`` for the first attempt
of task k, a fresh standby otherwise) and where every process listens, builds
the segments its placement gives it, and runs the node loop until the
controller says stop or its lease runs out. It captures only plain
configuration (SPARK_NOTES), and closes every socket on the way out.
"""
from __future__ import annotations

import faulthandler
import gc
import logging
import os
import pickle
import socket
import time
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional

import fsspec
import zmq
from pyspark import cloudpickle
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from exchange.group_map import maps_from_config
from flux.addresses import CONTROLLER, ProcAddr
from flux.protocol.builder import MachineBuilder
from flux.control_messages import (
    JOB_STOPPED,
    Failed,
    Members,
    OperatorFailed,
    Ready,
    Register,
    Stop,
    Stopping,
    Welcome,
)
from flux.envelope import Envelope
from flux.errors import CheckpointCorrupt, OperatorError
from flux.protocol.host import Host
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.config import NodeConfig
from flux.runtime.restore import restore_operators
from flux.runtime.liveness import Liveness
from flux.runtime.gc_tuning import data_path_gc
from flux.runtime.loop import HostLoop
from flux.runtime.node_ingresses import NodeIngresses
from flux.runtime.writer_sinks import WriterSinks
from flux.runtime.mover_service import StateMoverService, mover_peer
from flux.runtime.network import boot_id, is_loopback, split_tcp
from flux.runtime.snapshot_writer import SnapshotWriter
from flux.runtime.split_log import SplitLog
from flux.runtime.split_log_writer import SplitLogWriter
from flux.runtime.transport import Transport
from flux.protocol.segment import StreamedSegment

log = logging.getLogger(__name__)


def executor_pid() -> int:
    """The executor JVM: the parent of our parent (worker -> pyspark.daemon -> JVM)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def machine_name(address: str) -> str:
    """The machine a node runs on, as placement compares them: its advertised address
    (two executors of one machine advertise the same one), or the machine's name when
    that is loopback (one machine: the placement check then sees a single host)."""
    host = split_tcp(address)[0]
    return socket.gethostname() if is_loopback(host) else host


def executor_id() -> str:
    """The executor the task runs in: Spark's id, which a Python worker sees only in its
    log URL (SPARK_NOTES), else the executor JVM's process id."""
    url = os.environ.get("SPARK_LOG_URL_STDERR", "")
    if "executorId=" in url:
        return url.split("executorId=", 1)[1].split("&", 1)[0]
    return f"jvm{executor_pid()}"


def node_main(task: int, config: NodeConfig) -> Iterator[tuple]:
    from pyspark import TaskContext

    ctx_task = TaskContext.get()
    inc = ctx_task.taskAttemptId() if ctx_task is not None else os.getpid()
    if not faulthandler.is_enabled():  # a hard crash (a native library's abort, a
        faulthandler.enable(all_threads=True)  # segfault) leaves its traceback in the executor's log
    ctx = zmq.Context()
    keys = config.keys
    bind = dict(host=config.bind_host(), ports=config.ports)  # where peers reach us
    transport = Transport(ctx, f"w{inc}", inc, keys=keys, **bind)
    try:
        transport.connect(CONTROLLER.name, config.controller)
        me0 = ProcAddr(f"w{inc}")
        try:  # a deterministic error shows here, on every attempt, before registering
            dataflow, spares = load_dataflow(config)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            transport.send(CONTROLLER.name, Envelope(me0, CONTROLLER, 0, Failed(
                task, inc, reason, config.secret), inc, None))
            transport.close(linger_ms=2000)  # the report leaves before Spark sees the error
            raise
        mover = StateMoverService(ctx, f"w{inc}", inc, keys, **bind)  # its socket exists now
        try:
            with data_path_gc():
                return run_node(task, inc, config, dataflow, transport, mover, me0, spares)
        finally:
            mover.stop()
    finally:
        transport.close()
        ctx.term()


def run_node(task: int, inc: int, config: NodeConfig, dataflow, transport: Transport,
             mover: StateMoverService, me0: ProcAddr, spares=None) -> Iterator[tuple]:
    """Register, build the node, start its StateMover service, run until told to stop."""
    # before registering: unpickling an in-memory source holds the GIL (1.3 s of CPU for
    # 46 MB of records, several seconds on a loaded machine), and once registered the
    # heartbeat thread must not wait that long for it, or the node is declared dead
    source = cloudpickle.loads(config.split_source) if config.split_source else None
    register = Envelope(me0, CONTROLLER, 0, Register(
        task, inc, transport.address, os.getpid(), executor_pid(), config.secret,
        mover.address, machine_name(transport.address), executor_id(), boot_id()), inc, None)
    joined = join(transport, register, config.register_timeout)
    if joined is None:
        return iter([(task, inc, "stopped before start")])
    welcome, members, early = joined
    name = welcome.name
    # heartbeats from a thread of their own: a long step of the loop is not a death
    # it beats from now on: building the segments (big operators) takes time too
    liveness = Liveness(transport.ctx, name, inc, config.controller, config.heartbeat,
                        config.keys, host=split_tcp(transport.address)[0],
                        ports=config.ports)
    built: List[HostLoop] = []
    liveness.start(lambda: built[0].view_applied if built else welcome.view)
    writer = splits = None
    try:
        if config.checkpoint:
            # named by the run and this process's incarnation (``snapshot_name``)
            writer = SnapshotWriter(CheckpointStore(config.checkpoint),
                                    f"{config.secret[:8]}-{inc}")
        splits = split_ingresses(config, source)
        try:
            built.append(build_loop(welcome, inc, members, transport, config, dataflow,
                                    mover_relay=mover_peer(name), on_turn=liveness.loop_turned,
                                    spares=spares, snapshots=writer, splits=splits))
        except Exception as exc:  # named already: the job cannot begin without this node
            corrupt = (exc.path, exc.why) if isinstance(exc, CheckpointCorrupt) else ()
            reason = f"{name}: {type(exc).__name__}: {exc}"[:1000]
            log.error("%s could not build its segments: %s", name, reason)
            transport.send(CONTROLLER.name, Envelope(me0, CONTROLLER, 0, Failed(
                task, inc, reason, config.secret, fatal=True, corrupt=corrupt), inc, None))
            transport.close(linger_ms=2000)  # the report leaves before Spark sees the error
            raise
        return run_loop(task, inc, name, built[0], mover, liveness, early, config)
    finally:
        liveness.stop()
        if writer is not None:
            writer.stop()
        if splits is not None:
            splits.stop()


def run_loop(task: int, inc: int, name: str, loop: HostLoop, mover: StateMoverService,
             liveness: Liveness, early: List[Envelope], config: NodeConfig) -> Iterator[tuple]:
    """Turn the node loop until the controller says stop; what ended it decides whether
    the task succeeds (the job stopped) or fails (Spark re-runs it as a standby)."""
    transport = loop.transport
    loop.addresses[mover_peer(name)] = mover.address
    mover.start(name, transport.address, loop.addresses,
                lambda process: process in loop.dead_processes)
    for env in early:
        loop.receive(env)
    # what the node built (its imports, operators, a restored state) lives as long as the
    # task: out of the collector's way, a full collection stays short, as the driver's
    gc.freeze()
    loop.report(Ready())  # built: the job may start its data
    try:
        return _turn_until_stopped(task, inc, name, loop, mover, liveness, config)
    finally:
        gc.unfreeze()  # the Python worker may run another task: its objects are collectable


def _turn_until_stopped(task: int, inc: int, name: str, loop: HostLoop,
                        mover: StateMoverService, liveness: Liveness,
                        config: NodeConfig) -> Iterator[tuple]:
    transport = loop.transport
    try:
        while loop.stopped is None:
            loop.turn(5)
            for service, what in ((mover, "StateMover service"), (liveness, "liveness thread")):
                if service.error is not None:
                    raise RuntimeError(f"{name}: its {what} failed") from service.error
    except OperatorError as err:  # user code: the controller stops the job with it
        transport.send(CONTROLLER.name, Envelope(loop.me, CONTROLLER, loop.host.view,
                                                 OperatorFailed(err.what, err.stage, err.partition,
                                                                err.sn, err.error, config.secret),
                                                 inc, None))
        wait_for_stop(transport, config.lease)  # staying up: no failover races the report
        return iter([(task, inc, name, str(err))])
    if loop.stopped != JOB_STOPPED:
        # Declared dead while alive (say, starved past the detection timeout), or fenced:
        # this incarnation may never act again, but the process can serve. A failed task is
        # re-run by Spark and its new attempt registers as a fresh standby (DESIGN 6).
        log.warning("%s (attempt %d) stopped: %s", name, inc, loop.stopped)
        loop.report(Stopping(loop.stopped))  # the driver's log says why, too
        transport.close(linger_ms=500)
        raise NodeEnded(f"{name} (attempt {inc}) stopped: {loop.stopped}; "
                        f"a new attempt will join as a standby")
    if loop.writer_sinks is not None:  # the job's end: its writers' last outputs commit
        loop.writer_sinks.close()
    return iter([(task, inc, name, loop.stopped)])


class NodeEnded(RuntimeError):
    """A node stopped while its job goes on: its task fails so that Spark re-runs it."""


def wait_for_stop(transport: Transport, seconds: float) -> None:
    """Poll (and so flush) until the controller says stop, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        envelopes, _ = transport.poll(50)
        if any(isinstance(env.msg, Stop) for env in envelopes):
            return


class NotWelcomed(Exception):
    """No welcome from the controller yet: register again."""


def join(transport: Transport, register: Envelope, timeout: float):
    """Register until the controller answers with Welcome and Members (registration is
    idempotent, so a repeat is harmless); None if it says stop instead. Registering
    again, with a growing pause, covers a controller that was not listening yet."""
    got: Dict[type, Any] = {}
    early: List[Envelope] = []

    def listen(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not (Welcome in got and Members in got) and Stop not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            envelopes, _ = transport.poll(max(1, int(left * 1000)))
            for env in envelopes:
                if isinstance(env.msg, (Welcome, Members, Stop)):
                    got[type(env.msg)] = env.msg
                else:
                    early.append(env)

    retrying = Retrying(stop=stop_after_delay(timeout), reraise=True,
                        wait=wait_exponential(multiplier=0.1, max=2.0), sleep=listen,
                        retry=retry_if_exception_type(NotWelcomed))
    try:
        for attempt in retrying:
            with attempt:
                if not got:
                    transport.send(CONTROLLER.name, register)
                listen(0.5)
                if Stop not in got and not (Welcome in got and Members in got):
                    raise NotWelcomed()
    except NotWelcomed:
        raise TimeoutError(f"task {register.msg.task}: no welcome from the controller "
                           f"within {timeout}s") from None
    if Stop in got:
        return None
    return got[Welcome], got[Members], early


def load_dataflow(config: NodeConfig):
    """Unpickle the dataflow here (an operator module missing on this executor fails
    here, not in Spark's closure loading) and build the operator chains a node hosts
    (per stage, as many as the placement gives one node): the check, and ``spares``,
    the chains its segments start with. A standby too, before it registers: a
    catch-up then never waits for its operators to be built (maybe big: a table
    filled, a model loaded)."""
    dataflow = cloudpickle.loads(config.dataflow)
    topology = config.topology()
    hosted = [Counter(a.stage for a in topology.endpoints_of(n)) for n in topology.nodes]
    spares = {s: [stage.build_chain() for _ in range(max([1] + [c[s] for c in hosted]))]
              for s, stage in enumerate(dataflow.stages, 1)}
    return dataflow, spares


def build_loop(welcome: Welcome, inc: int, members: Members, transport: Transport,
               config: NodeConfig, dataflow, mover_relay: Optional[str] = None,
               on_turn: Callable[[], None] = lambda: None, spares=None,
               snapshots: Optional[SnapshotWriter] = None,
               splits: Optional[NodeIngresses] = None) -> HostLoop:
    """This process's host and loop, from the job's topology and what the controller said:
    a node hosts what the placement gives it, a standby starts empty; a late joiner
    starts from the current view and where segments live by now."""
    name = welcome.name
    incs = {n: i for n, _, i in members.addresses}
    topology = config.topology(incs)
    builder = MachineBuilder(dataflow, config.partitions, config.capacity, config.batch_size,
                             replication=config.replication, window=config.window,
                             segment_class=StreamedSegment, spare_chains=spares,
                             full_every=config.checkpoint_full_every,
                             ordered_output=config.ordered_output,
                             pause_room=config.pause_room,
                             writers_on_nodes=bool(config.writers_sink),
                             digests=config.digests, key_groups=config.key_groups,
                             ingresses=max(1, config.splits),
                             ingress_pairs=bool(config.splits))
    builder.groups = maps_from_config(config.group_maps, config.partitions)
    builder.dormant = config.dormant
    machines = {a: builder.ingress(index=a.partition, replica=a.replica) if a.stage == 0
                else builder.segment(a) for a in topology.endpoints_of(name)}
    segments = {a: m for a, m in machines.items() if a.stage > 0}
    if config.restore >= 0 and segments:
        restore_operators(snapshots.store, config.restore, segments, dataflow,
                          config.partitions, config.key_groups)
    if splits is not None and config.split_resume:  # both replicas follow their logs
        splits.resume(machines, *pickle.loads(config.split_resume))
    writer_sinks = None
    if config.writers_sink:  # this node writes the sinks of its partitions' writers
        sink = cloudpickle.loads(config.writers_sink)
        writer_sinks = WriterSinks(sink.open, builder.writer, config.commit_interval)
        here = [e for e in topology.egresses if topology.where[e] == name]
        for e, writer in zip(here, writer_sinks.adopt([builder.writer(e.partition)
                                                       for e in here])):
            machines[e] = writer
    where = dict(topology.where)
    where.update(dict(welcome.where))
    host = Host(name, machines, inc, builder.standby_segment, config.chunk_size,
                topology.peer_incs(where), view=welcome.view, dead_incs=welcome.dead_incs,
                writer_factory=writer_sinks.start if writer_sinks is not None else None,
                joined_factory=builder.joined_segment, joined=welcome.joined,
                left=welcome.left)
    loop = HostLoop(host, transport, where, {n: a for n, a, _ in members.addresses},
                    incarnations=incs, on_turn=on_turn, lease=config.lease,
                    flush_delay=config.flush_delay, mover_relay=mover_relay,
                    stats_every=config.stats_every, snapshots=snapshots,
                    writer_sinks=writer_sinks, split_ingresses=splits)
    return loop


def split_ingresses(config: NodeConfig, source) -> Optional[NodeIngresses]:
    """The intakes of the ingress replicas a node may run (``source``: the job's
    ``flux.SplitSource``), or None when the driver's ingress reads the job's source. A
    standby has them too: a replica of a pair of ingresses may be rebuilt on it."""
    if source is None:
        return None
    logs = None
    if config.checkpoint:  # each split's durable log: this run's folder, past the last place
        fs, root = fsspec.core.url_to_fs(config.checkpoint)
        resume = pickle.loads(config.split_resume)[1] if config.split_resume else {}
        logs = SplitLogWriter(lambda split: SplitLog(
            fs, root, split, config.split_attempt, resume.get(split, (0, [], 0))[2]))
    return NodeIngresses(source, config.epoch_interval, config.epoch_origin, logs=logs)

