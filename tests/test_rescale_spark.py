"""A job run again with another ``nodes=`` on its checkpoint location resumes from the
checkpoint, each new partition starting from the key groups it owns (DESIGN 13): the sink
ends with the failure-free output, nothing lost or twice (slow: Spark)."""
from __future__ import annotations

import json

import pytest

from experiments.resumable_job import make_sink, read_sink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: executors of this module's Spark session: the larger job's 6 nodes
SPARK_EXECUTORS = 6


def write_inputs(folder, n: int) -> list:
    """``n`` keyed records in JSON-lines files; the failure-free output of the regrouping
    dataflow over them (the same at every partition count), as the sink reads it back."""
    from flux.connectors.file_source import FileSource
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.testing.dataflows import regrouping_dataflow
    from flux.testing.workloads import keyed_workload

    folder.mkdir(parents=True)
    records = keyed_workload(n, seed=7, keys=300)
    for i in range(3):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i::3])
    as_read = list(FileSource(str(folder)))
    return [(sn, wire_form(r)) for sn, r in reference_output(regrouping_dataflow(2), as_read, 5)]


@pytest.mark.parametrize("old, new", [(4, 6), (6, 3)])
def test_a_job_run_again_with_other_nodes_resumes_from_its_checkpoint(spark, tmp_path, old,
                                                                      new):
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    expected = write_inputs(tmp_path / "in", 24_000)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    first = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                    nodes=old, standbys=0, sink=make_sink("jsonl", out), checkpoint=ckpt,
                    checkpoint_interval=0.5)
    with first:
        assert first.wait_until(lambda: len(first.checkpoints.completed) >= 3, 120)
    partial = read_sink("jsonl", out)
    assert 0 < len(partial) < len(expected) and partial == expected[:len(partial)]

    second = FluxJob(spark, regrouping_dataflow(2), FileSource(str(tmp_path / "in")),
                     nodes=new, standbys=0, sink=make_sink("jsonl", out), checkpoint=ckpt)
    assert second.resumed_from["partitions"] == old and second.resumed_from["cut"] > 0
    with second:
        second.wait(timeout=240)
    assert read_sink("jsonl", out) == expected
    assert any(kind == "rescale" and what == (old, new)
               for _, kind, what in second.metrics.events)
