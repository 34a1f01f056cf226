"""Autoscaling (``flux.Autoscale``, docs/api.md): a job of 2 pairs with ``max_nodes=4``
whose feed runs at 3 500 inputs/s and then at 800 grows to 4 pairs live and shrinks back
to 2, without a restart; the sink holds the failure-free output (slow: Spark)."""
from __future__ import annotations

import pytest

from experiments.resumable_job import make_sink, read_sink
from test_rescale_spark import write_inputs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: 2 nodes and 2 standbys, and room for the 6 tasks a restart after the growth runs
SPARK_EXECUTORS = 6

FAST, SLOW, FAST_FOR = 3500, 800, 12.0


def test_a_job_grows_with_its_input_rate_and_shrinks_back_live(spark, tmp_path):
    from controller.autoscale import Autoscale
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    fast = int(FAST * FAST_FOR)
    expected = write_inputs(tmp_path / "in", fast + SLOW * 20)
    feed = Paced(FileSource(str(tmp_path / "in")), FAST, then=((fast, SLOW),))
    job = FluxJob(spark, regrouping_dataflow(2), feed, nodes=2, max_nodes=4, standbys=2,
                  sink=make_sink("jsonl", str(tmp_path / "out")),
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0,
                  autoscale=Autoscale(rate_per_pair=1000, every=2.0, down_looks=2))
    with job:
        assert job.wait_until(lambda: job.running_pairs == 4, 120)
        assert job.wait_until(lambda: job.running_pairs == 2, 120)
        job.wait(timeout=300)
    decisions = [what for _, kind, what in job.metrics.events if kind == "autoscaled"]
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    # up at once to what 3 500/s needs, then down as the slower rate shows (a look whose
    # window straddles the change may stop at 3 first)
    assert decisions[0][:2] == (2, 4) and decisions[0][2] > 3000
    downs = [d[1] for d in decisions[1:]]
    assert downs and downs[-1] == 2 and downs == sorted(downs, reverse=True)
    assert decisions[-1][2] < 2000
