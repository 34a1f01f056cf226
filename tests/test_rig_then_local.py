"""A local cluster after the rig, in one Python process (slow: Spark, root).

PySpark starts its JVM once per process, with the first session's settings as
the JVM's system properties, and every later session reads them as defaults:
the rig's driver address (on a bridge that is gone once the rig closes), its
core cap and executor size outlived it and broke the next local cluster. A
local cluster now sets what it needs itself; this runs the two in that order."""
from __future__ import annotations

import os

import pytest

from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.testing.workloads import packet_workload

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces)")]


@pytest.mark.timeout(400)
def test_a_local_cluster_after_the_rig_runs_on_loopback_with_its_own_executors():
    from flux.spark.job import FluxJob
    from flux.testing.rig import Rig
    from flux.spark.session import local_cluster

    with Rig(1) as rig:
        rig.session("flux-rig-first")
        rig_address = rig.address

    records = packet_workload(3000, seed=9, pairs=500, apps=5, sources=50)
    dataflow = paper_dataflow()
    with local_cluster(3) as spark:
        conf = spark.sparkContext.getConf()
        assert conf.get("spark.driver.host") == "127.0.0.1" != rig_address
        assert spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 == 3
        job = FluxJob(spark, dataflow, iter(records), nodes=2, standbys=1)
        with job:
            output = job.wait(timeout=120)
    expected = reference_output(dataflow, records, 2)
    assert output and [wire_form(x) for x in output] == [wire_form(x) for x in expected]
