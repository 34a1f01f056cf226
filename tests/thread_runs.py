"""A dataflow on a ThreadCluster against its reference, with or without a kill: the
runs the tests of operators on batches share."""
from __future__ import annotations

import time

from flux.operator import wire_form
from flux.reference import ReferenceRun, reference_output
from flux.testing.threads import ThreadCluster


def paced(records, every=50, pause=0.003):
    for k, r in enumerate(records):
        if k % every == 0:
            time.sleep(pause)
        yield r


def run(dataflow, records, partitions=3, kill=None, **knobs):
    """The cluster after the run (``kill``: a node killed once a third of the output is
    out) and the reference output."""
    expected = reference_output(dataflow, records, partitions)
    cluster = ThreadCluster(dataflow, partitions, paced(records) if kill else iter(records),
                            standbys=1, **knobs)
    with cluster:
        if kill:
            assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 3, 60)
            cluster.kill(kill)
        cluster.wait_until(lambda: len(cluster.delivered) >= len(expected) and
                           not cluster.recovery.pending() or cluster.errors, 60)
    return cluster, expected


def assert_exact_and_caught_up_in_parts(cluster, expected):
    """No error, the reference output, and every rebuilt replica installed bulk parts
    (the two-phase catch-up of a keyed store), not a whole state."""
    assert not cluster.errors and not cluster.controller.error
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
    rebuilt = [m for loop in cluster.loops.values() for m in loop.host.machines.values()
               if getattr(m, "installed", None)]
    assert rebuilt and all(m.installed["parts"] > 0 for m in rebuilt), \
        [m.installed for m in rebuilt]


def reference_by_partition(dataflow, records, partitions):
    """The failure-free outputs, and each last-stage partition's (in wire form)."""
    run = ReferenceRun(dataflow, partitions)
    outputs = [o for r in records for o in run.feed(r)]
    by: dict = {}
    for output, p in zip(outputs, run.output_partitions):
        by.setdefault(p, []).append(wire_form(output))
    return outputs, by
