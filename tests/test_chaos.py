"""A short chaos run in CI: every scenario once, on one local-cluster (slow); the
scenarios of hosts run on the rig (tests/test_rig.py)."""
from __future__ import annotations

import pytest

from experiments.chaos import HOST_SCENARIOS, SCENARIOS, ExpectedOutput, parse_args, run_one

SLOW = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(900)]


@pytest.mark.parametrize("scenario", [pytest.param(s, marks=SLOW) for s in SCENARIOS
                                      if s not in HOST_SCENARIOS and s != "driver-kill"])
def test_a_chaos_run_of_each_scenario_changes_nothing_in_the_output(spark, scenario, tmp_path):
    args = parse_args(["--scenarios", scenario, "--packets", "40000", "--rate", "10000",
                       "--out", str(tmp_path)])
    run = run_one(spark, 11, args)
    log = "\n".join(f"{t:8.3f}s {what} {detail}" for t, what, detail in run.events)
    assert run.ok, f"seed {run.seed} {run.scenario} {run.dataflow} {run.kills}: {run.why}\n{log}"
    assert run.scenario == scenario and run.kills


@pytest.mark.parametrize("argv, message", [
    (["--runs", "0"], "--runs must be >= 1"),
    (["--packets", "10"], "--packets must be >= 1000"),
    (["--scenarios", "meteor"], "unknown scenarios ['meteor']"),
    (["--scenarios", "silent-host"], "silent-host, partition-heal need --hosts (the rig)"),
    (["--hosts", "3"], "--hosts must be >= 5"),
    (["--hosts", "5", "--scenarios", "driver-kill"], "driver-kill runs an embedded cluster"),
])
def test_bad_flags_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("scenario", [pytest.param(s, marks=SLOW) for s in
                                      ("double-restart", "same-pair")])
def test_a_chaos_run_with_an_egress_per_partition(spark, scenario, tmp_path):
    args = parse_args(["--scenarios", scenario, "--packets", "40000", "--rate", "10000",
                       "--per-partition", "--out", str(tmp_path)])
    run = run_one(spark, 12, args)
    log = "\n".join(f"{t:8.3f}s {what} {detail}" for t, what, detail in run.events)
    assert run.ok, f"seed {run.seed} {run.scenario} {run.dataflow} {run.kills}: {run.why}\n{log}"


def test_with_an_egress_per_partition_each_partition_is_checked_in_its_own_order():
    from flux.testing.dataflows import counting_dataflow
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(400, seed=1, keys=30)
    ordered = ExpectedOutput(counting_dataflow(2), records, per_partition=False)
    per = ExpectedOutput(counting_dataflow(2), records, per_partition=True)
    outputs = ordered.ordered
    interleaved = sorted(outputs, key=lambda o: (per.partition_of[o[0]], o[0]))
    assert interleaved != outputs
    assert per.equals(interleaved) and not ordered.equals(interleaved)
    assert ordered.equals(outputs) and per.equals(outputs)
    swapped = list(interleaved)
    first = next(i for i in range(len(swapped) - 1)
                 if per.partition_of[swapped[i][0]] == per.partition_of[swapped[i + 1][0]])
    swapped[first], swapped[first + 1] = swapped[first + 1], swapped[first]
    assert not per.equals(swapped)  # out of order within a partition
    assert per.is_prefix(interleaved[:100]) and not per.is_prefix(swapped)
    assert not per.equals(interleaved[:-1])  # one lost


def test_a_failed_run_names_the_detections_that_came_before_its_first_kill():
    """A false detection before the kills changes the scenario (CI once saw 'double' go on
    because a node had died at the start): a failed run's reason names it."""
    from experiments.chaos import detected_before_the_first_kill

    events = [(0.004, "detected", "node2 (its connection dropped)"),
              (0.013, "take-over done", "2.1P"),
              (1.216, "killed", "node3 (worker)"),
              (1.243, "detected", "node3 (its connection dropped)")]
    assert detected_before_the_first_kill(events) == ["node2 (its connection dropped)"]
    assert detected_before_the_first_kill(events[1:]) == []
    assert detected_before_the_first_kill(events[:2]) == []  # no kill: nothing to compare
