"""What the driver learns from the sinks' writers on the executors: how far the outputs
got, how many there are, and when the job is done."""
from __future__ import annotations

import time

import pytest

from flux.control_messages import WriterProgress
from flux.spark.writer_watch import WriterWatch

pytestmark = pytest.mark.timeout(30)


def test_the_outputs_are_counted_across_a_writer_started_again_elsewhere():
    watch = WriterWatch(2)
    watch.report(WriterProgress(0, (10,), 10, outputs=40))
    watch.report(WriterProgress(1, (8,), 8, outputs=25))
    assert watch.outputs() == 65
    watch.report(WriterProgress(0, (12,), 12, outputs=47))
    assert watch.outputs() == 72
    # partition 0's node died: its writer starts again beside the other replica, from 0
    watch.report(WriterProgress(0, (12,), 12, outputs=0))
    watch.report(WriterProgress(0, (20,), 20, outputs=9))
    assert watch.outputs() == 47 + 9 + 25
    assert watch.settled() == 8


def test_the_job_is_finished_once_every_writer_bound_covers_the_last_input():
    watch = WriterWatch(2)
    watch.report(WriterProgress(0, (30,), 30, outputs=3))
    assert watch.settled() is None and not watch.finished(30)  # partition 1 not heard
    watch.report(WriterProgress(1, (29, 5), 29, outputs=2))
    assert not watch.finished(30)
    watch.report(WriterProgress(1, (31,), 31, outputs=2))
    assert watch.finished(30) and watch.settled() == 30


def test_a_writer_counts_only_what_its_sink_keeps():
    from flux.runtime.writer_sinks import kept_by

    items = [((5, 0), "a"), ((6, 0), "b"), ((7, 1), "c")]
    assert kept_by(items, None) == 3
    assert kept_by(items, (4, 9)) == 3
    assert kept_by(items, (6, 0)) == 1  # a restart's replay of what the sink holds
    assert kept_by(items, (7, 1)) == 0


class _Writer:
    """What ``WriterSinks`` reads of a writer: its bounds, outputs since its last commit."""

    partition = 0

    def __init__(self):
        self.frontier, self.uncommitted = (0,), 0

    def bounds(self):
        return self.frontier, self.frontier[0]

    def committed(self, through=None):
        return []


def _sink():
    from flux.connector_api import CommitsBySN

    class Memory(CommitsBySN):
        def __init__(self):
            super().__init__(None, 10**9)

        def _commit(self, rows, sn):
            pass

    return Memory()


def test_a_writer_at_full_rate_reports_how_far_its_last_commit_got():
    """At full rate a writer always has outputs since its last commit when it reports:
    it reports its bound as of that commit, never a bound past what its sink holds, and
    never one older than it reported before."""
    from flux.effects import SinkCommit
    from flux.runtime.writer_sinks import WriterSinks

    writer, sink = _Writer(), _sink()
    sinks = WriterSinks(lambda p: sink, lambda p: writer, commit_interval=0.1)
    sinks.adopt([writer])
    now = 0.0

    def deliver(n):
        sinks.deliver(0, [((n, 0), ("k", n))])
        writer.frontier, writer.uncommitted = (n,), writer.uncommitted + 1

    reports = []
    for n in range(1, 40):
        deliver(n)
        if n % 3 == 0:  # a commit covers what was delivered so far
            writer.uncommitted = 0
            sinks.submit(SinkCommit(0, 0, 0, (n,)))  # (made on the committing thread)
            while not sinks.finished():
                time.sleep(0.001)
            deliver(n + 100)  # ... and at once more outputs: never idle when it reports
            writer.frontier, writer.uncommitted = (n,), 1
        now += 0.05
        reports += sinks.progress(now)
    assert reports, "no report while outputs kept coming"
    settled = [r.settled for r in reports]
    assert settled == sorted(settled) and settled[-1] >= 36
    assert all(r.settled % 3 == 0 for r in reports)  # each a commit's bound
    # idle: everything committed, its bound now
    writer.uncommitted = 0
    writer.frontier = (50,)
    assert [r.settled for r in sinks.progress(now + 1)] == [50]
    # more outputs after it: the last report stands, nothing older comes again
    writer.uncommitted = 1
    assert sinks.progress(now + 2) == []
