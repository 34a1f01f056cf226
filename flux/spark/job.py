"""Deploy a Flux dataflow on a SparkSession: nodes as long-running Spark tasks.

The driver runs the controller, the ingress and the egress (threads with
sockets of their own); ``nodes + standbys`` Spark tasks run ``node_main``.
When a node's process dies, Spark re-runs its task and the new attempt
registers as a fresh standby (DESIGN 6). ``stop()`` stops every task and
thread it started and closes every socket.
"""
from __future__ import annotations

import gc
import logging
import os
import secrets
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import zmq
from pyspark import cloudpickle

from controller.hosts import PlacementError, assign_hosts
from controller.recovery import Recovery
from flux.builder import REPLICATIONS, MachineBuilder
from flux.control_messages import JOB_STOPPED, Register
from flux.dataflow import check_state_round_trip
from flux.effects import Deliver
from flux.errors import DataflowError
from flux.host import Host
from flux.operator import OperatorRaised, describe
from flux.runtime.config import NodeConfig
from flux.runtime.controller_service import PENDING, ControllerService
from flux.runtime.loop import HostLoop
from flux.runtime.metrics import Metrics
from flux.runtime.network import boot_id, local_host
from flux.runtime.sources import peek
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
    serialize or ``install_state`` does not restore (DESIGN 4.1)."""
    if not sample:
        return  # nothing to check yet; the executors build the operators and report
    try:
        check_state_round_trip(dataflow, sample, partitions)
    except DataflowError:
        raise
    except OperatorRaised as exc:
        raise DataflowError(f"on one of the source's first {len(sample)} records, "
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
                 distinct_hosts: Optional[bool] = None):
        if nodes < 2:
            raise ValueError(f"Flux needs at least 2 nodes (a pair per partition), got {nodes}")
        if standbys < 0:
            raise ValueError(f"standbys must be >= 0, got {standbys}")
        if replication not in REPLICATIONS:
            raise ValueError(f"replication must be one of {REPLICATIONS}, got {replication!r}")
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
        self._ingress = self._egress = None
        self.errors: List[BaseException] = []
        self.config = NodeConfig(
            dataflow=cloudpickle.dumps(dataflow), stages=len(dataflow.stages), partitions=nodes,
            replication=replication, capacity=capacity, batch_size=batch_size, window=window,
            heartbeat=heartbeat, lease=lease, chunk_size=chunk_size, flush_delay=flush_delay,
            secret=self.secret, curve=authenticate, ports=ports)
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
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._threads: List[threading.Thread] = []
        self.task_results: List[Any] = []
        self._loops: Dict[str, HostLoop] = {}
        self.group = f"flux-{self.secret[:8]}"

    # -- life cycle ----------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "FluxJob":
        """Launch the nodes and return once every node registered, built its operators,
        and the data flows."""
        check_settings(self.spark, self.nodes + self.standbys)
        if self.distinct_hosts is None:
            self.distinct_hosts = not is_local(self.spark.sparkContext.master)
        self.driver_host = local_host(self.driver_host
                                      or self.spark.conf.get("spark.driver.host", ""))
        self.ctx = zmq.Context()
        keys = self.config.keys
        self.transports = {n: Transport(self.ctx, n, inc, host=self.driver_host, keys=keys,
                                        ports=self.config.ports)
                           for n, inc in DRIVER_INCS.items()}
        self.controller = ControllerService(
            self.transports[CONTROLLER_PROCESS], self.detect_after, secret=self.secret,
            name_for=self._name_for, events=self.metrics.events)
        for name in (INGRESS_PROCESS, EGRESS_PROCESS):
            self.controller.add_member(name, DRIVER_INCS[name], self.transports[name].address)
        self.config = self.config.with_controller(self.transports[CONTROLLER_PROCESS].address)
        if self.metrics_port is not None:
            self.endpoint = self._endpoint()
        self._spawn(self._run_spark)
        self._spawn(self._run_controller)
        try:
            # once the data flows, an error it meets (an operator raising on the first
            # records) is ``wait``'s to raise, not ``start``'s, however soon it comes
            started = self.wait_until(lambda: "ingress" in self._loops, timeout,
                                      errors_first=False)
        except BaseException:
            self.stop()
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

    def _endpoint(self):
        from flux.runtime.metrics_endpoint import JobCollector, MetricsEndpoint

        collector = JobCollector(
            self.metrics, self.controller, [s.name for s in self.dataflow.stages],
            lambda: [m.stats() for m in (self._ingress, self._egress) if m is not None])
        try:
            return MetricsEndpoint(collector, self.metrics_port, self.metrics_addr).start()
        except BaseException:
            for t in self.transports.values():
                t.close()
            self.ctx.term()
            raise

    @property
    def metrics_url(self) -> Optional[str]:
        """Where Prometheus scrapes this job (``metrics_port``), or None."""
        return self.endpoint.url if self.endpoint is not None else None

    def _spawn(self, target) -> None:
        t = threading.Thread(target=self._guard, args=(target,), daemon=True)
        self._threads.append(t)
        t.start()

    def _guard(self, target) -> None:
        try:
            target()
        except BaseException as exc:  # surfaced by wait_until and stop
            self.errors.append(exc)
            self._stop.set()

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
        return now - self._enough_since >= STANDBY_GRACE

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
        log.info("every node is built (%s; standbys %s): the data starts",
                 ", ".join(topology.nodes), ", ".join(standbys) or "none")
        # what the driver built so far (Spark's and py4j's objects, the dataflow) lives as
        # long as the job: out of the collector's way, a full collection stays short
        gc.freeze()
        self.metrics.begin()
        ingress, egress = self.builder.ingress(), self.builder.egress()
        self._ingress, self._egress = ingress, egress
        for name, machine in ((INGRESS_PROCESS, ingress), (EGRESS_PROCESS, egress)):
            host = Host(name, {machine.addr: machine}, DRIVER_INCS[name],
                        peer_incs=topology.peer_incs())
            loop = HostLoop(host, self.transports[name], topology.where, dict(c.addresses),
                            self._on_effect, iter(self.source) if machine is ingress else None,
                            dict(c.incarnations), metrics=self.metrics,
                            flush_delay=self.config.flush_delay)
            self._loops[name] = loop
            self._spawn(lambda loop=loop: self._drive(loop))

    def finished(self) -> bool:
        """Every input's output was delivered (and handed to the sink)."""
        return self._finished.is_set()

    def _check_finished(self) -> None:
        """Run by the egress's thread between its turns, never concurrently with one: the
        source is exhausted and the egress's progress bound covers the last input, so no
        output can still come (DESIGN 4.3), and every output released by the merge has
        been delivered. (Asked from another thread, the merge could already be empty while
        its last ``Deliver`` was still on its way to ``delivered``.)"""
        ingress = self._loops.get(INGRESS_PROCESS)
        if ingress is None or not ingress.source_done:
            return  # source_done is set after the last accept: then ``accepted`` is final
        if self._egress.finished(self._ingress.accepted):
            self._finished.set()

    def wait(self, timeout: float) -> List[Any]:
        """Wait until every input's output was delivered; returns the output, in order
        (when kept: ``keep_output``; else an empty list, the sink has it)."""
        if not self.wait_until(self.finished, timeout):
            raise TimeoutError(f"the job did not finish in {timeout}s "
                               f"({self.metrics.output_total} outputs so far)")
        return list(self.delivered)

    def _drive(self, loop: HostLoop) -> None:
        egress = loop is self._loops.get(EGRESS_PROCESS)
        while not self._stop.is_set():
            loop.turn(5)
            if loop.stopped not in (None, JOB_STOPPED):  # the driver's end has no twin
                raise RuntimeError(f"{loop.host.name}: {loop.stopped}")
            if egress:
                self.metrics.settled(self._egress.settled())
                if not self._finished.is_set():
                    self._check_finished()

    def _on_effect(self, e) -> None:
        if isinstance(e, Deliver):
            if self.keep_output:
                self.delivered.extend(e.items)
            for sn, _ in e.items:
                self.metrics.output(sn)
            if self.sink is not None:
                for item in e.items:
                    self.sink(item)

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
        spark_thread = self._threads[0]
        # a failed job's controller tells no one to stop: cancel the tasks at once
        spark_thread.join(timeout=0.0 if self.errors else timeout)
        if spark_thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self.group)
            spark_thread.join(timeout=timeout)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        for t in self.transports.values():
            t.close()
        self.ctx.term()
        if self.endpoint is not None:
            self.endpoint.stop()
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "FluxJob":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
