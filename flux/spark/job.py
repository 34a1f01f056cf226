"""Deploy a Flux dataflow on a SparkSession: nodes as long-running Spark tasks.

The driver runs the controller and the egress (threads with sockets of their own) and
feeds the ingress, which runs in a process of its own, off the controller's GIL;
``nodes + standbys`` Spark tasks run ``node_main``. When a node's process dies, Spark
re-runs its task and the new attempt registers as a fresh standby (DESIGN 6). A lost
pair (or the ingress process) restarts the job from its last checkpoint: this facade
ends the attempt and launches the next (``flux.spark.attempt``), at most ``restarts``
times. ``stop()`` stops every task and thread and process it started and closes every
socket.

The parts: the options (``flux.spark.options``), one attempt of the tasks and the data
(``flux.spark.attempt``), the outputs into the sink (``flux.spark.output``), the
driver's side of checkpoints (``flux.spark.driver_checkpoints``).
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, List, Optional, Tuple

from pyspark import cloudpickle

from flux.connector_api import SplitSource, replay_order_of
from flux.control_messages import JOB_STOPPED
from flux.deploy_checks import check_batch_api, check_state_round_trip
from flux.reference import input_records
from flux.rescale import check_rescalable
from flux.errors import DataflowError, IngressLost, PairLost
from flux.operator import OperatorRaised, describe
from flux.runtime.config import NodeConfig
from flux.runtime.determinism import check_deterministic
from flux.runtime.metrics import Metrics
from flux.runtime.network import boot_id, local_host
from flux.connectors.sources import peek, replayable
from flux.spark.attempt import Attempt, JobParts, driver_builder
from flux.spark.driver_checkpoints import DriverCheckpoints
from flux.spark.job_growth import PairGrowth, check_dormant
from flux.spark.job_moves import KeyGroupMoves
from flux.spark.last_stage_moves import MoveCheckpointStuck
from flux.spark.job_rescale import JobRescale, RescaleAsked, rescaled_parts
from flux.spark.options import JobOptions
from flux.spark.output import OutputWriter
from flux.spark.job_views import JobViews
from flux.spark.settings import check_settings, is_local
from flux.spark.split_checkpoints import SplitCheckpoints
from flux.spark.split_watch import check_split_job, split_sample

log = logging.getLogger(__name__)


#: partitions the deploy checks run the source's first records at, whatever the job's
#: count: enough for records to move between partitions, and the operators they build
#: (each twice in the driver, and in each of the determinism check's two processes) do
#: not grow with the job: 6 partitions of 20 MB of state took 770 MB in the driver and as
#: much in each of those processes, 2 partitions 370 MB (``experiments.failover``'s
#: ballast); at 100 MB per partition and 16 nodes the driver alone would need gigabytes
CHECK_PARTITIONS = 2


def check_before_deploy(dataflow, sample: List[Any], partitions: int,
                        determinism: bool = True) -> None:
    """Refuse, before any task starts, a dataflow that fails on the source's first records
    (run at ``min(partitions, CHECK_PARTITIONS)`` partitions):
    an operator or key that raises, a key msgpack cannot hash, a state msgpack cannot
    serialize or ``install_state`` does not restore (DESIGN 4.1), a ``process_batch`` that
    disagrees with ``process``; and (``determinism``) one that computes otherwise in two
    processes with different hash seeds, as the two replicas of a pair are."""
    if not sample:
        return  # nothing to check yet; the executors build the operators and report
    # a columnar source's batches: their first rows, as many as the records asked for
    sample = input_records(sample)[:len(sample)]
    partitions = min(partitions, CHECK_PARTITIONS)
    try:
        check_state_round_trip(dataflow, sample, partitions)
        check_batch_api(dataflow, sample)
        if determinism:
            check_deterministic(dataflow, sample, partitions)
    except DataflowError:
        raise
    except OperatorRaised as exc:
        where = f" in {exc.where}" if exc.where else ""
        raise DataflowError(f"on one of the source's first {len(sample)} records{where}, "
                            f"{exc}") from exc.error
    except Exception as exc:
        raise DataflowError(f"the dataflow fails on the source's first {len(sample)} records: "
                            f"{describe(exc)}") from exc


def _targets(how: str, pid: int, jvm: int) -> List[Tuple[str, int]]:
    """What ``kill_node(how=...)`` signals, named for the log: a process crash, an
    executor's (the worker outlives its JVM by the ~0.1-0.2 s Spark's daemon takes to send
    it SIGHUP, and serves its pairs meanwhile) or a machine's (both at once: nothing of the
    node is left to copy state from)."""
    targets = {"worker": [("Python worker", pid)], "executor": [("executor JVM", jvm)],
               "machine": [("Python worker", pid), ("executor JVM", jvm)]}.get(how)
    if targets is None:
        raise ValueError(f"how must be 'worker', 'executor' or 'machine', got {how!r}")
    return targets


def _kill(name: str, pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        raise RuntimeError(f"{name}'s process {pid} is gone already (declared dead and "
                           f"stopped, or ended)") from None


def shipped_sink(sink) -> bytes:
    """The ``SinkPerPartition`` pickled for the executors (``egress_on_executors``)."""
    try:
        return cloudpickle.dumps(sink)
    except Exception as exc:
        raise ValueError(f"egress_on_executors=True sends the SinkPerPartition to the "
                         f"executors, and it cannot be pickled ({type(exc).__name__}: {exc}): "
                         f"its open function must capture only what pickles (a folder, "
                         f"a bootstrap string), never a lock, a socket or a client") from exc


def driver_checkpoints(opts: JobOptions, dataflow, source, replay_order: Optional[str],
                       splits: int, events: list, sinks: int) -> Optional[DriverCheckpoints]:
    """The driver's part of checkpointing (None: no ``checkpoint=``): of the driver's
    ingress (``replay_order``: how a restart reads the source again), or of the pairs of
    ingresses of a ``SplitSource``'s ``splits``."""
    rep = opts.replication
    if replay_order is not None:
        return DriverCheckpoints(opts.checkpoints, dataflow, rep.partitions, source,
                                 replay_order, events, sinks=sinks, key_groups=rep.key_groups,
                                 running=rep.nodes if rep.partitions > rep.nodes else 0)
    if splits and opts.checkpoints.location is not None:  # cut by the pairs
        return SplitCheckpoints(opts.checkpoints, dataflow, rep.nodes, source, splits,
                                opts.tuning.epoch_interval, events, sinks=sinks,
                                key_groups=rep.key_groups)
    return None


def checkpointed_source(source) -> Tuple[Any, str]:
    """A source a restart can read again from a position, and how it orders a replay."""
    replay = replayable(source)
    if replay is None:
        raise ValueError(
            f"checkpoint= needs a source that can be read again from a position (a "
            f"flux.Source such as FileSource, or a sequence), got "
            f"{type(source).__name__}: after a restart its inputs must come again")
    # with LOGGED the ingress logs each input's partition (DESIGN 10): never guessed
    return replay, replay_order_of(replay)


class FluxJob(JobViews, KeyGroupMoves, PairGrowth, JobRescale):
    """``FluxJob(spark, dataflow, source, sink=None, **options)``: the keyword arguments
    are the table of docs/api.md (``flux.spark.options.JobOptions`` groups them); what
    users read of a running job is in ``JobViews``."""

    def __init__(self, spark, dataflow, source: Iterable[Any],
                 sink: Optional[Callable[[Any], None]] = None, **options: Any):
        self.options = opts = JobOptions.from_kwargs(**options)
        nodes, tuning = opts.replication.nodes, opts.tuning
        partitions = opts.replication.partitions  # dormant ones past ``nodes`` included
        opts.check_output(sink)
        replay_order, splits = None, 0
        if isinstance(source, SplitSource):  # read by ingresses on the executors
            splits = check_split_job(source, opts)
            sample = split_sample(source, tuning.check_records)
        elif opts.checkpoints.location is not None:
            source, replay_order = checkpointed_source(source)
        check_dormant(opts, splits)
        if not splits:
            sample, source = peek(source, tuning.check_records)
        check_before_deploy(dataflow, sample, nodes, tuning.check_determinism)
        self.spark, self.dataflow, self.source = spark, dataflow, source
        self._sample = sample  # the source's first records: a rescale's check runs them
        self.secret = secrets.token_hex(16)
        self.metrics = Metrics(tuning.metrics_interval)
        #: every output kept in ``delivered`` only when asked or without a sink, so an
        #: endless job with a sink holds no object per output
        keep = sink is None if tuning.keep_output is None else tuning.keep_output
        keep = keep and not tuning.egress_on_executors  # no output reaches the driver
        self.output = OutputWriter(sink, keep, on_outputs=self.metrics.outputs,
                                   partitions=1 if tuning.ordered_output else partitions,
                                   on_executors=tuning.egress_on_executors)
        self.config = NodeConfig(
            dataflow=cloudpickle.dumps(dataflow), stages=len(dataflow.stages),
            partitions=partitions, running=nodes if partitions > nodes else 0,
            key_groups=opts.replication.key_groups,
            replication=opts.replication.mode, capacity=tuning.capacity,
            batch_size=tuning.batch_size, window=tuning.window, pause_room=tuning.pause_room,
            batch_rows=tuning.batch_rows or dataflow.default_batch_rows(),
            heartbeat=opts.network.heartbeat, lease=opts.network.lease,
            chunk_size=tuning.chunk_size, flush_delay=tuning.flush_delay,
            item_delay=dataflow.default_item_delay() if tuning.item_delay is None
            else tuning.item_delay, secret=self.secret,
            curve=opts.network.authenticate, ports=opts.network.ports,
            checkpoint_full_every=opts.checkpoints.full_every,
            ordered_output=tuning.ordered_output,
            writers_sink=shipped_sink(sink) if tuning.egress_on_executors else b"",
            commit_interval=tuning.commit_interval,
            digests=opts.checkpoints.digests,
            split_source=cloudpickle.dumps(source) if splits else b"", splits=splits,
            epoch_interval=tuning.epoch_interval, epoch_origin=time.time())
        self._checkpointing = driver_checkpoints(opts, dataflow, source, replay_order, splits,
                                                 self.metrics.events, self.config.egresses)
        if self._checkpointing is not None:
            self._checkpointing.plan(self.output.holds())
            if splits:  # read from the origin recorded at this location (SplitOrigin)
                self.source = source = self._checkpointing.source
            self.config = replace(self.config, checkpoint=self._checkpointing.url,
                                  key_groups=self._checkpointing.key_groups,
                                  split_source=cloudpickle.dumps(source) if splits else b"")
            restore = self._checkpointing.restore
            if restore is not None and restore["partitions"] != partitions:
                check_rescalable(dataflow, sample, opts.replication.key_groups)
        #: the manifest of the checkpoint this job started from, or None
        self._resumed_from = self._checkpointing.restore if self._checkpointing else None
        self.errors: List[BaseException] = []
        self.endpoint = None
        self.attempt: Optional[Attempt] = None
        self.restarts_left = opts.checkpoints.restarts
        #: (when, the checkpoint restored or None, why) for every restart of the job
        self.restart_log: List[Tuple[float, Optional[int], str]] = []
        self._restart_due: Optional[BaseException] = None
        self._supervisor: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self._stopped = False
        self._finished = threading.Event()
        self._parts: Optional[JobParts] = None
        #: the thread of the rebalancing or the autoscaling policy, if one is set
        self._policy_thread: Optional[threading.Thread] = None
        #: a rescale to fewer whose pairs have not left yet: (its attempt, the pairs, the
        #: move cut that took their last groups)
        self._leaving: Optional[tuple] = None
        self._check_rebalance()

    # -- life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "FluxJob":
        """Launch the nodes and return once every node registered, built its operators,
        and the data flows (from the last complete checkpoint, when there is one)."""
        rep, net = self.options.replication, self.options.network
        check_settings(self.spark, self._first_running() + rep.standbys,
                       wait=net.executor_wait)
        distinct = rep.distinct_hosts
        if distinct is None:  # no pair on one machine, except on a local master
            distinct = not is_local(self.spark.sparkContext.master)
        self._parts = JobParts(
            spark=self.spark, config=self.config,
            builder=driver_builder(self.dataflow, self.config),
            metrics=self.metrics, output=self.output, checkpoints=self._checkpointing,
            source=self.source, nodes=rep.nodes, standbys=rep.standbys,
            detect_after=net.detect_after,
            driver_host=local_host(net.driver_host
                                   or self.spark.conf.get("spark.driver.host", "")),
            distinct_hosts=distinct, stopping=self._stopping, finished=self._finished,
            on_divergence=self.options.checkpoints.on_divergence,
            verify_interval=self.options.checkpoints.verify_interval,
            may_restart=lambda: self.restarts_left > 0 and not self._stopping.is_set())
        self._launch(self._checkpointing.restore if self._checkpointing else None)
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name="flux-supervisor")
        self._supervisor.start()
        # once the data flows, an error it meets (an operator raising on the first records)
        # is ``wait``'s to raise, not ``start``'s, however soon it comes
        try:
            started = self.wait_until(lambda: self.attempt.feed is not None, timeout,
                                      errors_first=False)
        except BaseException:
            self.stop()  # its tasks too: no one else would end them
            raise
        if not started:
            c = self.controller
            missing = [n for n in self.topology.nodes if n not in c.registered]
            building = [n for n in self.topology.nodes if n in c.registered and n not in c.ready]
            self.stop()
            raise TimeoutError(
                f"the {len(self.topology.nodes)} nodes were not all running within "
                f"{timeout}s: "
                f"{', '.join(missing) or 'none'} not registered (too few Spark task slots?), "
                f"{', '.join(building) or 'none'} still building their operators")
        self._policy_thread = self._start_rebalancing() or self._start_autoscaling()
        return self

    def _launch(self, restore: Optional[dict]) -> None:
        attempt = Attempt(self._parts, len(self.restart_log), restore, self._on_attempt_error)
        attempt.launch()
        self.attempt = attempt
        net = self.options.network
        if self.endpoint is not None:
            self.endpoint.collector.controller = attempt.controller
        elif net.metrics_port is not None:
            from flux.runtime.metrics_endpoint import JobCollector, MetricsEndpoint

            collector = JobCollector(self.metrics, attempt.controller,
                                     [s.name for s in self.dataflow.stages], self.driver_stats)
            try:
                self.endpoint = MetricsEndpoint(collector, net.metrics_port,
                                                net.metrics_addr).start()
            except BaseException:
                attempt.close_sockets()
                raise
        attempt.run()

    # -- supervision ----------------------------------------------------------------------
    def _on_attempt_error(self, exc: BaseException) -> None:
        """A thread of the attempt failed: a lost pair or ingress, or a live move's
        checkpoint that did not complete, restarts the job from its last checkpoint
        (DESIGN 10) a bounded number of times; anything else is the job's error."""
        if (isinstance(exc, (PairLost, IngressLost, MoveCheckpointStuck))
                and self._checkpointing is not None and self.restarts_left > 0
                and not self._stopping.is_set() and self._restart_due is None):
            self._restart_due = exc
        else:
            self.errors.append(exc)

    def _supervise(self) -> None:
        """Restart the job when an attempt ended on a lost pair, until it is stopped."""
        while not self._stopping.is_set():
            if self._restart_due is None:
                time.sleep(0.01)
                continue
            why = self._restart_due
            try:
                self._restart(why)
            except BaseException as exc:
                log.exception("the restart failed")
                self.errors.append(exc)
                return
            finally:
                if self._restart_due is why:  # a rescale asked meanwhile comes next
                    self._restart_due = None

    def _restart(self, why: BaseException) -> None:
        """End this attempt and launch the next from the last complete checkpoint whose
        files verify, or from the first input without one (DESIGN 10). What the sink holds
        stays: outputs after the cut come again with the same SNs and are dropped up to
        the last one handed to it. A rescale's restart is at its count (DESIGN 13)."""
        rescale = why if isinstance(why, RescaleAsked) else None
        self.restarts_left -= rescale is None
        now = time.monotonic()
        log.warning("restarting the job (%d restarts left): %s", self.restarts_left, why)
        self.attempt.end(JOB_STOPPED, timeout=0.5)
        log.info("the old attempt ended in %.2fs", time.monotonic() - now)
        self.output.commit()  # what it was handed is the failure-free prefix
        if rescale is not None and not self.config.ordered_output:  # a drained rescale
            self._checkpointing.drained_restart(rescale.checkpoint)
            self.output.rescaled(rescale.nodes)
        restore = self._checkpointing.restart(self.output.holds())
        if rescale is not None:
            old = self._parts.nodes
            self._parts = rescaled_parts(self._parts, rescale.nodes)
            self.config = self._parts.config
            self._checkpointing.rescaled(rescale.nodes)
            rep = replace(self.options.replication, nodes=rescale.nodes)
            self.options = replace(self.options, replication=rep)
            self.metrics.events.append((now, "rescale", (old, rescale.nodes)))
        latest = restore["checkpoint"] if restore is not None else None
        self.restart_log.append((now, latest, str(why)))
        self.metrics.events.append((now, "restart", latest))
        self._launch(restore)

    # -- waiting ---------------------------------------------------------------------------
    def finished(self) -> bool:
        """Every input's output was delivered (and handed to the sink)."""
        return self._finished.is_set()

    def wait(self, timeout: float) -> List[Any]:
        """Wait until every input's output was delivered; returns the output, in order
        (when kept: ``keep_output``; else an empty list, the sink has it)."""
        if not self.wait_until(self.finished, timeout):
            raise TimeoutError(f"the job did not finish in {timeout}s "
                               f"({self.metrics.output_total} outputs so far)")
        return list(self.delivered)

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

    # -- failures and the end --------------------------------------------------------------
    def kill_node(self, name: str, how: str = "worker") -> None:
        """SIGKILL the Python worker of ``name``, its executor JVM, or both (``_targets``)."""
        _targets(how, 0, 0)  # a wrong ``how`` is refused before anything else
        boot = self.controller.boots.get(name, "")
        if boot and boot != boot_id():
            raise RuntimeError(f"{name} runs on {self.controller.hosts.get(name)}, under another "
                               f"kernel: kill_node signals processes of this machine only")
        pid, jvm = self.controller.pids(name)
        targets = _targets(how, pid, jvm)
        log.warning("killing %s: SIGKILL to its %s", name,
                    " and ".join(f"{what} (pid {p})" for what, p in targets))
        self.metrics.killed(f"{name} ({how})")
        for _, p in targets:
            _kill(name, p)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every task and thread this job started, then close every socket (before
        ``start``: nothing runs but the checkpoint service's thread). Once is enough."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if self.attempt is None:
            if self._checkpointing is not None:
                self._checkpointing.stop()
            return
        if self._supervisor is not None:
            self._supervisor.join(timeout=120)  # a restart under way ends first
        if self._policy_thread is not None:
            self._policy_thread.join(timeout=10)  # (a move or rescale it asked gives up as the job stops)
        # a failed job's controller tells no one to stop: cancel the tasks at once
        self.attempt.stop(timeout, at_once=bool(self.errors))
        if self.endpoint is not None:
            self.endpoint.stop()
        self.output.close()
        if self._checkpointing is not None:
            self._checkpointing.stop()

    def __enter__(self) -> "FluxJob":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
