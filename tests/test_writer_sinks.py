"""A node's writers commit their sinks off the loop's thread (flux.runtime.writer_sinks): a
sink's broker that is slow to commit must not stall the loop, which runs every replica of
the node (a loop stalled on a broker was declared stuck and its pairs lost). Outputs
released meanwhile wait for the commit; the writer's acks cover what it covered."""
from __future__ import annotations

import threading
import time

import pytest

from flux.connector_api import CommitsBySN
from flux.runtime.writer_sinks import WriterSinks

pytestmark = pytest.mark.timeout(30)


class SlowSink(CommitsBySN):
    """Commits block until ``release`` is set; what each commit wrote is kept."""

    def __init__(self):
        super().__init__(None, commit_every=10_000)
        self.release = threading.Event()
        self.commits: list = []

    def _commit(self, rows, sn) -> None:
        self.release.wait(10)
        self.commits.append((list(rows), sn))


class Writer:
    """A writer's surface WriterSinks calls: its acks say what they covered."""

    uncommitted = 0

    def bounds(self):
        return (), 0

    def committed(self, through=None):
        return [("acks through", through)]


def test_a_slow_commit_does_not_block_and_what_comes_meanwhile_waits_for_it():
    from flux.effects import SinkCommit

    sink, writer = SlowSink(), Writer()
    sinks = WriterSinks(lambda p: sink, lambda p: writer)
    sinks.sinks[0], sinks.writers[0] = sink, writer
    sinks.deliver(0, [((1,), "a"), ((2,), "b")])
    started = time.monotonic()
    sinks.submit(SinkCommit(0, 0, 0, (2,)))
    assert time.monotonic() - started < 0.5  # the loop goes on
    sinks.deliver(0, [((3,), "c")])  # released while the sink commits: held
    sinks.submit(SinkCommit(4, 3, 0, (3,)))  # asked meanwhile: after it
    assert sinks.finished() == [] and ((3,), "c") not in sink.pending  # held here
    sink.release.set()
    done = []
    while len(done) < 2:
        done += sinks.finished()
        time.sleep(0.01)
    first, second = done
    assert first == (SinkCommit(0, 0, 0, (2,)), (2,), [("acks through", (2,))])
    assert second == (SinkCommit(4, 3, 0, (3,)), (3,), [("acks through", (3,))])
    assert sink.commits == [([((1,), "a"), ((2,), "b")], (2,)), ([((3,), "c")], (3,))]
    sinks.close()


def test_a_sinks_error_in_a_commit_is_raised_at_the_loop():
    from flux.effects import SinkCommit

    class Broken(SlowSink):
        def _commit(self, rows, sn):
            raise RuntimeError("the broker refused the commit")

    sink, writer = Broken(), Writer()
    sinks = WriterSinks(lambda p: sink, lambda p: writer)
    sinks.sinks[0], sinks.writers[0] = sink, writer
    sinks.deliver(0, [((1,), "a")])
    sinks.submit(SinkCommit(0, 0, 0, (1,)))
    with pytest.raises(RuntimeError, match="refused the commit"):
        for _ in range(100):
            sinks.finished()
            time.sleep(0.01)


def test_the_jobs_end_waits_for_the_commits_being_made():
    from flux.effects import SinkCommit

    sink, writer = SlowSink(), Writer()
    sinks = WriterSinks(lambda p: sink, lambda p: writer)
    sinks.sinks[0], sinks.writers[0] = sink, writer
    sinks.deliver(0, [((1,), "a")])
    sinks.submit(SinkCommit(0, 0, 0, (1,)))
    sinks.deliver(0, [((2,), "b")])
    threading.Timer(0.2, sink.release.set).start()
    sinks.close()  # (CommitsBySN.close commits what it holds)
    assert [sn for _, sn in sink.commits] == [(1,), (2,)]


def test_a_writer_started_again_opens_its_sink_off_the_loop_and_is_held_meanwhile():
    """Opening a sink fences the old writer and reads back what it committed, which may
    wait long on a broker (a transaction a crash left open); the loop goes on meanwhile,
    the writer takes no message, and a failure the views tell it is taken after it
    resumed from what the sink committed."""
    from flux.addresses import P, S, Addr
    from flux.data_messages import Batch
    from flux.effects import Send
    from flux.protocol.sink_writer import SinkWriter

    opening, sink = threading.Event(), SlowSink()
    sink._committed = (7, 0)

    def open_sink(p):
        opening.wait(10)
        return sink

    sinks = WriterSinks(open_sink, lambda p: SinkWriter(1, 2, p, commit_every=10))
    primary, secondary = Addr(1, 0, P), Addr(1, 0, S)
    started = time.monotonic()
    writer, first = sinks.start(Addr(2, 0, P), {primary})
    assert time.monotonic() - started < 0.5 and first == []  # the loop goes on
    assert not writer.ready_for(secondary, Batch((8,), None))  # held: messages wait
    assert writer.on_fail({secondary}) == []  # told meanwhile: taken after resume
    assert sinks.opened() == [] and sinks.commits_due(1e9) == [] and sinks.progress(1e9) == []
    opening.set()
    effects = []
    for _ in range(100):
        effects += sinks.opened()
        if effects:
            break
        time.sleep(0.01)
    assert all(isinstance(e, Send) for e in effects)
    assert effects[0].dst == secondary and effects[0].msg.hwm == (6, 0)  # after output 7
    assert not writer.held() and sinks.sinks[0] is sink
    assert writer.fcons.feeds[0].data_from is None  # the later failure was taken: both gone
    sinks.close()


def test_a_sinks_error_while_opening_is_raised_at_the_loop():
    def open_sink(p):
        raise RuntimeError("the broker refused the producer")

    from flux.addresses import P, Addr
    from flux.protocol.sink_writer import SinkWriter

    sinks = WriterSinks(open_sink, lambda p: SinkWriter(1, 2, p, commit_every=10))
    sinks.start(Addr(2, 0, P), {Addr(1, 0, P)})
    with pytest.raises(RuntimeError, match="refused the producer"):
        for _ in range(100):
            sinks.opened()
            time.sleep(0.01)


def test_the_sinks_of_a_job_open_at_once_where_each_waits_for_the_others_open():
    """Kafka sinks sharing a state topic: each one's open reads the topic, which a
    transaction the others' crashed incarnations left open holds until their own open
    fences them. Opened one after the other (on the driver at a restart, on a node with
    several writers) the first waited for the next and gave up after a minute."""
    from flux.connector_api import SinkPerPartition
    from flux.protocol.sink_writer import SinkWriter

    def job_sinks():
        opened = {p: threading.Event() for p in range(3)}

        def open_sink(p):
            opened[p].set()  # its producer fences its crashed incarnation
            for q in opened:  # its read waits for every other's fence
                if not opened[q].wait(5):
                    raise TimeoutError(f"sink {p}: transaction of {q} still open")
            sink = SlowSink()
            sink._committed = (p,)
            return sink
        return open_sink

    sinks = SinkPerPartition(job_sinks()).open_many(range(3))
    assert [s.committed() for s in sinks] == [(0,), (1,), (2,)]
    writers = WriterSinks(job_sinks(), lambda p: SinkWriter(1, 3, p, commit_every=10))
    adopted = writers.adopt([SinkWriter(1, 3, p, commit_every=10) for p in (2, 0, 1)])
    assert [w.partition for w in adopted] == [2, 0, 1]
    assert {p: s.committed() for p, s in writers.sinks.items()} == {0: (0,), 1: (1,), 2: (2,)}
    writers.close()
