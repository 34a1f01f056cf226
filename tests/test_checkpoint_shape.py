"""Which checkpoints a job restores, and with which routing (controller/checkpoint_shape.py;
DESIGN 10, 13)."""
from __future__ import annotations

import pytest

from controller.checkpoint_shape import JobShape
from controller.checkpoints import fingerprint
from flux.errors import CheckpointMismatch, RescaleRefused
from flux.examples import paper_dataflow
from flux.testing.dataflows import regrouping_dataflow

FLOW = regrouping_dataflow(2)


def manifest(partitions, key_groups=256, flow=FLOW, **more):
    """A manifest as the coordinator writes it (``key_groups=None``: before key groups)."""
    m = {"checkpoint": 7, "partitions": partitions,
         "fingerprint": fingerprint(flow, partitions)}
    if key_groups is not None:
        m.update(key_groups=key_groups, shape=fingerprint(flow, None))
    return {**m, **more}


def test_a_manifest_with_key_groups_restores_at_any_count_with_its_groups():
    for partitions in (2, 4, 6, 8):
        assert JobShape.of(FLOW, 6, 256).routing(manifest(partitions), "here") == 256


def test_other_key_groups_or_another_dataflow_are_refused_naming_them():
    with pytest.raises(CheckpointMismatch, match="key_groups=128, this job has key_groups=256"):
        JobShape.of(FLOW, 4, 256).routing(manifest(4, key_groups=128), "here")
    with pytest.raises(CheckpointMismatch, match="another dataflow"):
        JobShape.of(paper_dataflow(), 4, 256).routing(manifest(4), "here")


def test_a_rescale_with_an_egress_per_partition_is_refused():
    shape = JobShape.of(FLOW, 6, 256, ordered_output=False)
    assert shape.routing(manifest(6), "here") == 256  # the same count: restored
    with pytest.raises(RescaleRefused,
                       match=r"run it at 4 nodes and rescale it while it runs \(job.rescale"):
        shape.routing(manifest(4), "here")


def test_a_manifest_from_before_key_groups_restores_at_its_count_with_its_routing():
    old = manifest(4, key_groups=None)
    assert JobShape.of(FLOW, 4, 256).routing(old, "here") is None  # hash % partitions
    with pytest.raises(RescaleRefused, match="written with 4 partitions before key groups"
                                             ".* restored only with nodes=4"):
        JobShape.of(FLOW, 6, 256).routing(old, "here")
    with pytest.raises(CheckpointMismatch, match="another dataflow"):
        JobShape.of(paper_dataflow(), 4, 256).routing(manifest(4, None, paper_dataflow())
                                                      | {"fingerprint": "f00"}, "here")
