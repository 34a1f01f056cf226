"""The driver dies (SIGKILL) and the same program is run again with the same checkpoint
location: it resumes from the last complete checkpoint, and the sink's committed content
is the failure-free output, no gap, no duplicate (slow: Spark in a process of its own,
one at a time)."""
from __future__ import annotations

import json

import pytest

from experiments.resumable_job import Program, per_key, read_sink, write_inputs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run_then_kill(args, log, on_start=lambda: None, ready=lambda line: True) -> dict:
    """Run the program until a progress line says its third checkpoint is complete and
    ``ready(line)``, then kill its driver; its "started" line. ``on_start``: called once
    the job is deployed."""
    first = Program(args, log)
    try:
        started = first.wait_for(lambda x: x["kind"] == "started", 180)
        on_start()
        first.wait_for(lambda x: x["kind"] == "progress" and (x["checkpoint"] or 0) >= 3
                       and ready(x), 120)
    finally:
        first.kill()
    return started


def run_to_the_end(args, log) -> tuple:
    """Run the program again to its end: its "started" and "done" lines."""
    second = Program(args, log)
    try:
        started = second.wait_for(lambda x: x["kind"] == "started", 180)
        done = second.wait_for(lambda x: x["kind"] == "done", 300)
    finally:
        second.kill()
    return started, done


@pytest.mark.parametrize("fmt", ["delta"])  # jsonl: the split job's test and chaos's
def test_a_killed_driver_run_again_resumes_from_its_checkpoint(tmp_path, fmt):
    expected = write_inputs(tmp_path / "in", 30_000)
    args = ["--input", str(tmp_path / "in"), "--sink", str(tmp_path / "out"),
            "--sink-format", fmt, "--checkpoint", str(tmp_path / "ckpt"), "--interval", "1",
            "--rate", "3000"]
    started = run_then_kill(args, tmp_path / "first.log")
    assert started["checkpoint"] is None  # a new location: from the first input
    partial = read_sink(fmt, str(tmp_path / "out"))
    assert 0 < len(partial) < len(expected) and partial == expected[:len(partial)]

    started, done = run_to_the_end(args, tmp_path / "second.log")
    assert started["checkpoint"] is not None and started["checkpoint"] >= 3
    assert started["cut"] > 0
    assert done["restarts"] == 0
    assert read_sink(fmt, str(tmp_path / "out")) == expected


def test_a_killed_driver_of_a_split_job_run_again_resumes_from_its_checkpoint(tmp_path):
    """The inputs read on the executors (``--splits 3``, dealt by key: no input through
    the driver); the driver killed after three checkpoints and run again: each pair
    follows its split's log past the restored cut, so every output the sink committed
    keeps its SN. The job numbers the splits' inputs in its own order, so the check is
    per key (each key's inputs lie in one split, in order): the failure-free output,
    each once, SNs increasing. The sink commits every 100 outputs, ahead of the cuts, and
    the driver dies once it committed past the last complete checkpoint's cut: the sink
    holds outputs past the restored cut (checked), which must come again with the same
    SNs."""
    expected = per_key(write_inputs(tmp_path / "in", 30_000))
    args = ["--input", str(tmp_path / "in"), "--sink", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "ckpt"), "--interval", "1", "--rate", "3000",
            "--splits", "3", "--commit-every", "100"]
    # killed once its sink committed past the last complete checkpoint's cut
    run_then_kill(args, tmp_path / "first.log",
                  ready=lambda x: bool(x["committed"]) and x["committed"][0] > x["cut"])
    first = read_sink("jsonl", str(tmp_path / "out"))
    partial = per_key(first)
    assert 0 < sum(map(len, partial.values())) < sum(map(len, expected.values()))
    assert all(rows == expected[key][:len(rows)] for key, rows in partial.items())

    started, done = run_to_the_end(args, tmp_path / "second.log")
    assert started["checkpoint"] is not None and started["checkpoint"] >= 3
    assert past_the_cut(first, started["cut"])  # what the replay must number as before
    assert done["restarts"] == 0
    rows = read_sink("jsonl", str(tmp_path / "out"))
    sns = [tuple(sn) for sn, _ in rows]
    assert sns == sorted(set(sns))
    assert per_key(rows) == expected


def in_order_within(rows: list, expected: list) -> bool:
    """Are ``rows`` some of ``expected``, each once, in its order?"""
    rest = iter(expected)
    return all(any(row == e for e in rest) for row in rows)


def past_the_cut(rows, cut: int) -> int:
    """How many of the ``(sn, record)`` rows a sink committed derive from inputs past a
    checkpoint's ``cut`` (an output's SN begins with its input's)."""
    return sum(1 for sn, _ in rows if sn[0] > cut)


def test_a_killed_driver_of_a_kafka_job_run_again_ends_exactly_once(tmp_path, broker):
    """Kafka in, the topic's partitions read on the executors (``KafkaSplits``), and out
    through a transactional producer per partition on the executors: no record through
    the driver. The driver killed once a sink committed past the last complete
    checkpoint's cut (read from the sinks' state topic), and the program run again: it
    reads each partition on from where its checkpoint left it (the origin its first run
    recorded, the offsets beside the counts), and a ``read_committed`` reader sees the
    failure-free output key by key (the job numbers the splits' inputs in its own order;
    each key's inputs lie in one partition of the input topic, in order), each SN once
    and in order. The outputs a sink held past the restored cut (checked) must come again
    with the same SNs: the splits' logs' replay."""
    from experiments.kafka_io import Feed, read_output, read_output_sns
    from flux.connectors.file_source import FileSource

    expected = per_key(write_inputs(tmp_path / "in", 24_000))
    records = list(FileSource(str(tmp_path / "in")))
    topic_in, topic_out = broker.fresh_topic(3, prefix="in"), broker.fresh_topic(4, prefix="out")
    # fed from the job's start, 6K at 3000/s and then a trickle of 100/s, so the kill
    # lands mid-stream with inputs past the cut; held at 10K until the driver is dead:
    # the job cannot end before the kill (then the rest at 3000/s). The kill waits for a
    # sink to have committed past the newest complete checkpoint's cut, seen on a
    # progress line about once a second: that holds only while inputs flow (once the
    # feed holds, a last checkpoint covers every commit) and the job keeps up with them
    # (a cut falls at an epoch of the wall clock: none completes while the job works
    # through a backlog). 40 s of trickle: the job's first output comes within a second
    # or two of its start (it came after 3-37 s while the split readers waited on the
    # broker on their node's loop)
    feed = Feed(broker.bootstrap, topic_in, records, 3, 3000, hold_at=10_000,
                slow_after=(6_000, 100))
    args = ["--kafka", broker.bootstrap, "--input", topic_in, "--sink", topic_out,
            "--ending", json.dumps(feed.ending), "--checkpoint", str(tmp_path / "ckpt"),
            "--interval", "1", "--commit-every", "100"]
    fed = []
    try:
        # killed once a sink committed past the last complete checkpoint's cut
        run_then_kill(args, tmp_path / "first.log", on_start=lambda: fed.append(feed.start()),
                      ready=lambda x: bool(x["committed"]) and x["committed"][0] > x["cut"])
        first = read_output_sns(broker.bootstrap, topic_out)
        partial = per_key([((k,), r) for k, (_, r) in enumerate(first)])
        assert 0 < sum(map(len, partial.values())) < sum(map(len, expected.values()))
        # each partition commits by itself and a key's outputs spread over the partitions
        # (stage 2 is keyed by the count too): each key's are in the failure-free order,
        # not yet all of them
        assert all(in_order_within(rows, expected[key]) for key, rows in partial.items())
        feed.release()
        started, done = run_to_the_end(args, tmp_path / "second.log")
    finally:
        if fed:
            feed.stop()
    assert not feed.error
    assert started["checkpoint"] is not None and started["checkpoint"] >= 3
    assert past_the_cut(first, started["cut"])  # what the replay must number as before
    assert done["restarts"] == 0
    out = read_output(broker.bootstrap, topic_out)  # each partition in SN order, none twice
    assert per_key([((k,), r) for k, r in enumerate(out)]) == expected


def test_a_chaos_run_of_driver_kill_changes_nothing_in_the_output(tmp_path):
    """experiments.chaos's driver-kill scenario (its program runs its own Spark: this
    module holds none)."""
    from experiments.chaos import parse_args, run_one

    args = parse_args(["--scenarios", "driver-kill", "--packets", "30000", "--rate", "6000",
                       "--out", str(tmp_path)])
    run = run_one(None, 11, args)
    assert run.ok, f"seed {run.seed} {run.dataflow} {run.kills}: {run.why}"
    assert any("driver killed" in k for k in run.kills)
