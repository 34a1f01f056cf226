"""Deploy a Flux dataflow on a SparkSession: nodes as long-running Spark tasks.

The driver runs the controller and the egress (threads with sockets of their
own) and feeds the ingress, which runs in a process of its own (issue 16:
off the controller's GIL); ``nodes + standbys`` Spark tasks run ``node_main``.
When a node's process dies, Spark re-runs its task and the new attempt
registers as a fresh standby (DESIGN 6). ``stop()`` stops every task and
thread and process it started and closes every socket.
"""
from __future__ import annotations

import gc
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import zmq
from pyspark import cloudpickle

from controller.checkpoints import CheckpointCoordinator, fingerprint
from controller.hosts import PlacementError, assign_hosts
from controller.recovery import Recovery
from flux.builder import REPLICATIONS, MachineBuilder
from flux.control_messages import JOB_STOPPED, Register
from flux.dataflow import check_batch_api, check_state_round_trip
from flux.effects import Deliver, SinkCommit
from flux.errors import CheckpointCorrupt, DataflowError, IngressLost, PairLost
from flux.host import Host
from flux.operator import OperatorRaised, describe
from flux.connectors import LOGGED, is_exactly_once, replay_order_of
from flux.runtime.checkpoint_service import CheckpointService
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.config import NodeConfig
from flux.runtime.input_log import InputLog, InputLogWriter
from flux.runtime.controller_service import PENDING, ControllerService
from flux.runtime.ingress_feed import IngressFeed
from flux.runtime.ingress_process import BEGIN, IngressProcess
from flux.runtime.loop import HostLoop
from flux.runtime.metrics import Metrics
from flux.runtime.network import boot_id, local_host
from flux.runtime.sources import peek, replayable
from flux.runtime.transport import Transport
from flux.spark.node_task import node_main
from flux.spark.settings import check_settings, is_local
from flux.topology import (
    CONTROLLER_PROCESS,
    EGRESS_PROCESS,
    INGRESS_PROCESS,
    standby_name,
)

log = logging.getLogger(__name__)


def check_before_deploy(dataflow, sample: List[Any], partitions: int) -> None:
    """Refuse, before any task starts, a dataflow that fails on the source's first records:
    an operator or key that raises, a key msgpack cannot hash, a state msgpack cannot
    serialize or ``install_state`` does not restore (DESIGN 4.1), a ``process_batch`` that
    disagrees with ``process``."""
    if not sample:
        return  # nothing to check yet; the executors build the operators and report
    try:
        check_state_round_trip(dataflow, sample, partitions)
        check_batch_api(dataflow, sample)
    except DataflowError:
        raise
    except OperatorRaised as exc:
        where = f" in {exc.where}" if exc.where else ""
        raise DataflowError(f"on one of the source's first {len(sample)} records{where}, "
                            f"{exc}") from exc.error
    except Exception as exc:
        raise DataflowError(f"the dataflow fails on the source's first {len(sample)} records: "
                            f"{describe(exc)}") from exc


#: seconds the job waits for standby tasks to register once every node task has
STANDBY_GRACE = 3.0
#: incarnations of the driver-side processes: never a Spark taskAttemptId (those are >= 0)
DRIVER_INCS = {CONTROLLER_PROCESS: -3, INGRESS_PROCESS: -1, EGRESS_PROCESS: -2}


class FluxJob:
    def __init__(self, spark, dataflow, source: Iterable[Any], nodes: int = 4, standbys: int = 1,
                 capacity: int = 1024, batch_size: int = 256, detect_after: float = 0.5,
                 heartbeat: float = 0.05, lease: float = 3.0, chunk_size: int = 1 << 20,
                 sink: Optional[Callable[[Any], None]] = None, replication: str = "flux",
                 metrics_interval: float = 0.1, flush_delay: float = 0.002,
                 check_records: int = 200, authenticate: bool = True, window: int = 1024,
                 keep_output: Optional[bool] = None, metrics_port: Optional[int] = None,
                 metrics_addr: str = "0.0.0.0", driver_host: Optional[str] = None,
                 ports: Optional[Tuple[int, int]] = None,
                 distinct_hosts: Optional[bool] = None, checkpoint: Optional[str] = None,
                 checkpoint_interval: float = 10.0, checkpoint_keep: int = 3,
                 checkpoint_full_every: int = 10, restarts: int = 3):
        if nodes < 2:
            raise ValueError(f"Flux needs at least 2 nodes (a pair per partition), got {nodes}")
        if standbys < 0:
            raise ValueError(f"standbys must be >= 0, got {standbys}")
        if replication not in REPLICATIONS:
            raise ValueError(f"replication must be one of {REPLICATIONS}, got {replication!r}")
        if checkpoint is not None:
            replay = replayable(source)
            if replay is None:
                raise ValueError(
                    f"checkpoint= needs a source that can be read again from a position (a "
                    f"flux.Source such as FileSource, or a sequence), got "
                    f"{type(source).__name__}: after a restart its inputs must come again")
            source = replay
            #: how a restart reads the source again in its order: with ``LOGGED`` the
            #: ingress logs each input's partition (DESIGN 10); never guessed
            self._replay_order = replay_order_of(source)
            if not checkpoint_interval > 0:
                raise ValueError(f"checkpoint_interval must be > 0 seconds, "
                                 f"got {checkpoint_interval!r}")
        if restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {restarts}")
        sample, source = peek(source, check_records)
        check_before_deploy(dataflow, sample, nodes)
        self.spark, self.dataflow, self.source = spark, dataflow, source
        self.nodes, self.standbys = nodes, standbys
        self.builder = MachineBuilder(dataflow, nodes, capacity, batch_size,
                                      replication=replication, window=window)
        self.secret = secrets.token_hex(16)
        self.sink = sink
        self.metrics = Metrics(metrics_interval)
        #: the outputs so far, in order, when kept: by default only without a sink, so an
        #: endless job with a sink holds no object per output (issue 12)
        self.keep_output = sink is None if keep_output is None else keep_output
        self.delivered: List[Any] = []
        #: a Prometheus endpoint on this port (0: any free one), when given (issue 12)
        self.metrics_port, self.metrics_addr = metrics_port, metrics_addr
        self.endpoint = None
        self._feed: Optional[IngressFeed] = None
        self._ingress_process: Optional[IngressProcess] = None
        self._egress = None
        self.errors: List[BaseException] = []
        self.config = NodeConfig(
            dataflow=cloudpickle.dumps(dataflow), stages=len(dataflow.stages), partitions=nodes,
            replication=replication, capacity=capacity, batch_size=batch_size, window=window,
            heartbeat=heartbeat, lease=lease, chunk_size=chunk_size, flush_delay=flush_delay,
            secret=self.secret, curve=authenticate, ports=ports,
            checkpoint_full_every=checkpoint_full_every)
        #: no pair on one host (issue 13): by default, except on a local master (one
        #: machine by construction); False allows it, for single-host development
        self.distinct_hosts = distinct_hosts  # None: decided by ``start`` from the master
        self._named = False  # every task named (nodes on distinct hosts), standbys after
        self._enough_since: Optional[float] = None
        #: where the driver's sockets (controller, ingress, egress) bind and are reached:
        #: Spark's own driver address unless given (issue 13)
        self.driver_host = driver_host
        #: the placement's nodes by name; incarnations are added as tasks register
        self.topology = self.config.topology()
        self.detect_after = detect_after
        self._stop = threading.Event()
        self._ending = threading.Event()
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._threads: List[threading.Thread] = []
        self.task_results: List[Any] = []
        self._loops: Dict[str, HostLoop] = {}
        self.group = f"flux-{self.secret[:8]}"
        self.restarts_left = restarts
        #: (when, the checkpoint restored or None, why) for every restart of the job
        self.restart_log: List[Tuple[float, Optional[int], str]] = []
        self._restart_due: Optional[BaseException] = None
        self._supervisor: Optional[threading.Thread] = None
        #: the last output handed to the sink by this driver: a restart's replay of what
        #: came after the checkpoint's cut is not handed again (DESIGN 10); what an
        #: exactly-once sink committed before this driver started, it drops itself
        self._last_sn: Optional[tuple] = None
        self._exactly_once = is_exactly_once(sink)
        self.checkpoints: Optional[CheckpointService] = None
        self._restore: Optional[dict] = None
        #: a source with partitions of its own interleaves them differently on every read:
        #: with checkpoints, the ingress logs each input's partition before it leaves
        #: (DESIGN 10), and a restart replays that order
        self.input_log: Optional[InputLog] = None
        #: the logged partitions of the inputs after the restored cut, read (and checked)
        #: when the checkpoint is chosen, replayed when the data starts
        self._replay: List[Any] = []
        self._log_writer: Optional[InputLogWriter] = None
        self._offsets_reported: Optional[int] = None  # the checkpoint whose source position
        #                                                 went to the source (commit_offsets)
        self.checkpoint_interval = checkpoint_interval
        if checkpoint is not None:
            self._setup_checkpoints(checkpoint, checkpoint_keep)

    @property
    def resumed_from(self) -> Optional[dict]:
        """The manifest of the checkpoint this job started from (it found one at its
        checkpoint location), or None: it started from the source's first input."""
        return self._restore

    def _setup_checkpoints(self, url: str, keep: int) -> None:
        """The store (a local folder made absolute: executors run elsewhere), the last
        complete checkpoint of this dataflow if any (another dataflow's is refused), and
        the service that completes new ones (DESIGN 10)."""
        if "://" not in url:
            url = os.path.abspath(url)
        store = CheckpointStore(url, keep=keep)
        print_ = fingerprint(self.dataflow, self.nodes)
        self._restore = store.latest(print_, self.nodes)
        self._start_position = self.source.position  # a restart with no checkpoint yet
        coordinator = CheckpointCoordinator(len(self.dataflow.stages), self.nodes, print_)
        if self._replay_order == LOGGED:
            self.input_log = InputLog(store)
            self._replay = self._plan_replay(self._restore)
        self.checkpoints = CheckpointService(store, coordinator, events=self.metrics.events,
                                             input_log=self.input_log)
        self._next_checkpoint = max(store.ids(), default=0) + 1
        self.config = replace(self.config, checkpoint=url)
        if self._restore is not None:
            log.info("resuming from checkpoint %d of %s (cut at input %d)",
                     self._restore["checkpoint"], url, self._restore["cut"])

    def _plan_replay(self, restore: Optional[dict]) -> List[Any]:
        """The logged order of the inputs after ``restore``'s cut, as far as the input log
        replays it. Every input an output the sink has (committed, or handed to it by this
        driver) derives from must get its SN again: if a damaged or missing entry of the
        log stops short of that, the job cannot resume exactly (``CheckpointCorrupt``,
        naming the entry). Short of that, what lies past the gap is dropped from the log:
        those inputs are read and logged anew, and nothing the sink has depends on them."""
        cut = restore["cut"] if restore else 0
        order, damaged = self.input_log.read_checked(after=cut)
        if damaged is None:
            return order
        have = [sn for sn in (self._last_sn, self.sink.committed() if self._exactly_once
                              else None) if sn is not None]
        needed = max(have)[0] if have else 0
        if cut + len(order) < needed:
            raise CheckpointCorrupt(damaged.path, f"{damaged.why}; the sink holds outputs "
                                    f"of input {needed}, the log replays up to input "
                                    f"{cut + len(order)}")
        log.warning("the input log replays up to input %d (%s: %s); nothing the sink holds "
                    "depends on later inputs: they are read and logged anew",
                    cut + len(order), damaged.path, damaged.why)
        self.input_log.drop_after(cut + len(order))
        return order

    # -- life cycle ----------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "FluxJob":
        """Launch the nodes and return once every node registered, built its operators,
        and the data flows (from the last complete checkpoint, when there is one)."""
        check_settings(self.spark, self.nodes + self.standbys)
        if self.distinct_hosts is None:
            self.distinct_hosts = not is_local(self.spark.sparkContext.master)
        self.driver_host = local_host(self.driver_host
                                      or self.spark.conf.get("spark.driver.host", ""))
        self._launch(self._restore)
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name="flux-supervisor")
        self._supervisor.start()
        try:
            # once the data flows, an error it meets (an operator raising on the first
            # records) is ``wait``'s to raise, not ``start``'s, however soon it comes
            started = self.wait_until(lambda: self._feed is not None, timeout,
                                      errors_first=False)
        except BaseException:
            self._close_sockets()
            raise
        if not started:
            c = self.controller
            missing = [n for n in self.topology.nodes if n not in c.registered]
            building = [n for n in self.topology.nodes if n in c.registered and n not in c.ready]
            self.stop()
            raise TimeoutError(
                f"the {self.nodes} nodes were not all running within {timeout}s: "
                f"{', '.join(missing) or 'none'} not registered (too few Spark task slots?), "
                f"{', '.join(building) or 'none'} still building their operators")
        return self

    def _launch(self, restore: Optional[dict]) -> None:
        """One attempt of the job: the driver's sockets, the controller, the Spark tasks;
        ``restore``: the manifest of the checkpoint the nodes and the ingress start from."""
        self._stop = threading.Event()
        self._ending = threading.Event()  # set once a restart ends this attempt
        self._threads = []
        self._loops = {}
        self._feed = self._egress = None
        self._named, self._enough_since = False, None
        self._restored = restore
        self.group = f"flux-{self.secret[:8]}-{len(self.restart_log)}"
        config = self.config
        # the ingress process starts first: it imports while the driver's sockets open
        self._ingress_process = IngressProcess(dict(
            dataflow=config.dataflow, partitions=self.nodes, capacity=config.capacity,
            batch_size=config.batch_size, replication=config.replication,
            window=config.window, inc=DRIVER_INCS[INGRESS_PROCESS], host=self.driver_host,
            keys=config.keys, ports=config.ports, flush_delay=config.flush_delay))
        self.ctx = zmq.Context()
        keys = self.config.keys
        self.transports = {n: Transport(self.ctx, n, inc, host=self.driver_host, keys=keys,
                                        ports=self.config.ports)
                           for n, inc in DRIVER_INCS.items() if n != INGRESS_PROCESS}
        self.controller = ControllerService(
            self.transports[CONTROLLER_PROCESS], self.detect_after, secret=self.secret,
            name_for=self._name_for, events=self.metrics.events,
            on_snapshot=self.checkpoints.snapshot_written if self.checkpoints else None)
        self.controller.add_member(EGRESS_PROCESS, DRIVER_INCS[EGRESS_PROCESS],
                                   self.transports[EGRESS_PROCESS].address)
        try:
            address = self._ingress_process.wait_hello(timeout=60)
        except BaseException:
            self._close_sockets()
            raise
        self.controller.add_member(INGRESS_PROCESS, DRIVER_INCS[INGRESS_PROCESS], address)
        self.config = replace(self.config.with_controller(
            self.transports[CONTROLLER_PROCESS].address),
            restore=restore["checkpoint"] if restore else -1)
        self.topology = self.config.topology()
        if self.endpoint is not None:
            self.endpoint.collector.controller = self.controller
        elif self.metrics_port is not None:
            self.endpoint = self._endpoint()
        self._spawn(self._run_spark)
        self._spawn(self._run_controller)

    def _endpoint(self):
        from flux.runtime.metrics_endpoint import JobCollector, MetricsEndpoint

        collector = JobCollector(
            self.metrics, self.controller, [s.name for s in self.dataflow.stages],
            self.driver_stats)
        try:
            return MetricsEndpoint(collector, self.metrics_port, self.metrics_addr).start()
        except BaseException:
            self._close_sockets()
            raise

    def driver_stats(self) -> list:
        """The counters of the ingress (as its process last reported them) and the
        egress, as a segment's (issue 12)."""
        feed, egress = self._feed, self._egress
        return [s for s in (feed.stats if feed is not None else None,
                            egress.stats() if egress is not None else None) if s is not None]

    @property
    def ingress_pid(self) -> Optional[int]:
        """The process the ingress runs in (this attempt's), or None before it starts."""
        return self._ingress_process.pid if self._ingress_process is not None else None

    def _close_sockets(self) -> None:
        """Close the driver's sockets and stop the ingress process."""
        if self._ingress_process is not None:
            self._ingress_process.stop()
        for t in self.transports.values():
            t.close()
        if not self.ctx.closed:
            self.ctx.term()

    @property
    def metrics_url(self) -> Optional[str]:
        """Where Prometheus scrapes this job (``metrics_port``), or None."""
        return self.endpoint.url if self.endpoint is not None else None

    def _spawn(self, target) -> None:
        t = threading.Thread(target=self._guard, args=(target, self._ending), daemon=True)
        self._threads.append(t)
        t.start()

    def _guard(self, target, ending: threading.Event) -> None:
        try:
            target()
        except BaseException as exc:  # surfaced by wait_until and stop, or a restart
            if ending.is_set():  # an attempt ended for a restart: its Spark job cancelled
                log.info("an ended attempt's thread stopped: %s", describe(exc))
                return
            if self._restartable(exc):
                self._restart_due = exc
            else:
                self.errors.append(exc)
            self._stop.set()

    def _restartable(self, exc: BaseException) -> bool:
        """A lost pair, or the ingress's process lost, restarts the job from its last
        checkpoint (DESIGN 10), a bounded number of times; nothing else does (an
        operator's error would come again)."""
        return (isinstance(exc, (PairLost, IngressLost)) and self.checkpoints is not None
                and self.restarts_left > 0 and not self._stopping.is_set()
                and self._restart_due is None)

    def _supervise(self) -> None:
        """Restart the job when an attempt ended on a lost pair, until it is stopped."""
        while not self._stopping.is_set():
            if self._restart_due is None:
                time.sleep(0.01)
                continue
            try:
                self._restart(self._restart_due)
            except BaseException as exc:
                log.exception("the restart failed")
                self.errors.append(exc)
                return
            finally:
                self._restart_due = None

    def _restart(self, why: BaseException) -> None:
        """Stop this attempt (its tasks, threads and sockets) and launch the next one from
        the last complete checkpoint, or from the first input without one (DESIGN 10).
        What the sink holds stays: outputs after the cut come again with the same SNs and
        are dropped up to the last one handed to it."""
        self.restarts_left -= 1
        now = time.monotonic()
        log.warning("restarting the job (%d restarts left): %s", self.restarts_left, why)
        self._end_attempt(JOB_STOPPED, timeout=0.5)
        log.info("the old attempt ended in %.2fs", time.monotonic() - now)
        if self._exactly_once and self._last_sn is not None and (
                self.sink.committed() is None or self._last_sn > self.sink.committed()):
            self.sink.commit(self._last_sn)  # what it has is the failure-free prefix
        self.checkpoints.settle()
        # the store is the truth: a checkpoint the coordinator completed may have failed
        # to get its manifest written, and one whose files do not verify is passed over
        # for the one before (CheckpointCorrupt when none is left)
        restore = self.checkpoints.store.latest()
        latest = restore["checkpoint"] if restore is not None else None
        self.checkpoints.coordinator.restarted(latest)
        if self.input_log is not None:
            self._replay = self._plan_replay(restore)
        self.restart_log.append((now, latest, str(why)))
        self.metrics.events.append((now, "restart", latest))
        self._launch(restore)

    def _end_attempt(self, reason: str, timeout: float) -> None:
        """Tell the attempt's nodes to stop, end its Spark tasks and threads, close its
        sockets."""
        self._ending.set()
        self._stop.set()
        for t in self._threads[1:]:
            t.join(timeout=10)
        c = self.controller
        c.stop_all(reason)
        c.started = False
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            c.turn(20)  # the stops leave
        spark_thread = self._threads[0]
        spark_thread.join(timeout=timeout)
        if spark_thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self.group)
            spark_thread.join(timeout=30)
        self._close_sockets()

    def _run_spark(self) -> None:
        sc = self.spark.sparkContext
        sc.setJobGroup(self.group, "flux nodes", interruptOnCancel=True)
        config, total = self.config, self.nodes + self.standbys
        rdd = sc.parallelize(range(total), total)
        self.task_results = rdd.mapPartitionsWithIndex(
            lambda index, _: node_main(index, config)).collect()

    def _name_for(self, reg: Register) -> Optional[str]:
        """Until every task is named, a registration waits (``_name_tasks``); after, every
        attempt joins as a standby. A retried task's earlier attempt is dead: forgotten."""
        if self._named:
            return standby_name(reg.inc)
        pending = self.controller.pending
        for key in [k for k in pending if k[0] == reg.task and k[1] < reg.inc]:
            del pending[key]
        if any(t == reg.task and i > reg.inc for t, i in pending):
            return None  # a late message of an attempt already replaced
        return PENDING

    def _ready_to_name(self) -> bool:
        """Every node and standby task registered, or every node and the standbys were
        given ``STANDBY_GRACE`` seconds more (a standby's slot may come later)."""
        waiting = len(self.controller.pending)
        if waiting >= self.nodes + self.standbys:
            return True
        if waiting < self.nodes:
            self._enough_since = None
            return False
        now = time.monotonic()
        self._enough_since = self._enough_since or now
        # a restart or a resumed job does not wait for its standbys: they join the running
        # job as they come (its output has waited long enough)
        grace = 0.0 if self.restart_log or self._restore else STANDBY_GRACE
        return now - self._enough_since >= grace

    def _name_tasks(self) -> None:
        """Name the registered tasks: the nodes such that no pair shares a host (when
        ``distinct_hosts``; otherwise task k's attempt is node k), the others standbys."""
        c = self.controller
        regs = sorted(c.pending.values(), key=lambda r: (r.task, r.inc))
        if self.distinct_hosts:
            try:
                chosen = assign_hosts(self.config.placement(),
                                      [(i, r.host) for i, r in enumerate(regs)])
            except PlacementError as exc:
                c.error = exc
                return
        else:
            chosen = dict(enumerate(range(self.nodes)))
        nodes = self.topology.nodes
        for node, i in sorted(chosen.items()):
            c.admit(regs[i], nodes[node])
        for i in sorted(set(range(len(regs))) - set(chosen.values())):
            c.admit(regs[i], standby_name(regs[i].inc))
        self._named = True
        if self.distinct_hosts:
            log.info("nodes placed on hosts: %s", ", ".join(
                f"{n} {c.hosts[n]}" for n in nodes))

    def _run_controller(self) -> None:
        """The only thread that touches the controller's socket."""
        c = self.controller
        told = announced = False
        nodes = self.topology.nodes
        while not self._stop.is_set():
            c.turn(5)
            if self._stopping.is_set() and not told:
                c.stop_all(JOB_STOPPED)
                c.started = False  # stopped workers fall silent on purpose: no detection
                told = True
            elif not told and not c.started:
                # three steps: every task registered -> named (no pair on a host); every
                # node named -> where everyone listens (a node builds its operators once it
                # knows); every node built (Ready) -> the data starts
                if not self._named and self._ready_to_name():
                    self._name_tasks()
                if not announced and all(n in c.registered for n in nodes):
                    c.announce()
                    announced = True
                if announced and all(n in c.ready for n in nodes):
                    self._begin()
            if c.error is not None:
                raise c.error

    def _begin(self) -> None:
        """Every node registered and built its operators: the topology is known; start
        recovery and the data."""
        c = self.controller
        standbys = [n for n in c.registered if n not in self.topology.index_of]
        self.topology = topology = self.config.topology(dict(c.incarnations), standbys)
        c.begin(Recovery(topology, dict(c.hosts) if self.distinct_hosts else None))
        log.info("every node is built (%s; standbys %s): the data starts" + (
            f" (restart {len(self.restart_log)}, from checkpoint "
            f"{self._restored['checkpoint'] if self._restored else None})"
            if self.restart_log else ""),
                 ", ".join(topology.nodes), ", ".join(standbys) or "none")
        # what the driver built so far (Spark's and py4j's objects, the dataflow) lives as
        # long as the job: out of the collector's way, a full collection stays short
        gc.freeze()
        if self.metrics.t0 is None:
            self.metrics.begin()
        else:  # a restart: when its data starts again
            self.metrics.events.append((time.monotonic(), "data starts",
                                        self._restored["checkpoint"] if self._restored else None))
        egress = self.builder.egress()
        self._egress = egress
        source = self.source
        accepted = logged_before = 0
        if self.checkpoints is not None:
            # the inputs after the checkpoint's cut come again, numbered as before
            restore = self._restored
            source.open(restore["source"] if restore else self._start_position)
            accepted = restore["cut"] if restore else 0
            self.metrics.renumber(accepted)
            self._cut_at = time.monotonic() + self.checkpoint_interval
            if self.input_log is not None:  # in the order they had (DESIGN 10)
                order = self._replay
                source.replay(order)
                logged_before = accepted + len(order)
                if self._log_writer is not None:
                    self._log_writer.stop()
                self._log_writer = InputLogWriter(self.input_log)
                log.info("the input log replays inputs %d to %d in their logged order",
                         accepted + 1, logged_before)
                self.metrics.events.append((time.monotonic(), "input log replay",
                                            (accepted + 1, logged_before)))
        # the ingress runs in its own process; this driver reads the source and feeds it
        self._ingress_process.send(BEGIN, dict(
            where=topology.where, addresses=dict(c.addresses),
            incarnations=dict(c.incarnations), peer_incs=topology.peer_incs(),
            accepted=accepted))
        feed = IngressFeed(self._ingress_process, iter(source), self.metrics, accepted,
                           input_log=self._log_writer, logged_before=logged_before)
        host = Host(EGRESS_PROCESS, {egress.addr: egress}, DRIVER_INCS[EGRESS_PROCESS],
                    peer_incs=topology.peer_incs())
        loop = HostLoop(host, self.transports[EGRESS_PROCESS], topology.where,
                        dict(c.addresses), self._on_effect, None, dict(c.incarnations),
                        metrics=self.metrics, flush_delay=self.config.flush_delay)
        self._loops[EGRESS_PROCESS] = loop
        self._spawn(lambda: self._drive_egress(loop))
        self._spawn(lambda: self._feed_ingress(feed))
        self._feed = feed

    def finished(self) -> bool:
        """Every input's output was delivered (and handed to the sink)."""
        return self._finished.is_set()

    def _check_finished(self) -> None:
        """Run by the egress's thread between its turns, never concurrently with one: the
        source is exhausted and the egress's progress bound covers the last input, so no
        output can still come (DESIGN 4.3), and every output released by the merge has
        been delivered. (Asked from another thread, the merge could already be empty while
        its last ``Deliver`` was still on its way to ``delivered``.)"""
        feed = self._feed
        if feed is None or not feed.source_done:
            return  # source_done is set after the last read: then ``read`` is final
        if self._egress.finished(feed.read):
            self._finished.set()

    def wait(self, timeout: float) -> List[Any]:
        """Wait until every input's output was delivered; returns the output, in order
        (when kept: ``keep_output``; else an empty list, the sink has it)."""
        if not self.wait_until(self.finished, timeout):
            raise TimeoutError(f"the job did not finish in {timeout}s "
                               f"({self.metrics.output_total} outputs so far)")
        return list(self.delivered)

    def _drive_egress(self, loop: HostLoop) -> None:
        stop = self._stop
        while not stop.is_set():
            loop.turn(5)
            if loop.stopped not in (None, JOB_STOPPED):  # the driver's end has no twin
                raise RuntimeError(f"{loop.host.name}: {loop.stopped}")
            self.metrics.settled(self._egress.settled())
            if not self._finished.is_set():
                self._check_finished()

    def _feed_ingress(self, feed: IngressFeed) -> None:
        """The source's thread: read it, feed the ingress process, choose the cuts."""
        cuts, stop = self.checkpoints is not None, self._stop
        try:
            while not stop.is_set():
                feed.step(5)
                if cuts:
                    self._maybe_cut(feed)
                    self._report_offsets()
        finally:
            feed.process.stop()

    def _maybe_cut(self, feed: IngressFeed) -> None:
        """The source's thread: every ``checkpoint_interval`` seconds (when inputs came
        since the last), checkpoint the job at a cut after the last input handed over."""
        now = time.monotonic()
        if now < self._cut_at:
            return
        self._cut_at = now + self.checkpoint_interval
        if not feed.has_new_inputs():
            return  # nothing new since the last cut
        number = self._next_checkpoint
        self._next_checkpoint += 1
        cut, position = feed.choose_cut(number)
        self.checkpoints.cut_chosen(number, cut, position)

    def _report_offsets(self) -> None:
        """The source's thread (the source is its own): a source that reports positions
        elsewhere (Kafka's consumer group, for lag monitoring) hears each complete
        checkpoint's, never one of inputs not yet covered by a checkpoint."""
        latest = self.checkpoints.latest
        report = getattr(self.source, "commit_offsets", None)
        if latest is None or report is None or latest.number == self._offsets_reported:
            return
        self._offsets_reported = latest.number
        try:
            report(latest.source)
        except Exception as exc:  # monitoring only: the checkpoint is the truth
            log.warning("could not report checkpoint %d's source position: %s",
                        latest.number, exc)

    def _on_effect(self, e) -> None:
        if isinstance(e, Deliver):
            items = e.items
            if self._last_sn is not None and tuple(items[0][0]) <= self._last_sn:
                last = self._last_sn  # after a restart: given to the sink already
                items = tuple(it for it in items if tuple(it[0]) > last)
                if not items:
                    return
            self._last_sn = tuple(items[-1][0])
            if self.keep_output:
                self.delivered.extend(items)
            self.metrics.outputs([sn for sn, _ in items])
            if self._exactly_once:
                self.sink.write(items)
            elif self.sink is not None:
                for item in items:
                    self.sink(item)
        elif isinstance(e, SinkCommit) and self.checkpoints is not None:
            self._commit_at_cut(e.number)

    def _commit_at_cut(self, number: int) -> None:
        """The egress passed checkpoint ``number``'s cut: the sink makes durable what it
        has (an exactly-once sink commits; a callable has it already) and says so."""
        if self._exactly_once:
            committed = self.sink.committed()
            if self._last_sn is not None and (committed is None or self._last_sn > committed):
                self.sink.commit(self._last_sn)
            self.checkpoints.sink_committed(number, self.sink.committed())
        else:
            self.checkpoints.sink_committed(number, self._last_sn)

    def wait_until(self, predicate: Callable[[], bool], timeout: float,
                   errors_first: bool = True) -> bool:
        """Wait until ``predicate`` holds; raises the job's error if it has one (before
        the predicate is asked, unless ``errors_first`` is False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not errors_first and predicate():
                return True
            if self.errors:
                raise self.errors[0]
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def kill_node(self, name: str, how: str = "worker") -> None:
        """SIGKILL the Python worker of ``name`` (a process crash) or its executor JVM
        (a machine crash)."""
        if how not in ("worker", "executor"):
            raise ValueError(f"how must be 'worker' or 'executor', got {how!r}")
        boot = self.controller.boots.get(name, "")
        if boot and boot != boot_id():
            raise RuntimeError(f"{name} runs on {self.controller.hosts.get(name)}, under another "
                               f"kernel: kill_node signals processes of this machine only")
        pid, jvm = self.controller.pids(name)
        log.warning("killing %s: SIGKILL to its %s (pid %d)", name,
                    "Python worker" if how == "worker" else "executor JVM",
                    pid if how == "worker" else jvm)
        self.metrics.events.append((time.monotonic(), "killed", f"{name} ({how})"))
        os.kill(pid if how == "worker" else jvm, signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every task and thread this job started, then close every socket."""
        self._stopping.set()
        if not self._threads:  # never started: only the checkpoint service's thread runs
            if self.checkpoints is not None:
                self.checkpoints.stop()
            return
        if self._supervisor is not None:
            self._supervisor.join(timeout=120)  # a restart under way ends first
        spark_thread = self._threads[0]
        # a failed job's controller tells no one to stop: cancel the tasks at once
        spark_thread.join(timeout=0.0 if self.errors else timeout)
        if spark_thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self.group)
            spark_thread.join(timeout=timeout)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._close_sockets()
        if self.endpoint is not None:
            self.endpoint.stop()
        self._close_owned()

    def _close_owned(self) -> None:
        """Close what the job owns besides its tasks and sockets: the sink, the
        checkpoint service's thread, the input log's writer."""
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()
        if self.checkpoints is not None:
            self.checkpoints.stop()
        if self._log_writer is not None:
            self._log_writer.stop()

    def __enter__(self) -> "FluxJob":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
