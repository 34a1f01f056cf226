"""The partition-pauses experiment: its measure of waits, and a short run end to end
(slow: Spark)."""
from __future__ import annotations

import json

import pytest

from experiments.partition_pauses import largest_gap, summarize

pytestmark = pytest.mark.timeout(600)


def test_the_largest_gap_counts_the_waits_that_ended_in_the_window():
    times = [0.0, 1.0, 1.5, 4.0, 4.1, 9.0]
    assert largest_gap(times, 0.0, 4.1) == 2.5  # 1.5 -> 4.0
    assert largest_gap(times, 4.0, 8.0) == pytest.approx(0.1)  # 9.0 ended after the window
    assert largest_gap(times, 4.1, 9.0) == pytest.approx(4.9)
    assert largest_gap([], 0.0, 1.0) == 0.0


def test_the_summary_splits_touched_from_untouched_partitions_per_mode():
    rows = [dict(mode=m, partition=p, touched=p < 2, same_as_failure_free=True,
                 largest_gap_before_s=0.01, largest_gap_after_s=(0.2 if p < 2 else gap))
            for m, gap in (("ordered", 0.2), ("per-partition", 0.05)) for p in range(4)]
    s = summarize(rows, ["ordered", "per-partition"])
    assert s["ordered"]["largest_gap_after_kill_untouched_s"]["median"] == 0.2
    assert s["per-partition"]["largest_gap_after_kill_untouched_s"]["median"] == 0.05
    assert s["per-partition"]["largest_gap_after_kill_touched_s"]["n"] == 2
    assert s["per-partition"]["every_partition_same_as_failure_free"] is True


@pytest.mark.slow
def test_a_short_run_writes_its_rows_and_summary(tmp_path):
    from experiments.partition_pauses import main

    out = tmp_path / "pauses"
    assert main(["--runs", "1", "--duration", "8", "--kill-at", "3", "--state-mb", "2",
                 "--modes", "ordered", "per-partition", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for mode in ("ordered", "per-partition"):
        assert summary[mode]["every_partition_same_as_failure_free"] is True
        assert summary[mode]["largest_gap_after_kill_untouched_s"]["n"] == 2
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 2 * 4
    # each kill's events, placed after it: the detection comes first
    events = (out / "events.csv").read_text().splitlines()
    assert events[0] == "run,mode,after_kill_s,event,detail" and len(events) > 2


def test_a_timed_file_sink_keeps_each_output_once_with_when_it_came(tmp_path):
    from experiments.partition_pauses import TimedFiles, by_key

    files = TimedFiles(str(tmp_path))
    sink = files(0)
    sink.write([((1, 0), ("k", 1)), ((2, 0), ("j", 1))])
    sink.commit((2, 0))
    again = files(0)  # a writer started again reads what was committed
    assert again.committed() == (2, 0)
    again.write([((2, 0), ("j", 1)), ((3, 0), ("k", 2))])  # the first is a replay
    again.close()
    rows = files.read(0)
    assert [sn for _, sn, _ in rows] == [[1, 0], [2, 0], [3, 0]]
    assert all(a <= b for a, b in zip([t for t, _, _ in rows], [t for t, _, _ in rows][1:]))
    assert by_key([[sn, r] for _, sn, r in rows]) == {'"k"': [["k", 1], ["k", 2]],
                                                      '"j"': [["j", 1]]}


def test_split_sources_are_refused_with_the_ordered_mode():
    from experiments.partition_pauses import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--splits", "3", "--modes", "ordered", "per-partition"])
    assert parse_args(["--splits", "3", "--modes", "per-partition"]).splits == 3


def test_the_control_spins_its_processes_for_the_time_asked_and_leaves_none():
    import os
    import time

    from experiments.partition_pauses import burn

    before = set(os.listdir("/proc"))
    started = time.monotonic()
    burn(2, 0.3)
    took = time.monotonic() - started
    assert 0.3 <= took < 10
    children = [p for p in set(os.listdir("/proc")) - before if p.isdigit()
                and os.path.exists(f"/proc/{p}/stat")
                and open(f"/proc/{p}/stat").read().split()[3] == str(os.getpid())]
    assert children == []
