"""The Structured Streaming side of the comparison, without Spark: its per-key functions
compute Flux's reference whatever the micro-batches, and the figures read off a timeline
are the ones a user would read off the plot."""
from __future__ import annotations

import random
import zlib
from collections import defaultdict

import pytest

pd = pytest.importorskip("pandas")

from experiments.structured_streaming import (  # noqa: E402
    FileFeed,
    duration_stats,
    matches_reference,
    reconstruct_sessions,
)
from experiments.vs_structured_streaming import parse_args, recovery_figures  # noqa: E402
from flux.examples import paper_dataflow  # noqa: E402
from flux.reference import reference_output  # noqa: E402
from flux.runtime.metrics import Metrics
from flux.testing.workloads import packet_workload  # noqa: E402


class FakeGroupState:
    """The part of pyspark's GroupState the functions use, kept in a dict."""

    def __init__(self, store: dict, key):
        self.store, self.key = store, key

    @property
    def exists(self) -> bool:
        return self.key in self.store

    @property
    def get(self):
        return self.store[self.key]

    def update(self, value) -> None:
        self.store[self.key] = value

    def remove(self) -> None:
        del self.store[self.key]


def run_micro_batches(func, batches, key_of, columns, store):
    """What applyInPandasWithState does per micro-batch: group the batch's rows by key
    (in no particular order), call ``func`` once per key with its frames and state.
    Returns each batch's output."""
    outputs = []
    for batch in batches:
        out = []
        outputs.append(out)
        groups = defaultdict(list)
        for row in batch:
            groups[key_of(row)].append(row)
        keys = list(groups)
        random.Random(len(batch)).shuffle(keys)  # Spark promises no order across keys
        for key in keys:
            mine = groups[key]
            half = len(mine) // 2  # one key's rows may come in several frames, unordered
            frames = [pd.DataFrame(part, columns=columns) for part in (mine[half:], mine[:half])
                      if part]
            for pdf in func(key, iter(frames), FakeGroupState(store, key)):
                out.extend(pdf.itertuples(index=False, name=None))
    return outputs


def random_runs(items, seed, most):
    """``items`` cut into consecutive runs of 1 to ``most``."""
    rng, i, runs = random.Random(seed), 0, []
    while i < len(items):
        n = rng.randint(1, most)
        runs.append(items[i:i + n])
        i += n
    return runs


def by_key(row):
    return (row[1], row[2])


def by_bucket(row):
    """Keys hashed into 3 groups, as ``--buckets 3`` does."""
    return zlib.crc32(repr(by_key(row)).encode()) % 3


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@pytest.mark.parametrize("seed, group", [(1, by_key), (2, by_key), (3, by_bucket)])
def test_the_two_stateful_functions_compute_the_reference_whatever_the_micro_batches(seed, group):
    records = packet_workload(2_000, seed=seed, pairs=1_000, apps=4, sources=50)
    packets = [(k + 1, *r) for k, r in enumerate(records)]
    sessions = run_micro_batches(reconstruct_sessions, random_runs(packets, seed, 400), group,
                                 ["isn", "src", "dst", "app", "kind", "ts"], {})
    # the second query reads whole batches of the first (the file sink commits a batch's
    # files at once, and a file source on it reads through that log), several at a time
    merged = [[row for out in run for row in out] for run in random_runs(sessions, seed, 3)]
    stats = run_micro_batches(duration_stats, merged, group,
                              ["isn", "app", "src", "duration", "ts_end"], {})
    stats = [row for out in stats for row in out]
    expected = reference_output(paper_dataflow(), records, 4)
    assert len(expected) > 100
    assert matches_reference(stats, expected)


def test_matches_reference_catches_a_lost_and_a_duplicated_output():
    expected = [((1, 1, 1), ("app0", 3, 10, 10.0, 7)), ((5, 1, 1), ("app1", 3, 4, 4.0, 9))]
    rows = [(1, "app0", 3, 10, 10.0, 7, 111), (5, "app1", 3, 4, 4.0, 9, 222)]
    assert matches_reference(rows[::-1], expected)  # order across keys does not matter
    assert not matches_reference(rows[:1], expected)
    assert not matches_reference(rows + rows[:1], expected)


def test_the_feed_writes_every_record_once_in_files_and_counts_arrivals(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    records = packet_workload(300, seed=1, pairs=200, apps=2, sources=10)
    m = Metrics(0.1)
    m.begin()
    feed = FileFeed(records, 3_000.0, str(folder), m, every=0.02).start()
    assert feed.done.wait(10)
    feed.stop()
    lines = [line for f in sorted(folder.iterdir()) for line in f.read_text().splitlines()]
    assert [int(line.split(",")[0]) for line in lines] == list(range(1, 301))
    assert lines[0].split(",")[1:] == [str(x) for x in records[0]]
    assert m.input_total == 300 and len(list(folder.iterdir())) > 1


def _timeline(outputs, latencies, interval=0.1):
    return [{"t_s": round(i * interval, 6), "outputs": n, "avg_latency_ms": lat}
            for i, (n, lat) in enumerate(zip(outputs, latencies))]


def test_recovery_figures_read_stall_resumption_and_return_to_normal():
    # 10 s of output at 20 ms latency, nothing from 5.0 to 6.0 s, then 3 s at 900 ms
    n = 150
    outputs = [5] * n
    latency = [20.0] * n
    for i in range(50, 60):
        outputs[i], latency[i] = 0, None
    for i in range(60, 90):
        latency[i] = 900.0
    fig = recovery_figures(_timeline(outputs, latency), kill_at=5.05)
    assert fig["normal_latency_ms"] == 20.0
    assert fig["stall_s"] == pytest.approx(1.0)
    assert fig["first_output_after_kill_s"] == pytest.approx(0.95)
    assert fig["peak_latency_ms"] == 900.0
    assert fig["recovered_after_kill_s"] == pytest.approx(3.95)
    assert fig["max_stall_before_kill_s"] == 0.0


def test_recovery_figures_say_never_when_latency_never_comes_back():
    outputs, latency = [5] * 100, [20.0] * 50 + [5000.0] * 50
    fig = recovery_figures(_timeline(outputs, latency), kill_at=5.0)
    assert fig["recovered_after_kill_s"] is None and fig["stall_s"] == 0.0


@pytest.mark.parametrize("argv, message", [
    (["--kill-at", "50"], "--kill-at must be within the run"),
    (["--rate", "0"], "--rate must be > 0"),
    (["--trigger", "-1"], "--trigger must be >= 0"),
    (["--partitions", "1"], "--partitions must be >= 2"),
    (["--buckets", "-1"], "--buckets must be >= 0"),
])
def test_bad_flags_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
