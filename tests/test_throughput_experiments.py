"""The figures of experiments.throughput and experiments.overhead: medians with
their spread, ratios per round, never one run."""
from __future__ import annotations

import sys
import time

from experiments.overhead import summarize, table
from experiments.throughput import DriverWakeups, operators_alone, spread
from flux.examples import paper_dataflow
from flux.reference import reference_output
from flux.testing.workloads import packet_workload


def test_ratios_are_taken_per_round_and_reported_with_their_spread():
    rates = [(10.0, 5.0, 4.5), (12.0, 6.0, 6.6), (8.0, 4.0, 3.6)]
    rows = [{"round": r, "mode": m, "input_rate_tps": v}
            for r, rate in enumerate(rates) for m, v in zip(("none", "cluster-pairs", "flux"), rate)]
    s = summarize(rows, ["none", "cluster-pairs", "flux"])
    assert s["modes"]["flux"] == {"median": 4.5, "min": 3.6, "max": 6.6, "n": 3}
    assert s["flux_vs_cluster_pairs"] == {"median": 0.9, "min": 0.9, "max": 1.1, "n": 3}
    assert "| flux vs cluster pairs | 0.9 | 0.9-1.1 |" in table(s)


def test_spread_is_median_min_max():
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}


def test_the_operators_alone_run_emits_what_the_dataflow_emits():
    """The ceiling measured is the same work: every final output of the dataflow (a single
    partition, so the same per-key order)."""
    records = packet_workload(2000, seed=3, pairs=200, apps=3, sources=20)
    assert operators_alone(paper_dataflow(), records)() == len(
        reference_output(paper_dataflow(), records, 1))


def test_a_thread_that_holds_the_gil_makes_the_driver_wakeups_late():
    """What the wake-up figure measures: a thread of pure Python work keeps the sleeper
    waiting for the GIL about one switch interval (5 ms) after each 1 ms sleep."""
    with DriverWakeups() as wakeups:
        end = time.perf_counter() + 0.3
        n = 0
        while time.perf_counter() < end:
            n += 1
    assert len(wakeups.late) >= 10
    assert wakeups.p99_ms() >= 0.5 * sys.getswitchinterval() * 1000


def test_the_floor_counts_what_crosses_a_process_and_adds_up():
    """experiments.throughput_floor: the tuples counted per stage are the reference's own
    (the final outputs are its output), and the floor is the sum it says it is."""
    from experiments.throughput_floor import floor, tuples_per_stage

    records = packet_workload(3000, seed=3, pairs=300, apps=3, sources=30)
    into_first, into_second, final = tuples_per_stage(paper_dataflow(), records, 2)
    assert into_first == 1.0
    assert final * len(records) == len(reference_output(paper_dataflow(), records, 2))
    f = floor(records, partitions=2, batch=64, repeats=1)
    cost = {k: v["median"] for k, v in {**f["us_per_input"], **f["us_per_tuple"]}.items()}
    assert all(v > 0 for v in cost.values())
    assert f["receives_per_input"] == round(2 * (1 + into_second) + final, 3)
    expected = (2 * cost["reference"] - cost["routing_to_the_first_stage"] + cost["hand_over"]
                + f["receives_per_input"] * (cost["decode"] + cost["transport"] / 2)
                + f["encodes_per_input"] * (cost["encode"] + cost["transport"] / 2))
    assert abs(f["floor_us_per_input"] - expected) < 0.05
    # the medians above are rounded to 3 decimals, the budget from the unrounded one to 2
    assert abs(f["target_budget_us_per_input"] - 4 * cost["operators_alone"]) <= 4 * 5e-4 + 5e-3


def test_the_message_cost_is_both_processes_cpu_over_every_envelope_sent():
    """experiments.message_cost: every message arrives (else it raises), and the cost per
    envelope is the sender's and the receiver's CPU over all the envelopes."""
    import argparse

    from experiments.message_cost import one_run, summarize

    args = argparse.Namespace(messages=40, size=100, nap=0.0)
    row = one_run(3, args)
    assert row["per_message"] == 3 and row["messages"] == 40
    assert row["us_per_envelope"] > 0
    assert abs(row["us_per_envelope"] - row["sender_us_per_envelope"]
               - row["receiver_us_per_envelope"]) <= 0.02
    assert summarize([row, {**row, "us_per_envelope": 1.0}])["us_per_envelope"]["3"][
        "min"] == 1.0


def test_item_sizes_are_compared_per_round_against_the_largest():
    from experiments.item_size import summarize

    rows = [{"round": r, "batch_rows": b, "input_rate_tps": v, "output_matches_reference": True}
            for r, pair in enumerate([(300.0, 200.0), (250.0, 200.0), (280.0, 140.0)])
            for b, v in zip((16384, 8192), pair)]
    s = summarize(rows, [16384, 8192])
    assert s["input_rate_tps"]["8192"] == {"median": 200.0, "min": 140.0, "max": 200.0, "n": 3}
    assert s["vs_largest"] == {"8192": {"median": 0.667, "min": 0.5, "max": 0.8, "n": 3}}
    assert s["all_exact"]
    rows[0]["output_matches_reference"] = False
    assert not summarize(rows, [16384, 8192])["all_exact"]


def test_the_item_floor_does_the_jobs_work_and_adds_up():
    """experiments.item_floor: items of several sizes give the reference's output with
    both kinds of operators (so the floor times the job's work), and the floor is the
    sum of its pieces as the replicas pay them."""
    from experiments.item_floor import item_floor

    records = packet_workload(3000, seed=3, pairs=300, apps=3, sources=30)
    for kind in ("per-record", "vectorized"):
        f = item_floor(kind, records, partitions=3, batch_rows=700, repeats=1)
        assert f["outputs_exact"] is True, kind
        paid = {k: v["median"] for k, v in f["us_per_input_as_paid"].items()}
        assert all(v >= 0 for v in paid.values()) and paid["s1_operators"] > 0
        pieces = sum(v for k, v in paid.items() if k != "all")
        assert abs(paid["all"] - pieces) < 0.01 * len(paid)  # each rounded to 3 decimals
        assert abs(f["floor_us_per_input"] - paid["all"]) < 1e-3


def test_the_item_floors_output_check_can_fail():
    """An item pipeline whose consumers take an item's sub-items one producer after
    another, not merged by row SN, gives other output: the check is not vacuous."""
    import numpy as np

    from experiments import item_floor as floor_module
    from flux.operator import wire_form

    records = packet_workload(3000, seed=3, pairs=100, apps=3, sources=30)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, 3)]
    runs = [records[i:i + 100] for i in range(0, len(records), 100)]

    def concatenated(parts):
        sns = np.vstack([part.sns for part in parts])
        return type(parts[0]).merge_parts(parts, sns, np.arange(len(sns)))

    pipe = floor_module.ItemPipeline(paper_dataflow(), 3)
    pipe.run(runs, 250)
    assert [wire_form(x) for x in pipe.outputs] == expected
    broken = floor_module.ItemPipeline(paper_dataflow(), 3)
    merged = floor_module.merge
    floor_module.merge = concatenated
    try:
        broken.run(runs, 250)
    finally:
        floor_module.merge = merged
    assert [wire_form(x) for x in broken.outputs] != expected


def test_the_floor_in_processes_at_once_returns_each_ones_and_leaves_none_running():
    import multiprocessing

    from experiments.item_floor import floor_at_once

    records = packet_workload(2000, seed=3, pairs=200, apps=3, sources=20)
    floors = floor_at_once("vectorized", records, 3, partitions=2, batch_rows=500)
    assert len(floors) == 3 and all(f > 0 for f in floors)
    assert multiprocessing.active_children() == []
