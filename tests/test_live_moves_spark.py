"""Live moves of key groups between running partitions (DESIGN 13): ``job.move_key_groups``
moves a range's state from the partition that owns it to another at a checkpoint's cut,
without a restart; the sink ends with the failure-free output, nothing lost or twice,
through a kill of the destination during the move and a restart from a checkpoint
whose cut carried moves (slow: Spark)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from experiments.resumable_job import make_sink, read_sink
from flux.addresses import P, S, Addr
from test_rescale_spark import write_inputs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def moving_job(spark, tmp_path, source, standbys: int = 1):
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    return FluxJob(spark, regrouping_dataflow(2), source, nodes=4, standbys=standbys,
                   sink=make_sink("jsonl", str(tmp_path / "out")),
                   checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)


def ranges_moved(job) -> list:
    return [what for _, kind, what in job.metrics.events if kind == "range moved"]


def sink_per_partition_job(spark, tmp_path, on_executors: bool, commit_every: int):
    """The regrouping dataflow over ``tmp_path / "in"`` at 4000 inputs/s on 4 pairs, a
    ``FileSink`` per partition under ``tmp_path / "out"`` (in the driver, or its writer on
    the executors): the job and that folder."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}"),
                                                commit_every=commit_every))
    job = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=1, sink=sinks, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, ordered_output=False,
                  egress_on_executors=on_executors)
    return job, out


def assert_each_partition_holds(out, want) -> None:
    """Sink partition q holds exactly ``want[q]`` (sorted ``(sn, record)``), in SN order,
    each once."""
    from flux.connectors.file_sink import read_file_sink

    for q in range(len(want)):
        part = [(tuple(sn), x) for sn, x in read_file_sink(str(out / f"partition-{q}"))]
        assert [sn for sn, _ in part] == sorted({sn for sn, _ in part})
        assert sorted(part) == want[q]


def move_and_kill(job, asked: tuple, victim: Addr, freeze: bool = False) -> int:
    """``job.move_key_groups(*asked)`` in a thread, and the node of ``victim`` killed
    50 ms after the ask, about when the next input's cut carries the move; the number of
    the checkpoint that covers it. ``freeze``: the node's process is stopped (SIGSTOP: a
    hung machine, whose sockets stay open) just before the ask, so its replicas never
    reach the move's cut and their twins cross it before the controller declares it dead
    (then it is killed). Returns once the killed node's replicas are rebuilt: a pair
    survives one failure at a time, and the next kill may hit the twin of one of them
    (the nodes of (2, 0, S) and (1, 3, S) hold stage 1 partition 0's two replicas)."""
    done: list = []
    mover = threading.Thread(target=lambda: done.append(job.move_key_groups(*asked,
                                                                            timeout=90)))
    name = job.topology.where[victim]
    if freeze:
        pid = job.controller.pids(name)[0]
        os.kill(pid, signal.SIGSTOP)
        mover.start()
        assert job.wait_until(lambda: name in job.controller.dead, 60)
        os.kill(pid, signal.SIGKILL)
    else:
        mover.start()
        time.sleep(0.05)
        job.kill_node(name)
    mover.join(120)
    assert done and done[0] is not None
    assert job.wait_until(lambda: name in job.controller.dead
                          and not job.controller.recovery.pending(), 120)
    return done[0]


def test_key_groups_move_live_and_the_output_is_exact_through_kills_of_the_destination(
        spark, tmp_path):
    """Three moves while the job runs, each in two phases (a bulk, then the changes since):
    groups 0..100 of stage 1 (owned by partitions 0 and 1) to partition 3, whose replica
    P is killed as the move is asked, and then 64..191 of stage 2 to partition 0, whose
    replica S is killed as it is asked (a standby rebuilt from its twin gets the bulk
    and the changes from the controller, or its twin's state has them); then stage 1's
    192..255 from partition 3 to 1, the source's replica S killed as it is asked (its
    standby, rebuilt after the bulk, packs the range whole). No restart; the sink holds
    the failure-free output; the newest checkpoint's manifest routes by the moved maps."""
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.runtime.checkpoint_store import CheckpointStore

    expected = write_inputs(tmp_path / "in", 40_000)
    job = moving_job(spark, tmp_path, Paced(FileSource(str(tmp_path / "in")), 4000))
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        first = move_and_kill(job, (0, 100, 3, 1), Addr(1, 3, P))
        second = move_and_kill(job, (64, 191, 0, 2), Addr(2, 0, S))
        third = move_and_kill(job, (192, 255, 1, 1), Addr(1, 3, S))
        assert third > second > first
        job.wait(timeout=300)
        moved = ranges_moved(job)
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    assert len(moved) == 5  # 0..63 from 0, 64..100 from 1; 64..127 from 1, 128..191 from 2
    assert all(m[8] is not None for m in moved)  # each in two phases: a bulk, then changes
    store = CheckpointStore(str(tmp_path / "ckpt"))
    manifest = store.manifest(store.complete_ids()[-1])
    stage1, stage2 = manifest["groups"]["1"], manifest["groups"]["2"]
    assert set(stage1[:101]) == {3} and stage1[101:128] == [1] * 27
    assert set(stage1[192:]) == {1}
    assert set(stage2[64:192]) == {0} and stage2[:64] == [0] * 64


def test_a_restart_from_a_checkpoint_whose_cut_carried_a_move_restores_by_its_maps(
        spark, tmp_path):
    """Both replicas of stage 1's partition 3 killed right after a move to it: the job
    restarts from its newest complete checkpoint (maybe the move's own: its snapshots
    hold the groups before the move, each partition installs the groups it owns after),
    or from an older one (the move is asked again); the sink holds the failure-free
    output."""
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced

    expected = write_inputs(tmp_path / "in", 40_000)
    job = moving_job(spark, tmp_path, Paced(FileSource(str(tmp_path / "in")), 4000))
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.move_key_groups(0, 127, to=3, stage=1, timeout=60)
        time.sleep(0.2)
        where = job.topology.where
        for replica in (0, 1):
            job.kill_node(where[Addr(1, 3, replica)])
        job.wait(timeout=300)
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert len(job.restart_log) == 1


def test_the_vectorized_operators_state_moves_live_too(spark, tmp_path):
    """The paper's dataflow on Arrow batches (its state in the vectorized operators' slot
    tables, keyed by columns): stage 1's groups 200..255 and stage 2's 0..90 move while
    it runs; the output is the per-record reference's, SN for SN."""
    from flux.connectors.sources import Paced
    from flux.examples import paper_dataflow, vectorized_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.testing.workloads import packet_workload

    records = packet_workload(30_000, seed=4, pairs=2_000, apps=4, sources=100)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, 4)]
    job = FluxJob(spark, vectorized_dataflow(), Paced(records, 4000), nodes=4, standbys=1,
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.move_key_groups(200, 255, to=0, stage=1, timeout=60)
        job.move_key_groups(0, 90, to=2, stage=2, timeout=60)
        job.wait(timeout=300)
    assert [wire_form(x) for x in job.delivered] == expected
    assert job.restart_log == [] and len(ranges_moved(job)) == 3


@pytest.mark.parametrize("on_executors", [False, True])
def test_with_a_sink_per_partition_the_stages_before_the_last_move_live(spark, tmp_path,
                                                                         on_executors):
    """``ordered_output=False`` (sinks in the driver, or writers on the executors): stage
    1's groups 0..127 move to partition 3, whose replica P is killed as it is asked;
    each sink partition holds exactly the failure-free run's outputs of that partition
    (the last stage's routing decides it), in SN order, each once."""
    from flux.connectors.file_source import FileSource
    from flux.operator import wire_form
    from flux.reference import ReferenceRun
    from flux.testing.dataflows import regrouping_dataflow

    write_inputs(tmp_path / "in", 30_000)
    run = ReferenceRun(regrouping_dataflow(2), 4)
    expected = [o for r in FileSource(str(tmp_path / "in")) for o in run.feed(r)]
    want = [sorted((tuple(sn), wire_form(x)) for (sn, x), p in
                   zip(expected, run.output_partitions) if p == q) for q in range(4)]
    job, out = sink_per_partition_job(spark, tmp_path, on_executors, commit_every=100_000)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        move_and_kill(job, (0, 127, 3, 1), Addr(1, 3, P))
        job.wait(timeout=300)
    assert job.restart_log == [] and len(ranges_moved(job)) == 2
    assert_each_partition_holds(out, want)


@pytest.mark.parametrize("on_executors", [False, True])
def test_with_a_sink_per_partition_the_last_stage_moves_live_too(spark, tmp_path,
                                                                 on_executors):
    """``ordered_output=False``: stage 2's (the last stage's) groups 0..127 move to
    partition 3, whose replica P's node hangs just before it is asked (its sockets stay
    open: the controller declares it dead when its heartbeats stop, and the move waits
    for the destination's rebuilt replica). Their keys' outputs past the move's cut go
    to partition 3's sink; the two partitions' egresses hold them until a checkpoint
    covers the cut. Each sink partition holds exactly the failure-free outputs routed by
    the map in force at each one's input, in SN order, each once, with no restart. (A
    writer lost between the cut and its write, which both replicas writing at this cut
    survives, is a race a test cannot place: the simulator's schedules and
    ``test_runtime_loop`` cover it.)"""
    from flux.connectors.file_source import FileSource
    from flux.operator import wire_form
    from flux.reference import ReferenceRun
    from flux.testing.dataflows import regrouping_dataflow

    write_inputs(tmp_path / "in", 30_000)
    run = ReferenceRun(regrouping_dataflow(2), 4, groups=True)
    expected = [o for r in FileSource(str(tmp_path / "in")) for o in run.feed(r)]
    job, out = sink_per_partition_job(spark, tmp_path, on_executors, commit_every=100)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        move_and_kill(job, (0, 127, 3, 2), Addr(2, 3, P), freeze=True)
        job.wait(timeout=300)
        owners = job.key_group_owners(2)
    assert job.restart_log == []
    moved = ranges_moved(job)
    assert sorted((m[0], m[3], m[4]) for m in moved) == [(2, 0, 3), (2, 1, 3)]
    number = moved[0][5]  # the checkpoint whose cut carried the move, and that cut
    cut = [what[1] for _, kind, what in job.metrics.events
           if kind == "checkpoint" and what[0] == number][0]
    assert set(owners[:128]) == {3}
    want = [[] for _ in range(4)]
    for (sn, x), p, g in zip(expected, run.output_partitions, run.output_groups):
        want[3 if sn[0] > cut and g < 128 else p].append((tuple(sn), wire_form(x)))
    assert len(want[3]) > run.output_partitions.count(3)  # the move sent some there
    assert_each_partition_holds(out, [sorted(w) for w in want])


def test_the_rebalancing_policy_moves_groups_off_a_hot_partition_and_the_output_is_exact(
        spark, tmp_path):
    """``rebalance=flux.Rebalance(...)``: three quarters of the inputs have keys whose
    stage-1 groups partition 0 owns; the policy sees partition 0 take more than
    1.5 times the stage's mean and moves part of its groups, live, to the least loaded
    partition; the sink holds the failure-free output, with no restart."""
    import json

    from exchange.partitioner import HashPartitioner
    from flux import Rebalance
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    groups = HashPartitioner(1, 256)
    keys = [f"k{i}" for i in range(400)]
    hot = [k for k in keys if groups.group(k) < 64][:40]  # partition 0's at 4 nodes
    rest = [k for k in keys if groups.group(k) >= 64][:120]
    records = [(hot[i % 40] if i % 4 else rest[i % 120], i) for i in range(40_000)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                          for r in records))
    as_read = list(FileSource(str(tmp_path / "in")))
    expected = [(sn, wire_form(r))
                for sn, r in reference_output(regrouping_dataflow(2), as_read, 5)]
    job = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=1, sink=make_sink("jsonl", str(tmp_path / "out")),
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0,
                  rebalance=Rebalance(every=2.0, stages=(1,)))
    with job:
        assert job.wait_until(lambda: ranges_moved(job), 120)
        job.wait(timeout=300)
        decided = [what for _, kind, what in job.metrics.events if kind == "rebalanced"]
        owners = job.key_group_owners(1)
        rows = job.key_group_rows(1)  # as last reported: most of the inputs
    hot_groups = {groups.group(k) for k in hot}
    assert 0.7 < sum(rows[g] for g in hot_groups) / sum(rows) < 0.8  # three quarters
    assert sum(rows) <= len(records) and sum(rows[g] for g in range(256)
                                             if g not in hot_groups and g < 64) == 0
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == []
    stage, first, last, dest, rates = decided[0]
    # a run of partition 0's groups (it keeps one) with hot keys in it: the rows routed
    # per group, not an even share of its groups, decided it
    assert stage == 1 and 0 <= first <= last < 64 and dest != 0 and (first, last) != (0, 63)
    assert {groups.group(k) for k in hot} & set(range(first, last + 1))
    assert rates[0] > 1.5 * sum(rates) / 4  # it was hot
    made = [g * 4 // 256 for g in range(256)]  # the moves decided, one after the other
    for _, lo, hi, to, _ in decided:
        made[lo:hi + 1] = [to] * (hi - lo + 1)
    assert owners == made and 0 in owners


def test_rescale_at_the_jobs_own_count_spreads_keys_moved_onto_fewer_pairs_again_live(
        spark, tmp_path):
    """Every key spread over two of the four pairs (``spread_key_groups(2)``), then
    ``rescale(4)``: the keys go back over all four, live (no restart), every stage's
    groups in the contiguous ranges of a job of 4 nodes; the sink holds the failure-free
    output. (It used to do nothing: the job already had 4 pairs.)"""
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from exchange.group_map import GroupMap

    expected = write_inputs(tmp_path / "in", 30_000)
    job = moving_job(spark, tmp_path, Paced(FileSource(str(tmp_path / "in")), 4000))
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.spread_key_groups(2, timeout=90)
        narrowed = [set(job.key_group_owners(stage)) for stage in (1, 2)]
        job.rescale(4, timeout=90)
        spread = [job.key_group_owners(stage) for stage in (1, 2)]
        job.wait(timeout=300)
    assert narrowed == [{0, 1}, {0, 1}]
    even = [int(p) for p in GroupMap.even(4, 256).owners]
    assert spread == [even, even]
    assert read_sink("jsonl", str(tmp_path / "out")) == expected
    assert job.restart_log == [] and len(ranges_moved(job)) > 4


def test_groups_move_live_with_a_split_source_through_the_kill_of_a_splits_leader(
        spark, tmp_path):
    """A source in three splits read on the executors by pairs of ingresses (several
    ingresses numbering in epochs): each ingress switches its routing for a move as it
    ends the cut's epoch, and a replica rebuilt on a standby routes as its twin. Stage
    1's groups 0..100 move to partition 3 with split 1's leading ingress killed as the
    move is asked, then every stage spreads over 2 pairs and back over 4, live. No
    restart; the output is the failure-free run's over the inputs in the order the job
    numbered them, each once."""
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(180_000, seed=9, keys=40)]
    parts = [records[k::3] for k in range(3)]  # 20 s of input
    job = FluxJob(spark, relaying_dataflow(), ListSplits(parts, rate=3000), nodes=4,
                  standbys=1, checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        first = move_and_kill(job, (0, 100, 3, 1), Addr(0, 1, P))
        second = job.spread_key_groups(2, timeout=90)
        third = job.spread_key_groups(4, timeout=90)
        assert third > second > first
        assert job.metrics.input_total < len(records)  # the moves were made mid-stream
        job.wait(timeout=300)
        moved = ranges_moved(job)
    assert job.restart_log == []
    assert job.attempt.ingress_process is None  # the driver read no input
    assert len(moved) >= 2 + 2 * 2  # 0..63 from 0, 64..100 from 1; then every stage's
    wrong = relayed_mismatch(job.delivered, records, parts, 4)
    assert wrong is None, wrong


def test_the_rebalancing_policy_moves_groups_of_a_split_job_off_a_hot_partition(spark,
                                                                               tmp_path):
    """``rebalance=`` with a source in three splits read on the executors: three quarters
    of the inputs have keys whose stage-1 groups partition 0 owns; the policy moves part
    of them live; the output is the failure-free run's over the inputs in the order the
    job numbered them, with no restart."""
    from exchange.partitioner import HashPartitioner
    from flux import Rebalance
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow

    groups = HashPartitioner(1, 256)
    keys = [f"k{i}" for i in range(400)]
    hot = [k for k in keys if groups.group(k) < 64][:40]  # partition 0's at 4 nodes
    rest = [k for k in keys if groups.group(k) >= 64][:120]
    records = [(hot[i % 40] if i % 4 else rest[i % 120], i) for i in range(1, 90_001)]
    parts = [records[k::3] for k in range(3)]  # 30 s of input
    job = FluxJob(spark, relaying_dataflow(), ListSplits(parts, rate=1000), nodes=4,
                  standbys=1, checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0,
                  rebalance=Rebalance(every=2.0, stages=(1,)))
    with job:
        assert job.wait_until(lambda: ranges_moved(job), 120)
        job.wait(timeout=300)
        decided = [what for _, kind, what in job.metrics.events if kind == "rebalanced"]
    assert job.restart_log == [] and job.attempt.ingress_process is None
    stage, first, last, dest, rates = decided[0]
    assert stage == 1 and 0 <= first <= last < 64 and dest != 0 and (first, last) != (0, 63)
    assert {groups.group(k) for k in hot} & set(range(first, last + 1))
    wrong = relayed_mismatch(job.delivered, records, parts, 4)
    assert wrong is None, wrong


def test_a_job_that_moved_groups_live_rescales_from_a_checkpoint_exactly(spark, tmp_path):
    """Groups of both stages moved live (the maps no longer contiguous ranges), then
    ``job.rescale(6)``: the restart at 6 reads each new partition's groups from the old
    partitions whose snapshots hold them as the moves left them, and routes by
    contiguous ranges at 6 (modelled first: ``tests/test_sim_moves.py``); the sink holds
    the failure-free output."""
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced

    expected = write_inputs(tmp_path / "in", 40_000)
    job = moving_job(spark, tmp_path, Paced(FileSource(str(tmp_path / "in")), 4000),
                     standbys=0)  # (6 nodes after the rescale: every executor)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.move_key_groups(0, 127, to=3, stage=1, timeout=60)
        job.move_key_groups(200, 255, to=0, stage=2, timeout=60)
        job.rescale(6)
        assert len(job.topology.nodes) == 6
        owners = job.key_group_owners(1)
        job.wait(timeout=300)
    (_, restored, why), = job.restart_log
    assert "rescale to 6 nodes" in why and restored is not None
    assert owners == sorted(owners)  # contiguous ranges again, at 6
    assert read_sink("jsonl", str(tmp_path / "out")) == expected


def test_a_sink_per_partition_job_that_moved_the_last_stage_drains_to_another_count(
        spark, tmp_path):
    """``ordered_output=False``: the last stage's groups 0..127 move to partition 3 live,
    then ``job.rescale(6)`` drains and restarts at 6. Each sink partition holds exactly
    the failure-free outputs routed by the last stage's map in force at each one's input:
    contiguous ranges at 4 up to the move's cut, the moved map up to the drain's, ranges
    at 6 after it (modelled first: ``tests/test_sim_moves.py``)."""
    from exchange.partitioner import KEY_GROUPS, group_owner
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.operator import wire_form
    from flux.reference import ReferenceRun
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    write_inputs(tmp_path / "in", 30_000)
    run = ReferenceRun(regrouping_dataflow(2), 4, groups=True)
    expected = [o for r in FileSource(str(tmp_path / "in")) for o in run.feed(r)]
    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}"), commit_every=100))
    job = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=0, sink=sinks, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, checkpoint_keep=1000, ordered_output=False)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        number = job.move_key_groups(0, 127, to=3, stage=2, timeout=60)
        job.rescale(6)
        job.wait(timeout=300)
    (_, restored, why), = job.restart_log
    assert "rescale to 6 nodes" in why and restored is not None
    store = job.checkpoints.store
    moved_at, drained_at = store.manifest(number)["cut"], store.manifest(restored)["cut"]
    assert 0 < moved_at <= drained_at < 30_000
    want = [[] for _ in range(6)]
    for (sn, x), g in zip(expected, run.output_groups):
        if sn[0] > drained_at:
            p = int(group_owner(g, KEY_GROUPS, 6))
        elif sn[0] > moved_at and g < 128:
            p = 3
        else:
            p = int(group_owner(g, KEY_GROUPS, 4))
        want[p].append((tuple(sn), wire_form(x)))
    assert_each_partition_holds(out, [sorted(w) for w in want])
