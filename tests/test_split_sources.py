"""Sources split into parts that ingresses on the executors read (``flux.SplitSource``):
the in-memory splits, the checks before a job starts, and a node's ingress replicas
(``flux.runtime.node_ingresses``): the leader ends its epochs on the wall clock, the
follower cuts what it heard, a replica says when its split is read. Spark runs them in
tests/test_split_spark.py."""
from __future__ import annotations

import pyarrow as pa
import pytest

from flux.addresses import P, S, Addr
from flux.connector_api import SplitSource
from flux.connectors.split_sources import ListSplits, skip_inputs
from flux.control_messages import IngressEnded
from flux.data_messages import IngressLog, LogAck
from flux.effects import Send
from flux.protocol.builder import MachineBuilder
from flux.protocol.host import Host
from flux.protocol.ingress_pair import TWIN
from flux.runtime.node_ingresses import NodeIngresses
from flux.sequence import epoch_first
from flux.spark.options import JobOptions
from flux.spark.split_watch import SplitWatch, check_split_job, split_sample
from flux.testing.dataflows import counting_dataflow

pytestmark = pytest.mark.timeout(30)


def test_list_splits_give_each_split_from_a_count_and_batches_sliced_at_it():
    splits = ListSplits([[1, 2, 3], [4, 5]])
    assert isinstance(splits, SplitSource) and splits.splits() == 2 and len(splits) == 5
    assert list(splits.read_split(0, 1)) == [2, 3] and list(splits.read_split(1, 0)) == [4, 5]
    batches = [pa.record_batch({"x": [1, 2, 3]}), pa.record_batch({"x": [4, 5]})]
    rows = [b.column(0).to_pylist() for b in skip_inputs(batches, 2)]
    assert rows == [[3], [4, 5]]
    assert [b.num_rows for b in ListSplits([batches, batches]).read_split(1, 3)] == [2]
    assert list(skip_inputs(iter([1, 2]), 5)) == []
    with pytest.raises(ValueError, match="two or more splits"):
        ListSplits([[1, 2]])


def test_by_key_puts_every_key_in_one_split_in_the_records_order():
    records = [(f"k{i % 7}", i) for i in range(100)]
    splits = ListSplits.by_key(records, 3, key=lambda r: r[0])
    parts = [list(splits.read_split(k, 0)) for k in range(3)]
    assert sorted(r for p in parts for r in p) == sorted(records)
    for part in parts:
        assert part == sorted(part, key=lambda r: r[1])
    homes = {r[0]: k for k, p in enumerate(parts) for r in p}
    assert all(homes[r[0]] == k for k, p in enumerate(parts) for r in p)


class Unpicklable:
    def __init__(self):
        import threading

        self.lock = threading.Lock()

    def splits(self):
        return 2

    def read_split(self, split, skip):
        return iter([])


def test_a_split_job_refuses_what_is_not_built_for_it_naming_it():
    two = ListSplits([[1], [2]])
    assert check_split_job(two, JobOptions.from_kwargs()) == 2
    assert check_split_job(two, JobOptions.from_kwargs(checkpoint="/tmp/x")) == 2
    assert check_split_job(two, JobOptions.from_kwargs(verify_interval=1.0)) == 2
    with pytest.raises(ValueError, match="replication='flux'"):
        check_split_job(two, JobOptions.from_kwargs(replication="none"))
    with pytest.raises(ValueError, match="Unpicklable cannot be pickled"):
        check_split_job(Unpicklable(), JobOptions.from_kwargs())
    assert split_sample(ListSplits([[1, 2, 3], [4]]), 2) == [1, 2]
    assert split_sample(ListSplits([[1, 2, 3], [4]]), 0) == []  # check_records=0: no checks


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_verify_cuts_without_checkpoints_name_an_epoch_ahead_every_interval():
    """``verify_interval=`` with a split source: every interval the end of an epoch
    0.3 s past the clock's, told to every node, numbered on; none once all was read."""
    from flux.control_messages import CutAtEpoch
    from flux.spark.verify_cuts import EpochVerifyCuts

    clock, told = Clock(0.0), []
    cuts = EpochVerifyCuts(0.5, epoch_interval=0.01, clock=clock)
    cuts.maybe_cut_at_epoch(40, told.append, done=False)
    assert told == []  # not due yet
    clock.t = 0.5
    cuts.maybe_cut_at_epoch(50, told.append, done=False)
    cuts.maybe_cut_at_epoch(51, told.append, done=False)  # the next is an interval on
    clock.t = 1.0
    cuts.maybe_cut_at_epoch(100, told.append, done=False)
    clock.t = 1.5
    cuts.maybe_cut_at_epoch(150, told.append, done=True)
    assert told == [CutAtEpoch(1, 80), CutAtEpoch(2, 130)]
    with pytest.raises(ValueError, match="verify_interval must be > 0"):
        EpochVerifyCuts(0, epoch_interval=0.01)


def node(replica: int, source, clock):
    """A host with one replica of split 0's pair, and its intakes."""
    builder = MachineBuilder(counting_dataflow(1), 2, 8, 4, ingresses=2, ingress_pairs=True)
    ingress = builder.ingress(index=0, replica=replica)
    host = Host(f"n{replica}", {ingress.addr: ingress})
    return host, ingress, NodeIngresses(source, interval=0.01, origin=100.0, wall=clock)


def twin_log(ingress):
    """What the leader tells its twin now (the log leaves with its flushes)."""
    return [e.msg for e in ingress.flush(*TWIN) if isinstance(e, Send)] \
        if TWIN in ingress.flushable() else []


def test_the_leader_ends_epochs_on_the_clock_and_the_follower_cuts_what_it_heard():
    clock = Clock(100.0)
    source = ListSplits([[("a", 1), ("b", 2), ("a", 3)], [("c", 4)]])
    lead_host, leader, lead = node(P, source, clock)
    follow_host, follower, follow = node(S, source, clock)
    clock.t = 100.055  # the wall clock in epoch 5: the leader ends its epoch 0 first
    moved, _, _ = lead.step(lead_host, lambda a: None)
    assert leader.epoch == 5 and moved and leader.accepted == epoch_first(5, 0, 2) + 3
    # the follower heard nothing yet: it takes nothing (it never decides an epoch)
    assert follow.step(follow_host, lambda a: None)[0] is False and follower.epoch == 0
    # only the epoch's start so far, no input pending at the follower: it follows it
    log = twin_log(leader)
    assert [type(m) for m in log] == [IngressLog] and log[0].entries == (("epoch", 5),)
    follower.on_message(leader.addr, log[0])
    follow.step(follow_host, lambda a: None)
    assert follower.epoch == 5 and follower.accepted == epoch_first(5, 0, 2)  # none heard of
    # the leader's item, heard: the follower reads its inputs, then cuts the same item
    x = leader.cut_item()
    follower.on_message(leader.addr, twin_log(leader)[0])
    moved, effects, _ = follow.step(follow_host, lambda a: None)
    assert moved and follower.inputs == 3
    # it wrote what it heard to the split's log before it acks (written at once: no
    # file without checkpoints)
    acks = [e.msg for e in effects if isinstance(e, Send) and isinstance(e.msg, LogAck)]
    assert acks and not follower.log_due()
    reports = follow.step(follow_host, lambda a: None)[2]
    assert follower.last_item == x == leader.last_item
    # both read their whole split and cut their last item: each says so, once
    ended = IngressEnded(0, x, 3)
    assert reports == [ended]
    # the leader's last item waits for its twin's ack: until then a take-over could cut
    # those inputs otherwise, so it does not say its split ended
    assert lead.step(lead_host, lambda a: None)[2] == []
    leader.on_message(follower.addr, acks[-1])
    assert lead.step(lead_host, lambda a: None)[2] == [ended]
    assert lead.step(lead_host, lambda a: None)[2] == []


def test_a_replica_behind_the_clock_ends_its_epoch_before_it_takes_more():
    clock = Clock(100.0)
    source = ListSplits([[(f"k{i}", i) for i in range(50)], []])
    host, leader, ingresses = node(P, source, clock)
    ingresses.step(host, lambda a: None)
    assert leader.epoch == 0 and leader.inputs == 50
    assert ingresses.due(host, 7.0) == pytest.approx(7.01)
    clock.t = 100.031
    ingresses.step(host, lambda a: None)  # the pending inputs leave as the epoch's item
    assert leader.epoch == 3 and not leader.pending_rows()


def test_the_driver_reads_the_splits_ends_and_an_inputs_time_from_its_sn():
    watch = SplitWatch(2, epoch_origin=100.0, epoch_interval=0.01)
    watch.report(IngressEnded(0, epoch_first(7, 0, 2) + 4, 4))
    assert not watch.source_done
    watch.report(IngressEnded(1, epoch_first(9, 1, 2) + 2, 2))
    assert watch.source_done and watch.read == epoch_first(9, 1, 2) + 2
    assert watch.input_time(epoch_first(9, 1, 2) + 2) == pytest.approx(100.09)
    assert watch.inputs_taken({}) == 6


def test_the_addresses_of_a_pair_are_beside_the_stage_1_replicas_of_their_side():
    from flux.runtime.config import NodeConfig

    config = NodeConfig(dataflow=b"", stages=1, partitions=4, splits=3)
    topology = config.topology()
    for i in range(3):
        for r in (P, S):
            assert topology.where[Addr(0, i, r)] == topology.where[Addr(1, i % 4, r)]
    assert "ingress" not in topology.where.values()


class Breaks:
    """Split 0 raises after two inputs: a file that cannot be read on, say."""

    def splits(self):
        return 2

    def read_split(self, split, skip):
        yield from [("a", 1), ("b", 2)][skip:]
        raise OSError("the disk went away")


def test_a_split_that_raises_stops_the_job_naming_the_split_and_input():
    from flux.errors import OperatorError

    host, leader, ingresses = node(P, Breaks(), Clock(100.0))
    with pytest.raises(OperatorError, match=r"reading split 0 of Breaks failed in stage 0, "
                                            r"partition 0.*OSError: the disk went away"):
        ingresses.step(host, lambda a: None)


def test_the_thread_cluster_says_a_split_source_is_for_spark():
    from flux.testing.threads import ThreadCluster

    with pytest.raises(ValueError, match="read by ingresses on Spark's executors"):
        ThreadCluster(counting_dataflow(1), 2, ListSplits([[1], [2]]))


def test_the_relayed_oracle_passes_the_reference_and_names_what_is_wrong():
    from flux.reference import reference_output
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(300, seed=2, keys=5)]
    splits = [records[k::3] for k in range(3)]
    order = [r for group in zip(*splits) for r in group]  # interleaved, each split in order
    good = reference_output(relaying_dataflow(), order, 4)
    assert relayed_mismatch(good, records, splits, 4) is None
    assert "inputs in the output" in relayed_mismatch(good[:-3], records, splits, 4)
    swapped = order[:]
    swapped[0], swapped[3] = swapped[3], swapped[0]  # split 0's first two, reversed
    bad = reference_output(relaying_dataflow(), swapped, 4)
    assert "split 0's inputs were numbered out of its order" == relayed_mismatch(
        bad, records, splits, 4)
    wrong = [(sn, r) for sn, r in good]
    wrong[5] = (wrong[5][0], ("k9", 99, wrong[5][1][2]))
    assert "differs from the reference" in relayed_mismatch(wrong, records, splits, 4)
    assert "SNs" in relayed_mismatch(good[1:2] + good[:1] + good[2:], records, splits, 4)


def test_with_checkpoints_the_follower_acks_once_its_log_is_durable_and_a_restart_follows_it(
        tmp_path):
    """The follower's entries go to its split's log off the loop's thread; it acks its
    leader only once they are written; the coordinator's cut is stamped by the leader and
    passed with the split's count; a restart's pair follows the log past the cut."""
    import time

    import fsspec

    from flux.effects import CutPassed
    from flux.runtime.split_log import SplitLog, SplitLogs
    from flux.runtime.split_log_writer import SplitLogWriter

    url = str(tmp_path / "ckpt")
    fs = fsspec.filesystem("file")
    clock = Clock(100.0)
    source = ListSplits([[("a", 1), ("b", 2), ("a", 3), ("c", 4)], [("c", 5)]])
    lead_host, leader, lead = node(P, source, clock)
    follow_host, follower, _ = node(S, source, clock)
    follow = NodeIngresses(source, interval=0.01, origin=100.0, wall=clock,
                           logs=SplitLogWriter(lambda split: SplitLog(fs, url, split)))
    try:
        clock.t = 100.055
        lead.step(lead_host, lambda a: None)
        lead.cut_at(lead_host, 1, 6, lambda a: None)  # checkpoint 1 ends with epoch 6
        leader.cut_item()
        for msg in twin_log(leader):
            follower.on_message(leader.addr, msg)
        def written_and_acked():
            acks, deadline = [], time.monotonic() + 10
            while not acks and time.monotonic() < deadline:
                _, effects, _ = follow.step(follow_host, lambda a: None)
                acks = [e.msg for e in effects
                        if isinstance(e, Send) and isinstance(e.msg, LogAck)]
                time.sleep(0.001)
            assert acks
            leader.on_message(follower.addr, acks[-1])

        written_and_acked()
        assert follower.last_item == leader.last_item
        logged = SplitLog(fs, url, 0).read()
        assert logged.entries == [("epoch", 5), ("cut", 1, 6), ("item", leader.last_item)]
        clock.t = 100.075  # epoch 7: the leader passes the cut, with its split's count ...
        _, effects, _ = lead.step(lead_host, lambda a: None)
        assert not [e for e in effects if isinstance(e, CutPassed)]
        for msg in twin_log(leader):  # ... reported once its twin holds epoch 7's start
            follower.on_message(leader.addr, msg)
        written_and_acked()
        assert CutPassed(1, epoch_first(7, 0, 2), 0, 4) in leader.flush(*TWIN)
        logged = SplitLog(fs, url, 0).read()
    finally:
        follow.stop()
    # a restart before any checkpoint: both replicas follow the log from its start
    cut, logs = 0, SplitLogs(url, 2).replay(0, [])
    assert logs[0][1] == logged.entries and logs[0][2] == 4  # epoch 7's start too
    for replica in (P, S):
        host, again, ingresses = node(replica, source, Clock(100.2))
        ingresses.resume(host.machines, cut, {0: logs[0]}, {})
        for _ in range(3):
            ingresses.step(host, lambda a: None)
        assert again.last_item == leader.last_item and again.inputs == 4


class IndexedReader:
    """A reader of a list that knows where it is: its position is an index."""

    def __init__(self, part, first, skip):
        self.part, self.position = part, first + skip

    def __iter__(self):
        return self

    def __next__(self):
        if self.position >= len(self.part):
            raise StopIteration
        self.position += 1
        return self.part[self.position - 1]


class Seekable:
    """A split source that seeks (``SeekableSplits``), recording how each split opened."""

    def __init__(self, parts):
        self.parts, self.opened = parts, []

    def splits(self):
        return len(self.parts)

    def read_split(self, split, skip):
        self.opened.append((split, None, skip))
        return IndexedReader(self.parts[split], 0, skip)

    def read_split_from(self, split, position, skip):
        self.opened.append((split, position, skip))
        return IndexedReader(self.parts[split], position, skip)


def test_a_seekable_source_is_marked_as_read_and_a_restart_seeks_to_the_mark():
    """Where each split's source stood at a count is kept as the replica reads (the
    manifest keeps the one at or before a cut's count); a restart opens the split there
    and skips only the inputs between the mark and its count."""
    from flux.connector_api import SeekableSplits

    source = Seekable([[("a", 1), ("b", 2), ("a", 3), ("c", 4)], [("c", 5)]])
    assert isinstance(source, SeekableSplits)
    clock = Clock(100.0)
    host, leader, ingresses = node(P, source, clock)
    ingresses.step(host, lambda a: None)
    assert source.opened == [(0, None, 0)] and leader.inputs == 4
    assert ingresses.mark(0, 4) == (4, 4) and ingresses.mark(0, 3) is None
    assert ingresses.mark(1, 9) is None  # a split not read here
    # a restart whose cut lies after 3 inputs, with a mark at 2
    host, again, restarted = node(S, source, Clock(100.2))
    restarted.resume(host.machines, 0, {0: (3, [], 0)}, {0: (2, 2)})
    restarted.step(host, lambda a: None)
    assert source.opened[-1] == (0, 2, 1)  # at index 2, one input skipped
    assert again.inputs == 3  # the follower takes nothing it has not heard of yet


def test_a_drained_rescale_holds_the_pairs_past_its_epoch_and_their_epochs_still_end():
    """``HoldInputs(e)``: the replica that decides takes no input into an epoch after
    ``e`` (its epochs still end, so the drain's cut at ``e``'s end is crossed); told
    ``HoldInputs(None)`` it takes inputs again."""
    from flux.control_messages import HoldInputs

    clock = Clock(100.0)
    source = ListSplits([[("a", 1), ("b", 2), ("a", 3)], [("c", 4)]])
    host, leader, ingresses = node(P, source, clock)
    ingresses.told(host, HoldInputs(4), lambda a: None)
    clock.t = 100.055  # epoch 5: past the hold
    moved, _, _ = ingresses.step(host, lambda a: None)
    assert leader.epoch == 5 and not moved and leader.inputs == 0
    clock.t = 100.075
    ingresses.step(host, lambda a: None)
    assert leader.epoch == 7 and leader.inputs == 0  # its epochs end, empty
    ingresses.told(host, HoldInputs(None), lambda a: None)
    moved, _, _ = ingresses.step(host, lambda a: None)
    assert moved and leader.inputs == 3
