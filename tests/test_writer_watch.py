"""What the driver learns from the sinks' writers on the executors: how far the outputs
got, how many there are, and when the job is done."""
from __future__ import annotations

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
