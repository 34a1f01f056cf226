"""The MTTF experiment: the simulation agrees with the first-order formulas, and the
shapes are the paper's (cluster pairs fall off quadratically, Flux linearly)."""
from __future__ import annotations

import json
import random

import pytest

from experiments.mttf import first_order, main, monte_carlo, paper

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["cluster-pairs", "flux-machine-pairs", "flux-chained"])
def test_the_simulated_mttf_is_the_first_order_formula_within_noise(kind):
    rng = random.Random(3)
    simulated = monte_carlo(kind, 8, 200.0, 600, rng)
    expected = first_order(kind, 8, 1.0, 1 / 200, 1 / 200)
    assert abs(simulated - expected) / expected < 0.2


def test_cluster_pairs_fall_off_with_n_squared_and_flux_with_n():
    assert paper("cluster-pairs", 16, 1.0, 1.0, 1.0) / paper("cluster-pairs", 32, 1.0, 1.0, 1.0) == 4
    assert paper("flux-chained", 16, 1.0, 1.0, 1.0) / paper("flux-chained", 32, 1.0, 1.0, 1.0) == 2


def test_the_experiment_reads_the_mttr_of_the_failover_summary_and_writes_its_files(tmp_path):
    failover = tmp_path / "summary.json"
    failover.write_text(json.dumps({"catchup_after_kill_s": 0.5}))
    out = tmp_path / "mttf"
    assert main(["--failover-summary", str(failover), "--nodes", "4,8", "--runs", "20",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mttr_s"] == 0.5 and len(summary["rows"]) == 6
    assert (out / "mttf.png").stat().st_size > 10_000 and (out / "mttf.csv").exists()


def test_without_a_failover_summary_it_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run experiments.failover first"):
        main(["--failover-summary", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
