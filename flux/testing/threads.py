"""A whole Flux cluster on threads of one process, over real ZeroMQ sockets.

For tests and debugging without Spark: the controller, every node (chained
declustering), the standbys, the ingress and the egress each run a loop on a
thread with sockets of their own on loopback. ``kill(name)`` stops a process
between two turns and closes its sockets: fail-stop, detected by the
controller only through its silence, as in a real cluster. Every thread is
stopped and every socket closed by ``stop()``.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import zmq

from controller.placement import placement_for
from controller.recovery import Recovery
from flux.protocol.builder import MachineBuilder
from flux.effects import Deliver
from flux.protocol.host import Host
from flux.runtime.controller_service import ControllerService
from flux.runtime.liveness import Liveness
from flux.runtime.loop import HostLoop
from flux.runtime.mover_service import StateMoverService, mover_peer
from flux.runtime.transport import Transport, job_keys
from flux.runtime.writer_sinks import WriterSinks
from flux.protocol.segment import StreamedSegment
from controller.topology import CONTROLLER_PROCESS, EGRESS_PROCESS, INGRESS_PROCESS, Topology


class ThreadCluster:
    """Every process of a Flux job on a thread of its own, over real ZeroMQ sockets."""

    def __init__(self, dataflow, partitions: int, records: Iterable[Any], standbys: int = 1,
                 capacity: int = 16, batch_size: int = 4, heartbeat: float = 0.02,
                 detect_after: float = 1.0, chunk_size: int = 1 << 20,
                 replication: str = "flux", secret: Optional[str] = None,
                 window: int = 16, batch_rows: int = 1024, ordered_output: bool = True,
                 sink=None):
        """``sink``: a ``SinkPerPartition`` of exactly-once sinks: each last-stage
        partition's egress then runs on a node as a sink's writer, writing to its own sink
        and started again beside the survivor when its node dies (``ordered_output``
        False; docs/design/parallel_io.md); None: the egresses run in a process of their
        own and their outputs are collected in ``delivered`` and ``by_partition``."""
        from flux.connector_api import SplitSource

        if isinstance(records, SplitSource):
            raise ValueError("a SplitSource is read by ingresses on Spark's executors "
                             "(FluxJob); the thread cluster reads records: pass them")
        writers = sink is not None
        # every node shares this process and its GIL: kills are detected by the dropped
        # connection, the heartbeat timeout (detect_after) only catches hangs: it is generous
        self.builder = builder = MachineBuilder(dataflow, partitions, capacity, batch_size,
                                                replication=replication, window=window,
                                                segment_class=StreamedSegment,
                                                batch_rows=batch_rows,
                                                ordered_output=ordered_output and not writers,
                                                writers_on_nodes=writers,
                                                digests=False)  # no cuts: nothing compared
        placement = placement_for(replication, len(dataflow.stages), partitions)
        egresses = builder.egresses()
        self.topology = topology = Topology.numbered(placement, len(dataflow.stages), partitions,
                                                     standbys, len(egresses), writers)
        self.incarnations = dict(topology.incarnations)
        machines: Dict[str, Dict] = {
            **{n: {a: builder.segment(a) for a in topology.endpoints_of(n)}
               for n in topology.workers},
            INGRESS_PROCESS: {topology.ingress: builder.ingress()},
            EGRESS_PROCESS: {} if writers else {e.addr: e for e in egresses}}
        #: a node's writers' sinks (with ``sink``)
        self.writer_sinks: Dict[str, WriterSinks] = {}
        if writers:  # each writer where the topology puts it (beside its P replica)
            for n in topology.workers:
                ws = self.writer_sinks[n] = WriterSinks(sink.open, builder.writer)
                here = [e for e in topology.egresses if topology.where[e] == n]
                for e, writer in zip(here, ws.adopt([builder.writer(e.partition)
                                                     for e in here])):
                    machines[n][e] = writer
        peer_incs = topology.peer_incs()  # after the writers' places
        self.ctx = zmq.Context()
        #: with a ``secret``: CURVE on every socket, as a FluxJob on Spark does
        self.keys = job_keys(secret) if secret is not None else None
        self.transports = {n: Transport(self.ctx, n, self.incarnations[n], keys=self.keys)
                           for n in topology.processes}
        addresses = {n: t.address for n, t in self.transports.items()}
        self.delivered: List[Any] = []
        #: with an egress per partition (``ordered_output=False``): each one's outputs
        self.by_partition: Dict[int, List[Any]] = {}
        self.recovery = Recovery(topology, writers=writers)
        self.controller = ControllerService(self.transports[CONTROLLER_PROCESS], detect_after)
        self.loops: Dict[str, HostLoop] = {}
        #: every node's StateMover service (a thread and socket of its own, as on Spark)
        self.movers: Dict[str, StateMoverService] = {}
        self.liveness: Dict[str, Liveness] = {}
        for name, ms in machines.items():
            worker = topology.is_worker(name)
            host = Host(name, ms, self.incarnations[name],
                        builder.standby_segment if worker else None, chunk_size, peer_incs,
                        writer_factory=self.writer_sinks[name].start
                        if name in self.writer_sinks else None)
            if worker:
                self.movers[name] = StateMoverService(self.ctx, name, self.incarnations[name],
                                                      self.keys)
                addresses[mover_peer(name)] = self.movers[name].address  # the loops' view
            self.controller.add_member(name, self.incarnations[name], addresses[name],
                                       self.movers[name].address if worker else "")
            if worker:  # heartbeats from a thread of their own, as on Spark
                self.liveness[name] = Liveness(self.ctx, name, self.incarnations[name],
                                               self.transports[CONTROLLER_PROCESS].address,
                                               heartbeat, self.keys)
            self.loops[name] = HostLoop(
                host, self.transports[name], topology.where, addresses, self._on_effect,
                iter(records) if name == INGRESS_PROCESS else None, self.incarnations,
                on_turn=self.liveness[name].loop_turned if worker else lambda: None,
                mover_relay=mover_peer(name) if worker else None,
                stats_every=1.0 if worker else None,
                writer_sinks=self.writer_sinks.get(name))
        self.controller.begin(self.recovery)
        self._stop: Dict[str, threading.Event] = {n: threading.Event() for n in self.topology.processes}
        self._threads: Dict[str, threading.Thread] = {}
        self.errors: List[BaseException] = []

    def _on_effect(self, e) -> None:
        if isinstance(e, Deliver):
            self.delivered.extend(e.items)
            self.by_partition.setdefault(e.partition, []).extend(e.items)

    def _run(self, name: str, turn: Callable[[int], Any]) -> None:
        stop = self._stop[name]
        try:
            while not stop.is_set():
                turn(2)
        except BaseException as exc:  # reported by the caller, never swallowed
            self.errors.append(exc)

    def start(self) -> "ThreadCluster":
        self._threads[CONTROLLER_PROCESS] = threading.Thread(
            target=self._run, args=(CONTROLLER_PROCESS, self.controller.turn), daemon=True)
        for name, loop in self.loops.items():
            self._threads[name] = threading.Thread(target=self._run, args=(name, loop.turn),
                                                   daemon=True)
        for t in self._threads.values():
            t.start()
        for name, mover in self.movers.items():
            loop = self.loops[name]
            mover.start(name, self.transports[name].address, loop.addresses,
                        lambda process, loop=loop: process in loop.dead_processes)
        for name, liveness in self.liveness.items():
            liveness.start(lambda loop=self.loops[name]: loop.host.view)
        return self

    def kill(self, name: str) -> None:
        """Fail-stop ``name``: it halts between two turns and its sockets close."""
        self._stop[name].set()
        self._threads[name].join(timeout=10)
        self.transports[name].close()
        self.writer_sinks.pop(name, None)  # its sinks die with it: nothing more committed
        if name in self.movers:
            self.movers[name].stop()
            self.liveness[name].stop()

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.errors or self.controller.error:
                return False
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    def stop(self) -> None:
        for event in self._stop.values():
            event.set()
        for t in self._threads.values():
            t.join(timeout=10)
        for mover in self.movers.values():
            mover.stop()
        for liveness in self.liveness.values():
            liveness.stop()
        for t in self.transports.values():
            t.close()
        for ws in self.writer_sinks.values():
            ws.close()
        self.ctx.term()

    def __enter__(self) -> "ThreadCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
