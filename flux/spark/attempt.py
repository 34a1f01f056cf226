"""One attempt of a job: the driver's sockets, the controller, the Spark tasks, the data.

A job runs one attempt at a time; a restart from a checkpoint ends the attempt (its
tasks, threads, sockets and ingress process) and launches the next (DESIGN 10). An
attempt starts in three steps, each once the one before is done: every task registered
and named (no pair on one host), every node told where everyone listens (a node then
builds its operators), every node built; then the data starts: the ingress process is
told where the first stage lives, the source's thread feeds it, and the egress's
thread delivers the outputs. Each thread runs guarded: an error ends the attempt and
goes to ``on_error``, which decides between a restart and the job's end.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional

import zmq

from exchange.group_map import maps_from_config, maps_to_config
from controller.recovery import Recovery
from flux.protocol.builder import MachineBuilder
from flux.control_messages import JOB_STOPPED, IngressEnded, SplitCutPassed
from flux.effects import Deliver, SinkCommit
from flux.protocol.host import Host
from flux.dataflow import operator_names
from flux.operator import describe
from flux.runtime.config import NodeConfig
from flux.runtime.controller_service import ControllerService
from flux.runtime.ingress_process import IngressProcess
from flux.runtime.loop import HostLoop
from flux.runtime.metrics import Metrics
from flux.runtime.restore import dormant_start
from flux.runtime.transport import Transport
from flux.spark.driver_checkpoints import DriverCheckpoints
from flux.spark.node_task import node_main
from flux.spark.output import OutputWriter
from flux.spark.driver_ingress import feed_ingress, start_feed, start_ingress_process
from flux.spark.set_rebuild import SetRebuild
from flux.spark.split_watch import SplitWatch
from flux.spark.task_naming import TaskNaming
from flux.spark.verify_cuts import EpochVerifyCuts
from flux.spark.writer_watch import WriterWatch
from controller.topology import CONTROLLER_PROCESS, EGRESS_PROCESS, INGRESS_PROCESS

log = logging.getLogger(__name__)

#: incarnations of the driver-side processes: never a Spark taskAttemptId (those are >= 0)
DRIVER_INCS = {CONTROLLER_PROCESS: -3, INGRESS_PROCESS: -1, EGRESS_PROCESS: -2}


@dataclass(frozen=True)
class JobParts:
    """What every attempt of a job shares (built once by ``FluxJob``)."""

    spark: Any
    config: NodeConfig  # without the controller's address: each attempt adds its own
    builder: MachineBuilder
    metrics: Metrics
    output: OutputWriter
    checkpoints: Optional[DriverCheckpoints]
    source: Any
    nodes: int
    standbys: int
    detect_after: float
    driver_host: str
    distinct_hosts: bool
    #: set when the user stops the job: the controller tells every node
    stopping: threading.Event
    #: set once every input's output was delivered
    finished: threading.Event
    #: what a pair's digests that disagree do (DESIGN 14), and without checkpoints the
    #: seconds between the cuts they are compared at (None: none)
    on_divergence: str = "fail"
    verify_interval: Optional[float] = None
    #: may the job restart once more (a lost replica set under cluster pairs asks)
    may_restart: Callable[[], bool] = lambda: False


def driver_builder(dataflow, config: NodeConfig) -> MachineBuilder:
    """The protocol machines the driver's side of an attempt builds (the ingress's router,
    the egresses), at ``config``'s partitions and routing."""
    builder = MachineBuilder(dataflow, config.partitions, config.capacity, config.batch_size,
                             replication=config.replication, window=config.window,
                             batch_rows=config.batch_rows,
                             ordered_output=config.ordered_output,
                             pause_room=config.pause_room, key_groups=config.key_groups)
    builder.groups = maps_from_config(config.group_maps, config.partitions)
    builder.dormant = config.dormant
    return builder


class Attempt(TaskNaming):
    def __init__(self, parts: JobParts, number: int, restored: Optional[dict],
                 on_error: Callable[[BaseException], None]):
        """``number``: restarts before this attempt; ``restored``: the manifest of the
        checkpoint its nodes and ingress start from (None: the first input)."""
        self.parts, self.number, self.restored, self.on_error = parts, number, restored, on_error
        self.stop_event = threading.Event()
        self.ending = threading.Event()  # set once a restart ends this attempt
        self.threads: List[threading.Thread] = []
        self.task_results: List[Any] = []
        self.feed, self.egresses = None, []  # an ``IngressFeed`` once started; egresses here
        self.writers = WriterWatch(parts.config.partitions, parts.checkpoints and  # executors
                                   parts.checkpoints.service.sink_committed)
        self.ingress_process: Optional[IngressProcess] = None
        self.transports: Dict[str, Transport] = {}
        self._named, self._enough_since = False, None
        self.group = f"flux-{parts.config.secret[:8]}-{number}"
        #: the pairs this attempt runs from its start (the others dormant; ``launch``)
        self._running = parts.nodes
        self.egress_loop: Optional[HostLoop] = None  # the driver's egresses' loop, if any
        self.config, self.topology = parts.config, parts.config.topology()
        self.set_rebuild = SetRebuild.of(parts)  # cluster pairs: a lost set, rebuilt
        #: a split source's ingresses on the nodes, as their reports say (None: the
        #: driver's; set at the launch, on this run's epoch clock)
        self.split_watch: Optional[SplitWatch] = None

    # -- launch -----------------------------------------------------------------------
    def launch(self) -> None:
        """The ingress process (first: it imports while the driver's sockets open), the
        driver's sockets, the controller, the Spark tasks."""
        p, config = self.parts, self.parts.config
        # where the nodes start (the splits' logs read first: a damaged one stops here)
        settings = p.checkpoints.node_settings(config.epoch_origin, time.time()) \
            if p.checkpoints else {}
        # where live moves moved keys, and the pairs that run (the others are dormant)
        maps, running = dormant_start(self.restored, config.partitions, config.running,
                                      config.key_groups, config.stages)
        config = replace(config, group_maps=maps_to_config(maps), running=running)
        self._running = running or config.partitions
        if not config.splits:  # else ingresses on the nodes read the splits
            self.ingress_process = start_ingress_process(p, DRIVER_INCS[INGRESS_PROCESS], config)
        self.ctx = zmq.Context()
        try:  # whatever fails from here on, the ingress process and the sockets go with it
            for n, inc in DRIVER_INCS.items():
                if n != INGRESS_PROCESS:  # one by one: those opened close if a later one fails
                    self.transports[n] = Transport(self.ctx, n, inc, host=p.driver_host,
                                                   keys=config.keys, ports=config.ports)
            self.controller = ControllerService(
                self.transports[CONTROLLER_PROCESS], p.detect_after, secret=config.secret,
                name_for=self._name_for, events=p.metrics.events,
                on_snapshot=p.checkpoints.service.snapshot_written if p.checkpoints else None,
                on_data_report=self._data_report, on_divergence=p.on_divergence,
                operator_names=operator_names(p.builder.dataflow))
            self.controller.add_member(EGRESS_PROCESS, DRIVER_INCS[EGRESS_PROCESS],
                                       self.transports[EGRESS_PROCESS].address)
            if p.checkpoints:  # the egresses told each complete checkpoint (live moves)
                p.checkpoints.tell_done(self.controller.checkpoint_done)
                p.checkpoints.count_running(lambda: self.running)
            if self.ingress_process is not None:
                address = self.ingress_process.wait_hello(timeout=60)
                self.controller.add_member(INGRESS_PROCESS, DRIVER_INCS[INGRESS_PROCESS],
                                           address)
        except BaseException:
            self.close_sockets()
            raise
        self.config = replace(config.with_controller(
            self.transports[CONTROLLER_PROCESS].address),
            restore=self.restored["checkpoint"] if self.restored else -1, **settings)
        self.topology = self.config.topology()
        if config.splits:
            cuts = p.checkpoints or (EpochVerifyCuts(p.verify_interval, config.epoch_interval)
                                     if p.verify_interval else None)
            self.split_watch = SplitWatch(config.splits, self.config.epoch_origin,
                                          config.epoch_interval, cuts=cuts)

    @property
    def running(self) -> int:
        """The pairs running now: those the attempt started with and those it started
        since (dormant ones joined, ``flux.spark.job_growth``), but those that left."""
        rec = self.controller.recovery
        if rec is None:
            return self._running
        return len((set(range(self._running)) | rec.joined) - rec.left)

    def lagging(self, view: int) -> List[str]:
        """The live processes that have not applied ``view`` whole yet: the workers, as
        the controller heard them, and the driver's ingress process and egresses."""
        late = self.controller.lagging(view)
        if self.ingress_process is not None and (self.feed is None or self.feed.view < view):
            late.append(INGRESS_PROCESS)
        if self.egress_loop is not None and self.egress_loop.view_applied < view:
            late.append(EGRESS_PROCESS)
        return late

    def _data_report(self, msg) -> None:
        """The controller's thread: a node's report of the data's progress."""
        if isinstance(msg, (IngressEnded, SplitCutPassed)):
            if self.split_watch is not None:
                self.split_watch.report(msg)
        else:
            self.writers.report(msg)

    def run(self) -> None:
        """Start the Spark tasks and the controller's thread."""
        self._spawn(self._run_spark)
        self._spawn(self._run_controller)

    def _spawn(self, target) -> None:
        t = threading.Thread(target=self._guard, args=(target,), daemon=True)
        self.threads.append(t)
        t.start()

    def _guard(self, target) -> None:
        try:
            target()
        except BaseException as exc:  # a restart, or the job's error (``on_error``)
            if self.ending.is_set():  # ended for a restart: its Spark job cancelled
                log.info("an ended attempt's thread stopped: %s", describe(exc))
                return
            self.on_error(exc)
            self.stop_event.set()

    def _run_spark(self) -> None:
        sc = self.parts.spark.sparkContext
        sc.setJobGroup(self.group, "flux nodes", interruptOnCancel=True)
        config, total = self.config, self._running + self.parts.standbys
        rdd = sc.parallelize(range(total), total)
        self.task_results = rdd.mapPartitionsWithIndex(
            lambda index, _: node_main(index, config)).collect()

    # -- the controller's thread ------------------------------------------------------
    def _run_controller(self) -> None:
        """The only thread that touches the controller's socket."""
        c = self.controller
        told = announced = False
        nodes = self.topology.nodes
        while not self.stop_event.is_set():
            c.turn(5)
            if self.parts.stopping.is_set() and not told:
                c.stop_all(JOB_STOPPED)
                c.started = False  # stopped workers fall silent on purpose: no detection
                told = True
            elif not told and not c.started:
                # every task registered -> named (no pair on a host); every node named ->
                # where everyone listens (a node builds its operators once it knows);
                # every node built (Ready) -> the data starts
                if not self._named and self._ready_to_name():
                    self._name_tasks()
                if not announced and all(n in c.registered for n in nodes):
                    c.announce()
                    announced = True
                if announced and all(n in c.ready for n in nodes):
                    self._begin()
            if c.error is not None:
                raise c.error
            if c.started and self.split_watch is not None:  # counts, cuts
                self.split_watch.turn(c.node_stats, self.parts.metrics, c.tell_all)
            if c.started and self.set_rebuild is not None:
                self.set_rebuild.check(c.recovery)  # raises ReplicaSetLost when due

    def _begin(self) -> None:
        """Every node registered and built its operators: start recovery and the data."""
        p, c = self.parts, self.controller
        standbys = [n for n in c.registered if n not in self.topology.index_of]
        self.topology = topology = self.config.topology(dict(c.incarnations), standbys)
        c.begin(Recovery(topology, dict(c.hosts) if p.distinct_hosts else None,
                         writers=topology.writers))
        restored = self.restored["checkpoint"] if self.restored else None
        log.info("every node is built (%s; standbys %s): the data starts%s",
                 ", ".join(topology.nodes), ", ".join(standbys) or "none",
                 f" (restart {self.number}, from checkpoint {restored})" if self.number else "")
        # what the driver built so far (Spark's and py4j's objects, the dataflow) lives as
        # long as the job: out of the collector's way, a full collection stays short
        gc.freeze()
        if p.metrics.t0 is None:
            p.metrics.begin()
        else:  # a restart: when its data starts again
            p.metrics.events.append((time.monotonic(), "data starts", restored))
        # the egresses here, or none: each a sink's writer on a node (egress_on_executors)
        # (built at this attempt's pairs: those a restart leaves dormant are, here too)
        self.egresses = egresses = [] if topology.writers else \
            driver_builder(p.builder.dataflow, self.config).egresses()
        if self.split_watch is not None:  # ingresses on the nodes: nothing to feed here
            self.feed = self.split_watch
            p.metrics.time_by_epochs(self.split_watch.input_time)
        else:
            self.feed = start_feed(p, self.ingress_process, c, topology)
        if topology.writers:
            self._spawn(lambda: self.writers.watch(self.stop_event, p.metrics, p.finished,
                                                   lambda: self.feed))
        else:
            host = Host(EGRESS_PROCESS, {e.addr: e for e in egresses},
                        DRIVER_INCS[EGRESS_PROCESS], peer_incs=topology.peer_incs())
            loop = HostLoop(host, self.transports[EGRESS_PROCESS], topology.where,
                            dict(c.addresses), self._on_effect, None, dict(c.incarnations),
                            metrics=p.metrics, flush_delay=self.config.flush_delay)
            self.egress_loop = loop
            self._spawn(lambda: self._drive_egress(loop))
        if self.split_watch is None:
            self._spawn(lambda: feed_ingress(p, self.feed, self.stop_event))

    # -- the data's threads -----------------------------------------------------------
    def _drive_egress(self, loop: HostLoop) -> None:
        stop, p = self.stop_event, self.parts
        while not stop.is_set():
            loop.turn(5)
            if loop.stopped not in (None, JOB_STOPPED):  # the driver's end has no twin
                raise RuntimeError(f"{loop.host.name}: {loop.stopped}")
            p.metrics.settled(min(e.settled() for e in self.egresses))
            if not p.finished.is_set():
                self._check_finished()

    def _check_finished(self) -> None:
        """Run by the egress's thread between its turns, never concurrently with one (else
        the merge could be empty while its last ``Deliver`` is on its way to the sink): the
        source is exhausted and the egress's bound covers the last input, so no output can
        still come (DESIGN 4.3), and every output released by the merge was delivered."""
        feed = self.feed  # source_done is set after the last read: then ``read`` is final
        if feed is not None and feed.source_done and all(
                e.finished(feed.read) for e in self.egresses):
            self.parts.finished.set()

    def _on_effect(self, e) -> None:
        p = self.parts
        if isinstance(e, Deliver):
            p.output.deliver(e.items, e.partition)
        elif isinstance(e, SinkCommit) and p.checkpoints is not None:
            # past checkpoint ``number``'s cut: the sink makes durable what it has, says so
            p.checkpoints.service.sink_committed(e.number, p.output.commit(e.partition),
                                                 e.partition)

    # -- the end ----------------------------------------------------------------------
    def end(self, reason: str, timeout: float) -> None:
        """For a restart: tell the nodes to stop, end the Spark tasks and the threads,
        close the sockets."""
        self.ending.set()
        self.stop_event.set()
        for t in self.threads[1:]:
            t.join(timeout=10)
        c = self.controller
        c.stop_all(reason)
        c.started = False
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            c.turn(20)  # the stops leave
        self._end_tasks(timeout)
        self.close_sockets()

    def stop(self, timeout: float, at_once: bool) -> None:
        """The job's end: its controller has told the nodes (``stopping``); wait for the
        tasks (cancel them at once after an error: no one told them), then the threads."""
        self._end_tasks(0.0 if at_once else timeout, then=timeout)
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=10)
        self.close_sockets()

    def _end_tasks(self, timeout: float, then: float = 30.0) -> None:
        spark_thread = self.threads[0]
        spark_thread.join(timeout=timeout)
        if spark_thread.is_alive():
            self.parts.spark.sparkContext.cancelJobGroup(self.group)
            spark_thread.join(timeout=then)

    def close_sockets(self) -> None:
        """Close the driver's sockets and stop the ingress process."""
        if self.ingress_process is not None:
            self.ingress_process.stop()
        for t in self.transports.values():
            t.close()
        if not self.ctx.closed:
            self.ctx.term()

    def driver_stats(self) -> list:
        """The ingress's counters (as its process last reported them) and the egresses'."""
        stats = [self.feed.stats] if self.feed is not None else []
        stats += [e.stats() for e in self.egresses]
        return [s for s in stats if s is not None]
