"""The failover experiment runs end to end and writes what it promises (slow: Spark)."""
from __future__ import annotations

import csv
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("mb", [8.5, 100.0])
def test_a_kill_with_state_of_real_size_is_masked_without_a_false_detection(tmp_path, mb):
    """8.5 MB of state per partition (the paper's size) and 100 MB. One kill used to end
    the job (live nodes installing or sending state were declared dead); now the pair is
    rebuilt, nothing is lost and no live process is declared dead. (Two partitions lose
    a replica: both move their state.) The experiment writes its timeline, summary and
    plot."""
    from experiments.failover import main

    out = tmp_path / "failover"
    duration = 16 if mb > 10 else 10
    status = main(["--duration", str(duration), "--kill-at", "4", "--rate", "2000",
                   "--state-mb", str(mb), "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["false_detections"] == [], summary["events"]
    assert summary["dropped_inputs"] == 0 and summary["output_matches_reference"] is True
    assert summary["kill_at_s"] < summary["detected_s"] <= summary["takeover_done_s"] \
        < summary["catchup_done_s"]
    assert summary["state_bytes_moved"] > 2 * mb * 0.95e6
    assert summary["max_catchup_pause_s"] is not None
    for key in ("input_rate_tps", "output_rate_tps", "state_move_s", "max_output_gap_s",
                "flush_interval_s"):
        assert summary[key] >= 0, key
    rows = list(csv.DictReader(open(out / "timeline.csv")))
    assert sum(int(r["inputs"]) for r in rows) == duration * 2000
    assert (out / "failover.png").stat().st_size > 10_000
    assert status == 0


def test_the_failover_main_job_runs_with_operators_on_arrow_batches(tmp_path):
    """``--vectorized``: the paper's dataflow with its operators on batches, a node killed
    at full speed of the feed; the output is the per-record reference, nothing dropped."""
    from experiments.failover import main

    out = tmp_path / "failover"
    status = main(["--quick", "--vectorized", "--duration", "8", "--kill-at", "4",
                   "--rate", "20000", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0
    assert summary["dropped_inputs"] == 0 and summary["output_matches_reference"] is True
    assert summary["kill_at_s"] < summary["detected_s"] <= summary["takeover_done_s"] \
        < summary["catchup_done_s"]
    assert summary["state_bytes_moved"] > 0


def test_the_failover_main_job_runs_at_the_full_rate_of_a_columnar_feed(tmp_path):
    """``--arrow-feed --max-rate``: the packets handed over as Arrow batches, so the job
    runs at its own full rate, with items of 8192 inputs; a node killed half-way through
    the inputs; the output is the per-record reference, nothing dropped."""
    from experiments.failover import main

    out = tmp_path / "failover"
    status = main(["--quick", "--vectorized", "--max-rate", "--arrow-feed", "--batch-rows",
                   "8192", "--duration", "8", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0
    assert summary["dropped_inputs"] == 0 and summary["output_matches_reference"] is True
    assert summary["batch_rows"] == 8192 and summary["arrow_feed"] is True
    assert summary["kill_at_s"] < summary["detected_s"] <= summary["takeover_done_s"] \
        < summary["catchup_done_s"]
    assert summary["max_output_gap_after_kill_s"] is not None


def test_the_failover_refuses_an_arrow_feed_it_cannot_give():
    from experiments.failover import parse_args

    for argv in (["--arrow-feed", "--max-rate"], ["--arrow-feed", "--vectorized"],
                 ["--arrow-feed", "--vectorized", "--max-rate", "--kafka"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    assert parse_args(["--arrow-feed", "--vectorized", "--max-rate"]).arrow_feed


def test_cluster_pairs_rebuild_the_failed_set_by_a_restart_and_the_output_stays_exact(tmp_path):
    """``--replication cluster-pairs`` (the paper's baseline, 4.2): the victim's whole
    replica set fails; a checkpoint cut after the loss (the surviving set's consistent
    snapshot) completes, and the job restarts from it, which rebuilds the set: a stall
    of the output, and the output equal to the failure-free run's."""
    from experiments.failover import main

    out = tmp_path / "failover"
    status = main(["--quick", "--replication", "cluster-pairs", "--duration", "10",
                   "--kill-at", "4", "--rate", "5000", "--checkpoint-interval", "1",
                   "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0, summary["events"]
    assert summary["dropped_inputs"] == 0 and summary["output_matches_reference"] is True
    events = [what for _, what, _ in summary["events"]]
    assert "set lost" in events and "restart" in events
    assert summary["kill_at_s"] < summary["detected_s"] < summary["restart_s"]
    assert summary["data_again_after_kill_s"] is not None
    assert summary["catchup_done_s"] is None  # not replica by replica


def test_the_rescale_experiment_restores_at_both_counts_exactly(tmp_path):
    """``experiments.rescale``: a checkpoint built at 2 nodes restored at 3 (split by key
    group) and at 2, each writing its timings, the outputs after the cut exact."""
    from experiments.rescale import main

    out = tmp_path / "rescale"
    status = main(["--keys", "4000", "--then", "500", "--old", "2", "--new", "3", "--runs",
                   "1", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0 and summary["rescale_exact"] and summary["same_exact"]
    assert summary["build"]["cut"] > 0 and summary["build"]["megabytes"] > 0.5
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert {(r["mode"], r["nodes"], r["from_partitions"]) for r in rows} == {
        ("rescale", "3", "2"), ("same", "2", "2")}
    assert (out / "rescale.png").stat().st_size > 0


def test_the_running_rescale_experiment_rescales_both_egress_modes_exactly(tmp_path):
    """``experiments.running_rescale``: ``job.rescale(3)`` of a job of 2 nodes with one
    ordered egress and with a sink per partition (drained), each exact, with the
    rescale's duration and the longest output gap."""
    from experiments.running_rescale import main

    out = tmp_path / "running_rescale"
    status = main(["--inputs", "8000", "--rate", "3000", "--old", "2", "--new", "3",
                   "--runs", "1", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0 and summary["ordered_exact"] and summary["drained_exact"]
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert {r["mode"] for r in rows} == {"ordered", "drained"}
    assert all(float(r["longest_gap_s"]) > 0 and float(r["rescale_s"]) > 0 for r in rows)


@pytest.mark.parametrize("sinks", [[], ["--sink-per-partition"]],
                         ids=["one-sink", "sink-per-partition"])
def test_the_live_rescale_experiment_spreads_the_keys_live_exactly(tmp_path, sinks):
    """``experiments.live_rescale``: 2 -> 4 -> 3 among 4 pairs, no restart: each
    rescale's ranges moved, the destinations' pauses, the output exact (with a sink per
    partition too, where the moves change the keys' sink partitions)."""
    from experiments.live_rescale import main

    out = tmp_path / "live_rescale"
    status = main(["--pairs", "4", "--counts", "2,4,3", "--mb", "0.5", "--settle", "2",
                   "--runs", "1", "--out", str(out), *sinks])
    summary = json.loads((out / "summary.json").read_text())
    assert status == 0 and summary["exact"]
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert [r["rescale"] for r in rows] == ["2->4", "4->3"]
    assert [int(r["ranges"]) for r in rows] == [3, 3]  # GroupMap.moves_to's runs
    assert all(float(r["longest_pause_s"]) >= 0 for r in rows)
    assert (out / "live_rescale.png").stat().st_size > 0
