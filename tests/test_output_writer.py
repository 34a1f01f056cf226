"""The driver's output writer: each output handed to the sink once, in order, and the sink
closed at the end when it has something to close (a callable sink has not)."""
from __future__ import annotations

import pytest

from flux.connectors.sinks import JsonLinesSink
from flux.spark.output import OutputWriter

pytestmark = pytest.mark.timeout(30)


def test_after_a_restart_what_the_sink_was_handed_is_not_handed_again():
    got = []
    writer = OutputWriter(got.append, keep_output=True)
    writer.deliver([((1,), "a"), ((2,), "b")])
    writer.deliver([((2,), "b"), ((3,), "c")])  # a restarted egress replays from (2,)
    assert got == [((1,), "a"), ((2,), "b"), ((3,), "c")]
    assert writer.commit() == (3,)
    writer.close()  # a plain callable: nothing to close, and no error


def test_a_sink_that_holds_a_file_is_closed_and_its_outputs_are_there(tmp_path):
    from flux.connectors.sinks import read_json_lines

    sink = JsonLinesSink(tmp_path / "out.jsonl")
    writer = OutputWriter(sink, keep_output=False)
    writer.deliver([((1,), [1, "x"])])
    writer.close()
    assert read_json_lines(tmp_path / "out.jsonl") == [((1,), [1, "x"])]  # flushed at close
