"""The scale experiment: its model, and a short run end to end (slow: Spark)."""
from __future__ import annotations

import json

import pytest

from experiments.scale import cpu_seconds, fit, summarize

pytestmark = pytest.mark.timeout(600)


def test_the_model_fits_a_share_per_node_and_a_cost_per_item():
    a, b = fit({2: 150 / 2 + 3, 4: 150 / 4 + 3, 8: 150 / 8 + 3})
    assert a == pytest.approx(150) and b == pytest.approx(3)


def test_the_summary_finds_the_busiest_process_and_projects_a_ceiling():
    rows = []
    for nodes in (2, 4, 8):
        rows += [dict(run=0, nodes=nodes, role="driver", kind="driver", input_rate=100.0,
                      cpu_us_per_input=10.0),
                 dict(run=0, nodes=nodes, role="ingress", kind="ingress", input_rate=100.0,
                      cpu_us_per_input=20.0)]
        rows += [dict(run=0, nodes=nodes, role=f"node{i}", kind="node", input_rate=100.0,
                      cpu_us_per_input=120 / nodes + 1 + i / 10) for i in range(nodes)]
    s = summarize(rows, argparse_like())
    assert s["by_nodes"][2]["busiest"] == "node" and s["by_nodes"][8]["busiest"] == "ingress"
    assert s["model"]["projection"][64]["limited_by"] == "ingress"
    assert s["model"]["projection"][64]["ceiling_inputs_per_s"] == 50_000


def argparse_like():
    import argparse

    return argparse.Namespace(rate=100)


def test_cpu_of_a_process_that_is_gone_is_none():
    import os

    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2 ** 22 + 7) is None


@pytest.mark.slow
def test_a_short_run_on_a_local_cluster_writes_every_process(tmp_path):
    from experiments.scale import main

    out = tmp_path / "scale"
    assert main(["--local", "--nodes", "2", "--runs", "1", "--warmup", "3", "--window",
                 "3", "--rate", "2000", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    kinds = summary["by_nodes"]["2"]["kinds"]
    assert {"driver", "ingress", "node"} <= set(kinds)
    assert all(k["median_us"] > 0 for k in kinds.values())
