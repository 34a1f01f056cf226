"""Checkpoint coordination (controller/checkpoints.py): complete only with every report."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.checkpoints import CheckpointCoordinator, Phase, fingerprint
from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow

pytestmark = pytest.mark.timeout(60)


def reports(k, stages=2, partitions=2):
    out = [("part", k, s, p, f"s{s}p{p}-{k}") for s in range(1, stages + 1)
           for p in range(partitions)]
    return out + [("source", k, ["a.jsonl", 100 * k]), ("sink", k, (10 * k, 1))]


def apply(coord, report):
    kind, k, *rest = report
    if kind == "part":
        return coord.part_written(k, *rest)
    if kind == "source":
        return coord.source_recorded(k, *rest)
    return coord.sink_committed(k, *rest)


@settings(max_examples=100, deadline=None)
@given(st.permutations(reports(1)))
def test_a_checkpoint_completes_with_its_last_report_whatever_the_order(order):
    coord = CheckpointCoordinator(2, 2, "f")
    coord.begin(1, cut=40)
    manifests = [apply(coord, r) for r in order]
    assert manifests[:-1] == [None] * (len(order) - 1)
    assert manifests[-1] == {"fingerprint": "f", "partitions": 2, "stages": 2, "cut": 40,
                             "source": ["a.jsonl", 100], "sink": [10, 1],
                             "files": ["s1p0-1", "s1p1-1", "s2p0-1", "s2p1-1"],
                             "chains": [[[1, "s1p0-1"]], [[1, "s1p1-1"]], [[1, "s2p0-1"]],
                                        [[1, "s2p1-1"]]],
                             "digests": {}}
    assert coord.latest_complete == 1


def test_the_manifest_records_every_chain_file_s_checksum():
    coord = CheckpointCoordinator(1, 2, "f")
    coord.begin(1, cut=10)
    coord.begin(2, cut=20)
    coord.part_written(2, 1, 0, "a-2", [(1, "a-1"), (2, "a-2")], ["d1", "d2"])
    coord.part_written(2, 1, 1, "b-2", [(2, "b-2")], ["e2"])
    coord.source_recorded(2, 5)
    manifest = coord.sink_committed(2, None)
    assert manifest["digests"] == {"1/a-1": "d1", "2/a-2": "d2", "2/b-2": "e2"}
    with pytest.raises(ValueError, match="has 1 checksums"):
        coord.begin(3, cut=30)
        coord.part_written(3, 1, 0, "a-3", [(2, "a-2"), (3, "a-3")], ["d3"])


def test_a_restart_that_fell_back_abandons_the_newer_complete_checkpoints():
    """A restart passed over checkpoint 2 (its files did not verify) for checkpoint 1: the
    next cuts follow checkpoint 1's and must not be refused as earlier than 2's."""
    coord = CheckpointCoordinator(1, 1, "f")
    for k, cut in ((1, 10), (2, 20)):
        coord.begin(k, cut=cut)
        coord.part_written(k, 1, 0, f"a-{k}")
        coord.source_recorded(k, cut)
        coord.sink_committed(k, None)
    coord.restarted(1)
    assert coord.latest_complete == 1 and coord.abandoned() == [2]
    coord.begin(3, cut=15)  # after checkpoint 1's cut, before 2's


def test_the_twin_of_a_partition_that_wrote_changes_nothing_and_missing_is_named():
    coord = CheckpointCoordinator(2, 2, "f")
    coord.begin(1, cut=40)
    coord.part_written(1, 1, 0, "first")
    coord.part_written(1, 1, 0, "twin")
    assert coord.checkpoints[1].parts[1, 0] == "first"
    assert coord.missing(1) == ["stage 1 partition 1", "stage 2 partition 0",
                                "stage 2 partition 1", "the source position",
                                "the sink's commit"]


def test_a_later_checkpoint_completing_first_abandons_the_earlier_one():
    coord = CheckpointCoordinator(2, 2, "f")
    coord.begin(1, cut=40)
    coord.begin(2, cut=80)
    for r in reports(1)[:-1]:
        apply(coord, r)  # checkpoint 1 waits for the sink
    for r in reports(2):
        apply(coord, r)
    assert coord.latest_complete == 2 and coord.abandoned() == [1]
    assert apply(coord, reports(1)[-1]) is None  # too late: a settled checkpoint
    assert coord.checkpoints[1].phase is Phase.ABANDONED


def test_bad_reports_are_refused_clearly():
    coord = CheckpointCoordinator(2, 2, "f")
    with pytest.raises(ValueError, match="never begun"):
        coord.sink_committed(3, None)
    coord.begin(2, cut=50)
    with pytest.raises(ValueError, match="after checkpoint 2"):
        coord.begin(1, cut=60)
    with pytest.raises(ValueError, match="before 50"):
        coord.begin(3, cut=40)
    with pytest.raises(ValueError, match="no stage 3 partition 0"):
        coord.part_written(2, 3, 0, "x")


def test_the_fingerprint_tells_dataflows_and_partition_counts_apart():
    a = fingerprint(counting_dataflow(2), 4)
    assert a == fingerprint(counting_dataflow(2), 4)
    assert len({a, fingerprint(counting_dataflow(2), 8), fingerprint(counting_dataflow(3), 4),
                fingerprint(paper_dataflow(), 4)}) == 4


def test_a_rescale_with_a_sink_per_partition_waits_for_each_new_partitions_sink():
    coord = CheckpointCoordinator(1, 2, "f", sinks=2)
    coord.restarted(None)
    coord.rescaled(3)
    coord.begin(1, cut=40)
    for p in range(3):
        coord.part_written(1, 1, p, f"s1p{p}-1")
    coord.source_recorded(1, ["a.jsonl", 100])
    assert coord.sink_committed(1, (38, 0), 0) is None
    assert coord.sink_committed(1, (39, 1), 1) is None
    manifest = coord.sink_committed(1, (40, 2), 2)  # the third sink partition, new
    assert manifest is not None and manifest["sinks"] == [[38, 0], [39, 1], [40, 2]]
    with pytest.raises(ValueError, match="no sink partition 3"):
        coord.sink_committed(1, (40, 3), 3)
