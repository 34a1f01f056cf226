"""The scale experiment: its model, and a short run end to end (slow: Spark)."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from experiments.scale import cpu_seconds, fit, line, summarize

pytestmark = pytest.mark.timeout(600)


def test_the_fits_find_a_share_per_node_and_a_cost_per_second_and_per_input():
    a, b = fit({2: 150 / 2 + 3, 4: 150 / 4 + 3, 8: 150 / 8 + 3})
    assert a == pytest.approx(150) and b == pytest.approx(3)
    t, c = line({1000: 0.1 + 0.02, 4000: 0.1 + 0.08, 9000: 0.1 + 0.18})
    assert t == pytest.approx(0.1) and c == pytest.approx(20e-6)


def rows_of(nodes, rate, per_second, per_input_us):
    """One run's rows: each kind's busy share ``t + c * rate``."""
    out = []
    for role, kind in [("driver", "driver"), ("ingress", "ingress")] + [
            (f"node{i}", "node") for i in range(nodes)]:
        t, c = per_second[kind], per_input_us[kind](nodes) / 1e6
        busy = t + c * rate
        out.append(dict(run=0, nodes=nodes, rate=rate, role=role, kind=kind,
                        input_rate=float(rate), busy_share=busy,
                        cpu_us_per_input=busy / rate * 1e6))
    return out


def test_the_model_checks_itself_and_projects_what_limits_the_job():
    per_second = {"driver": 0.05, "ingress": 0.2, "node": 0.1}
    per_input = {"driver": lambda n: 3.0, "ingress": lambda n: 5.0,
                 "node": lambda n: 120 / n + 2}
    rows = [r for n in (2, 4, 8) for rate in (1000, 3000, 6000)
            for r in rows_of(n, rate, per_second, per_input)]
    s = summarize(rows, argparse.Namespace(rates=[1000, 3000, 6000]))
    assert s["measured"]["2 nodes at 6000/s"]["busiest"] == "node"
    model = s["model"]
    assert model["node_per_input_us"] == {"a": pytest.approx(120), "b": pytest.approx(2)}
    check = model["fits"]["ingress"][4]["check"]
    assert check["predicted"] == pytest.approx(check["measured"])
    # 2 nodes: a node pays 62 us per input; 64 nodes: the ingress's 5 us caps the job
    assert model["projection"][2]["limited_by"] == "node"
    assert model["projection"][64] == {"ceiling_inputs_per_s": 160_000,
                                       "limited_by": "ingress",
                                       "without_driver_and_ingress": 232_258}


def test_cpu_of_a_process_that_is_gone_is_none():
    import os

    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2 ** 22 + 7) is None


@pytest.mark.slow
def test_a_short_run_on_a_local_cluster_writes_every_process(tmp_path):
    from experiments.scale import main

    out = tmp_path / "scale"
    assert main(["--local", "--nodes", "2", "--rates", "1000", "2000", "--warmup", "3",
                 "--window", "3", "--source", "driver", "splits", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    kinds = summary["measured"]["2 nodes at 2000/s"]["kinds"]
    assert {"driver", "ingress", "node"} <= set(kinds)
    # splits read on the executors: no ingress process, and the inputs counted still
    split = summary["measured"]["2 nodes at 2000/s, splits read on executors"]
    assert "ingress" not in split["kinds"] and split["input_rate"] > 0
    # the Python processes work for every input; a JVM may idle through a short window
    assert all(kinds[k]["median_us"] > 0 for k in ("driver", "ingress", "node"))
    # two 3-second windows on a shared machine fit a line, not a trustworthy slope (once
    # -9.8 us): the fits' arithmetic is tested above on known points
    fit = summary["model"]["fits"]["ingress"]["2"]
    assert math.isfinite(fit["per_input_us"]) and math.isfinite(fit["per_second"])
