"""The simulated sinks' writers on the nodes (docs/design/parallel_io.md).

With ``writers_on_nodes`` each last-stage partition's egress is a ``SinkWriter`` on the
node of that partition's P replica; a view that declares its node dead starts it again
beside the survivor (``controller.writers``): the host there calls ``factory``, which
makes the new writer held while its sink opens (the runtime opens it off the node's
loop); at a later step of its own (``open``) the sink fences the old writer (what it
had not committed is dropped; until then a zombie's writer may still commit), the new
one resumes from what the sink committed, and that partition's oracle is re-based.
Deliveries and commits of a fenced writer (a zombie's) never reach the sink.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from flux.addresses import Addr
from flux.protocol.host import Host
from flux.protocol.sink_writer import SinkWriter
from flux.sim.config import EGRESS_HOST


class SimWriters:
    """Where each partition's writer runs now, and what the sink asks of them."""

    def __init__(self, world):
        self.world = world
        #: partition -> the process its writer runs on (empty: egresses in the driver)
        self.host: Dict[int, str] = {}
        #: partition -> (process, its held writer, the failures its view knew): sinks
        #: being opened
        self.opening: Dict[int, Tuple[str, SinkWriter, Set[Addr]]] = {}

    def new(self, partition: int) -> SinkWriter:
        w = self.world
        config = w.config
        writer = (config.writer_class or SinkWriter)(
            w.stages, w.partitions, partition,
            min(config.commit_every or config.capacity, config.capacity),
            w.builder.credit_every, config.batch_rows)
        writer.checkpoint_complete(*w.moves.sinks.newest_complete())  # (the controller's view)
        return writer

    def place(self, topology) -> List[SinkWriter]:
        """Each partition's writer where the topology puts it (beside its P replica)."""
        self.host, self.opening = {}, {}
        if not topology.writers:
            return []
        writers = [self.new(p) for p in range(self.world.partitions)]
        self.host = {w.partition: topology.where[w.addr] for w in writers}
        return writers

    def factory(self, name: str):
        """What the host ``name`` calls when a view starts a writer there."""
        def start(addr: Addr, dead) -> tuple:
            w = self.world
            writer = self.new(addr.partition)
            writer.hold()
            self.opening[addr.partition] = (name, writer, set(dead))
            w.host_of[addr] = name
            w.net.invalidate()
            w.steps.rehost()
            return writer, []
        return start

    def steps(self, steps: List[tuple], hosts: List[str]) -> None:
        """A sink opened for a held writer on a live process; a sink's own commit."""
        w = self.world
        for p, (name, writer, _) in sorted(self.opening.items()):
            if w.alive[name] and name not in w.detection.declared and \
                    w.hosts[name].machines.get(writer.addr) is writer:
                steps.append(("sink-open", name, p))
                hosts.append(name)
        if self.commits_due():
            steps.append(("sink-commit",))  # an exactly-once sink's own commit_every
            hosts.append(EGRESS_HOST)

    def apply(self, step: tuple) -> tuple:
        """Take a sink's step; returns the machines it touched."""
        if step[0] == "sink-commit":
            self.commit()
            return ()
        return (self.open(step[2]),)

    def open(self, partition: int):
        """The partition's sink opened for its new writer: the old one fenced, the new
        one resumed after what the sink committed. Returns the writer's address."""
        w = self.world
        name, writer, dead = self.opening.pop(partition)
        w.sink.abort(partition)
        w.outcome.writer_moves += 1
        last = w.sink.last_committed(partition)
        w.egresses[partition] = writer
        self.host[partition] = name
        w.settled_oracles[partition].resume(last)
        host = w.hosts[name]
        w.net.touched(name, writer.addr)
        w.effects(*host.run_local(writer.resume(last, dead)), host=host)
        return writer.addr

    def writes(self, host: Optional[Host], partition: int) -> bool:
        """May ``host``'s writer of ``partition`` reach the sink? A fenced one may not."""
        return not self.host or host is not None and self.host.get(partition) == host.name

    def _live(self):
        w = self.world
        return [(p, name) for p, name in sorted(self.host.items())
                if w.alive[name] and name not in w.detection.declared]

    def commits_due(self) -> bool:
        """May a sink commit by itself now? It holds outputs it has not committed, or a
        live writer sent it items since its last commit (maybe without outputs: its
        producers keep them until a commit)."""
        w = self.world
        if not self.host:
            return w.config.sink_commits and w.sink.uncommitted()
        return w.sink.uncommitted() or any(w.egresses[p].uncommitted for p, _ in self._live())

    def commit(self) -> None:
        """The sinks commit by themselves (their own ``commit_every``): through each
        writer, or all at once for the driver's egresses."""
        w = self.world
        if not self.host:
            w.sink.commit()
            return
        for p, name in self._live():
            host = w.hosts[name]
            w.effects(*host.run_local(w.egresses[p].commit_now()), host=host)
