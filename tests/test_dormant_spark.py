"""Pairs started at a live rescale (docs/design/rescaling.md): a job built with
``max_nodes=6`` runs 4 pairs, and ``job.rescale(6)`` starts the 2 dormant ones on its
standbys and spreads the key groups over all 6 while it runs, without a restart; the
sink ends with the failure-free output, nothing lost or twice, through a kill of a
started pair's node during the move and a restart after the growth (slow: Spark)."""
from __future__ import annotations

import threading

import pytest

from experiments.resumable_job import make_sink, read_sink
from flux.addresses import P, S, Addr
from test_rescale_spark import write_inputs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: 4 nodes and 2 standbys, and room for the 8 tasks a restart after the growth runs
SPARK_EXECUTORS = 8


def growing_job(spark, tmp_path, rate: int = 4000, nodes: int = 4, max_nodes: int = 6,
                standbys: int = 2):
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    return FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), rate),
                   nodes=nodes, max_nodes=max_nodes, standbys=standbys,
                   sink=make_sink("jsonl", str(tmp_path / "out")),
                   checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)


def events(job, kind: str) -> list:
    return [what for _, k, what in job.metrics.events if k == kind]


def test_rescale_starts_dormant_pairs_on_standbys_live_and_the_output_is_exact(spark,
                                                                                tmp_path):
    """rescale(6) of a 4-pair job with max_nodes=6: pairs 4 and 5 start on the two
    standbys (one view), the key groups of both stages spread over six pairs at a cut
    chosen after every process applied it; the node of a started pair's replica is
    killed while the groups move (its replica is rebuilt on the standby Spark's retry
    registers). No restart; every stage's groups are even over 6; the sink holds the
    failure-free output."""
    from flux.runtime.checkpoint_store import CheckpointStore

    expected = write_inputs(tmp_path / "in", 40_000)
    job = growing_job(spark, tmp_path)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        assert job.running_pairs == 4 and job.key_group_owners(1)[-1] == 3
        store = CheckpointStore(str(tmp_path / "ckpt"))
        before = store.manifest(store.complete_ids()[-1])
        done: list = []
        grower = threading.Thread(target=lambda: done.append(job.rescale(6, timeout=120)))
        grower.start()
        assert job.wait_until(lambda: events(job, "pairs started"), 120)
        victim = job.controller.recovery.node_of[Addr(1, 4, P)]
        job.kill_node(victim)
        grower.join(150)
        assert done == [None]
        assert job.running_pairs == 6
        job.wait(timeout=300)
        moved = [m for _, k, m in job.metrics.events if k == "range moved"]
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    assert events(job, "pairs started")[0][:2] == (4, 6)
    assert {m[4] for m in moved} >= {4, 5}  # ranges went to the started pairs
    for stage in (1, 2):
        owners = job.key_group_owners(stage)
        assert sorted(set(owners)) == list(range(6))
        assert owners == sorted(owners)  # contiguous ranges, as a job of 6 nodes has them
    assert set(before["groups"]["1"]) == set(range(4))  # on 4 of the 6 partitions
    last = store.manifest(store.complete_ids()[-1])
    assert "groups" not in last  # contiguous ranges over all 6: no map to write


def test_a_restart_after_the_growth_runs_every_pair_owning_keys(spark, tmp_path):
    """After rescale(6), both replicas of started pair 5's stage 1 are killed: the job
    restarts from its newest complete checkpoint, which runs the six pairs that own keys
    there (or four, from a checkpoint before the move: the pairs are dormant again and
    the keys back where that checkpoint had them); the sink holds the failure-free
    output."""
    expected = write_inputs(tmp_path / "in", 40_000)
    job = growing_job(spark, tmp_path)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(6, timeout=120)
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 6, 120)
        where = job.controller.recovery.node_of
        for replica in (P, S):
            job.kill_node(where[Addr(1, 5, replica)])
        job.wait(timeout=300)
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert len(job.restart_log) == 1
    assert job.running_pairs == 6


def test_a_job_grows_twice_and_the_second_pairs_route_by_the_maps_the_first_made(spark,
                                                                                tmp_path):
    """2 -> 3 -> 4 pairs: the replicas started at the second growth route by the maps the
    first one's moves made (their producers forgot telling those moves by then), so the
    second spread's moves find their sources; exact, no restart."""
    expected = write_inputs(tmp_path / "in", 30_000)
    job = growing_job(spark, tmp_path, nodes=2, max_nodes=4, standbys=4)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(3, timeout=120)
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 5, 120)
        job.rescale(4, timeout=120)
        assert job.running_pairs == 4
        job.wait(timeout=300)
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    assert [e[:2] for e in events(job, "pairs started")] == [(2, 3), (3, 4)]
    for stage in (1, 2):
        assert sorted(set(job.key_group_owners(stage))) == list(range(4))


def test_pairs_leave_at_a_rescale_to_fewer_and_join_again_through_a_kill(spark, tmp_path):
    """4 -> 6 -> 3 -> 5 pairs, live: at the rescale to 3 every stage's groups spread over
    three pairs and pairs 3..5 leave once both replicas of each crossed that cut and hold
    nothing; a node of a staying pair is killed while they move, so they leave only once
    its replicas are rebuilt; the nodes left holding nothing are standbys again, and the
    rescale to 5 starts two pairs on them. No restart; the sink holds the failure-free
    output."""
    expected = write_inputs(tmp_path / "in", 80_000)
    job = growing_job(spark, tmp_path)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(6, timeout=120)
        done: list = []
        shrinker = threading.Thread(target=lambda: done.append(job.rescale(3, timeout=120)))
        shrinker.start()
        victim = job.controller.recovery.node_of[Addr(1, 1, P)]
        job.kill_node(victim)
        shrinker.join(150)
        assert done == [None]
        assert job.running_pairs == 3
        rec = job.controller.recovery
        assert rec.left == {3, 4, 5} and not any(a.partition >= 3 for a in rec.node_of)
        assert victim not in rec.node_of.values()  # its replicas rebuilt elsewhere
        assert len(rec.free) >= 2 and rec.pair_states()[1, 4] == "dormant"
        with pytest.raises(ValueError, match="running partition from 0 to 2"):
            job.move_key_groups(0, 3, to=4)
        job.rescale(5, timeout=120)
        assert job.running_pairs == 5
        job.wait(timeout=300)
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    assert [e[:2] for e in events(job, "pairs started")] == [(4, 6), (3, 5)]
    assert events(job, "pairs stopped")[0][:2] == (3, 6)
    assert events(job, "pairs left")[0][0] == (3, 4, 5)
    assert events(job, "catch-up done")  # the killed node's replicas, rebuilt
    for stage in (1, 2):
        assert sorted(set(job.key_group_owners(stage))) == list(range(5))


def test_with_a_sink_per_partition_pairs_start_and_leave_live(spark, tmp_path):
    """``ordered_output=False`` (a sink per partition, in the driver): 4 -> 6 -> 3 pairs,
    live; every output is in exactly one sink partition, once, each partition's in SN
    order; the checkpoints complete though the sinks of pairs dormant or gone commit
    nothing (their last commit stands); no restart."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    expected = write_inputs(tmp_path / "in", 50_000)
    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}")))
    job = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, max_nodes=6, standbys=2, sink=sinks, ordered_output=False,
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(6, timeout=120)
        done = len(job.checkpoints.completed)
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= done + 2, 120)
        job.rescale(3, timeout=120)
        assert job.running_pairs == 3
        done = len(job.checkpoints.completed)
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= done + 2, 120)
        job.wait(timeout=300)
    parts = [[(tuple(sn), x) for sn, x in read_file_sink(str(out / f"partition-{q}"))]
             for q in range(6)]
    for part in parts:
        assert [sn for sn, _ in part] == sorted({sn for sn, _ in part})
    got = sorted(o for part in parts for o in part)
    assert got == sorted((tuple(sn), x) for sn, x in expected)  # each once, none lost
    assert job.restart_log == []
    assert [e[:2] for e in events(job, "pairs started")] == [(4, 6)]
    assert events(job, "pairs stopped")[0][:2] == (3, 6)
