"""The driver's side of the ingress process: what it hands over, and when.

The ingress process's end of the pipe is played by ``Pipe`` below: it records what the
driver sent and accepts what the test says, as the ingress's back-pressure would. The
real process, with real sockets, is in test_ingress_process.py and every Spark test.
"""
import time
from types import SimpleNamespace

import pytest

from flux.errors import IngressLost
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.ingress_feed import IngressFeed
from flux.runtime.ingress_process import ACCEPTED, CUT, END, FAILED, RECORDS, IngressProcess
from flux.runtime.input_log import InputLog, InputLogWriter
from flux.runtime.metrics import Metrics
from flux.connectors.sources import NOT_YET, RateLimited

pytestmark = pytest.mark.timeout(60)


class Pipe:
    """The ingress process's end: what came (in order) and what it says back."""

    pid = 4242
    check_alive = IngressProcess.check_alive  # the real wording of a lost process
    exit_code = IngressProcess.exit_code

    def __init__(self):
        self.sent, self.inbox, self.code = [], [], None
        self.proc = SimpleNamespace(poll=lambda: self.code)

    def send(self, *msg):
        self.sent.append(msg)

    def receive(self, timeout_ms):
        out, self.inbox = self.inbox, []
        return out

    def records(self):
        """Every record handed over, in order (a hand-over is a list of runs)."""
        return [r for m in self.sent if m[0] == RECORDS for run in m[1] for r in run]


class Placed:
    """A ``flux.Source`` with a position after each record (as a file or a Kafka partition
    has)."""

    def __init__(self, records, parts=None):
        self.records, self.parts, self.i = list(records), parts, 0
        self.last = None

    def __iter__(self):
        return self

    def __next__(self):
        if self.i == len(self.records):
            raise StopIteration
        self.i += 1
        if self.parts is not None:
            self.last = (self.parts[self.i - 1], self.i)
        return self.records[self.i - 1]

    @property
    def position(self):
        return self.i

    def open(self, position):
        self.i = position


def test_the_feed_never_runs_more_than_its_window_ahead_of_the_ingress():
    pipe = Pipe()
    feed = IngressFeed(pipe, iter(range(100)), Metrics(), window=10)
    for _ in range(5):
        feed.step(0)
    assert pipe.records() == list(range(10))  # the ingress accepted nothing yet
    pipe.inbox.append((ACCEPTED, 4))
    feed.step(0)
    assert pipe.records() == list(range(14))
    pipe.inbox.append((ACCEPTED, 100))
    feed.step(0)
    feed.step(0)
    assert pipe.records() == list(range(100)) and feed.source_done
    assert pipe.sent[-1] == (END,)
    assert [m for m in pipe.sent if m[0] == END] == [(END,)]  # said once


def test_a_feed_that_cannot_wait_counts_its_drops_while_the_window_is_full():
    now = [0.0]
    source = RateLimited(range(10_000), rate=1000, backlog=5, clock=lambda: now[0])
    pipe, metrics = Pipe(), Metrics()
    feed = IngressFeed(pipe, iter(source), metrics, window=3)
    feed.step(0)
    assert len(pipe.records()) == 1  # record 0 arrives at once; nothing more by t=0
    now[0] = 0.1  # 100 more arrived; the ingress took none: 3 in flight at most
    for _ in range(3):
        feed.step(0)
    assert len(pipe.records()) == 3
    assert metrics.dropped_total == source.dropped > 90


def test_a_cut_follows_exactly_the_inputs_handed_over_with_the_position_after_them():
    pipe = Pipe()
    feed = IngressFeed(pipe, Placed("abcdef"), Metrics(), accepted=100, window=4)
    feed.step(0)
    assert feed.has_new_inputs()
    assert feed.choose_cut(7) == (104, 4)  # inputs 101..104 handed over; after "d"
    assert pipe.sent[-1] == (CUT, 7) and pipe.records() == list("abcd")
    assert not feed.has_new_inputs()
    pipe.inbox.append((ACCEPTED, 104))
    feed.step(0)
    assert feed.has_new_inputs() and feed.choose_cut(8) == (106, 6)


class DurableSoFar(InputLogWriter):
    """The real writer, noting how far the log was durable when the feed last asked."""

    durable = 0

    def done(self):
        last = super().done()
        if last is not None:
            self.durable = max(self.durable, last)
        return last


def test_with_an_input_log_nothing_is_handed_over_before_it_is_logged(tmp_path):
    log = InputLog(CheckpointStore(str(tmp_path)))
    writer = DurableSoFar(log)
    try:
        records = [f"r{i}" for i in range(1, 31)]
        source = Placed(records, parts=[i % 3 for i in range(1, 31)])
        pipe = Pipe()
        handed_unlogged = []
        send = pipe.send

        def checked_send(*msg):  # every input handed over was logged, or replayed (<= 10)
            send(*msg)
            handed_unlogged.append(len(pipe.records()) > max(10, writer.durable))

        pipe.send = checked_send
        # inputs 1..10 were logged by an earlier run: the source replays them, they go
        feed = IngressFeed(pipe, source, Metrics(), input_log=writer, logged_before=10,
                           window=1000)
        feed.step(0)
        assert pipe.records() == records[:10]  # the replay goes at once, apart
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (feed.source_done
                                                   and len(pipe.records()) == 30):
            feed.step(1)
            time.sleep(0.001)  # the stand-in pipe never waits: the writer's thread runs
        assert pipe.records() == records and not any(handed_unlogged)
        assert log.read(after=10) == [i % 3 for i in range(11, 31)]
        feed.step(0)
        assert pipe.sent[-1] == (END,)
    finally:
        writer.stop()


def test_the_ingress_process_failing_or_dying_stops_the_feed_with_its_reason():
    pipe = Pipe()
    feed = IngressFeed(pipe, iter(range(10)), Metrics())
    pipe.inbox.append((FAILED, "ingress: messages from node2#7 were lost in transit"))
    with pytest.raises(RuntimeError, match="node2#7 were lost"):
        feed.step(0)
    pipe = Pipe()
    feed = IngressFeed(pipe, iter(range(10)), Metrics())
    feed._checked = float("-inf")
    pipe.code = -9
    with pytest.raises(IngressLost, match=r"ingress process \(pid 4242\) exited with code -9"):
        feed.step(0)


def test_a_source_with_nothing_yet_is_asked_again_not_ended():
    items = iter([1, NOT_YET, 2, 3])
    pipe = Pipe()
    feed = IngressFeed(pipe, items, Metrics())
    feed.step(0)
    assert pipe.records() == [1] and not feed.source_done
    feed.step(0)
    feed.step(0)
    assert pipe.records() == [1, 2, 3] and feed.source_done
