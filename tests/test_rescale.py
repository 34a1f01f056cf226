"""A checkpoint's states split over another partition count (flux/rescale.py,
controller/key_groups.py; DESIGN 13): each new partition gets exactly the state a
failure-free run at the new count holds after the same inputs."""
from __future__ import annotations

import pytest

from controller.key_groups import plan, sources
from exchange.partitioner import owned_groups
from flux import Dataflow, KeyedOperator, KeyedState, Stage
from flux.errors import RescaleRefused
from flux.examples import paper_dataflow
from flux.examples.dataflows import paper_dataflow_on_columns
from flux.operator import wire_form
from flux.reference import ReferenceRun
from exchange.group_map import GroupMap
from flux.rescale import rescaled_states
from flux.testing.counter import KeyedCounter, first_field
from flux.testing.dataflows import counting_dataflow, regrouping_dataflow
from flux.testing.workloads import keyed_workload, packet_workload

GROUPS = 256


def _run(flow, inputs, partitions):
    run = ReferenceRun(flow, partitions)
    outputs = [out for record in inputs for out in run.feed(record)]
    return run, outputs


def _rescaled(flow, run, old, new):
    """Every stage's states at ``new`` partitions, split from ``run``'s at ``old``."""
    out = []
    for s, stage in enumerate(flow.stages):
        keyed = [store is not None for store in stage.build_chain().keyed_stores()]
        out.append([wire_form(rescaled_states(
            stage, keyed, {q: run.chains[s][q].get_state()
                           for q in sources(p, new, old, GROUPS)},
            p, GroupMap.even(old, GROUPS), GroupMap.even(new, GROUPS))) for p in range(new)])
    return out


@pytest.mark.parametrize("old, new", [(4, 6), (6, 3), (2, 8), (5, 5), (3, 1), (1, 4)])
def test_sources_are_the_old_partitions_whose_groups_overlap(old, new):
    for p, read in enumerate(plan(new, old, GROUPS)):
        want = sorted({g * old // GROUPS for g in owned_groups(p, new, GROUPS)})
        assert read == want and len(read) <= -(-old // new) + 1


@pytest.mark.parametrize("make, inputs", [
    (lambda: regrouping_dataflow(3), keyed_workload(400, seed=5, keys=40)),
    (lambda: paper_dataflow(window=300), packet_workload(600, seed=6, pairs=200, apps=2, sources=10, concurrent=30)),
    (lambda: paper_dataflow_on_columns(window=300), packet_workload(600, seed=6, pairs=200, apps=2, sources=10, concurrent=30)),
])
@pytest.mark.parametrize("old, new", [(4, 6), (6, 3), (2, 5), (3, 1)])
def test_split_states_are_the_failure_free_states_at_the_new_count(make, inputs, old, new):
    flow = make()
    run_old, out_old = _run(flow, inputs, old)
    run_new, out_new = _run(flow, inputs, new)
    assert out_old == out_new  # state keyed by the stages' keys: the count does not show
    want = [[wire_form(chain.get_state()) for chain in stage] for stage in run_new.chains]
    assert _rescaled(flow, run_old, old, new) == want


def test_the_check_before_a_rescale_runs_the_first_records_and_refuses_other_keys():
    from flux.rescale import check_rescalable

    sample = keyed_workload(200, seed=1, keys=20)
    check_rescalable(regrouping_dataflow(3), sample)  # keyed by the stages' keys: passes
    with pytest.raises(RescaleRefused, match=r"stage 'count2' operator 0 \(KeyedCounter\) "
                                             r"holds key"):
        check_rescalable(counting_dataflow(2), sample)
    check_rescalable(counting_dataflow(2))  # without records only the operators are seen


def test_a_store_keyed_by_other_than_the_stage_key_is_refused_naming_a_key():
    flow = counting_dataflow(2)  # stage 2 routes by (key, count), counts per key
    run, _ = _run(flow, keyed_workload(200, seed=1, keys=20), 3)
    with pytest.raises(RescaleRefused, match=r"stage 'count2' operator 0 \(KeyedCounter\) "
                                             r"holds key .* in partition \d, and the "
                                             r"stage's key routes it to partition \d"):
        _rescaled(flow, run, 3, 4)


class Total:
    """State that is not a keyed store: a running total of the partition."""

    def __init__(self):
        self.total = 0

    def process(self, record):
        self.total += record[1]
        return [(record[0], self.total)]

    def get_state(self):
        return self.total

    def install_state(self, state):
        self.total = state


def test_state_that_is_not_a_keyed_store_is_refused_naming_the_operator():
    flow = Dataflow([Stage("totals", first_field, (KeyedCounter, Total))])
    run, _ = _run(flow, keyed_workload(50, seed=2, keys=10), 2)
    with pytest.raises(RescaleRefused, match=r"stage 'totals' operator 1 \(Total\) keeps "
                                             r"state that is not a keyed store"):
        _rescaled(flow, run, 2, 3)


class LastWatermark(KeyedOperator):
    """Keeps a per-partition entry under the expiry's watermark key beside its keys."""

    def __init__(self):
        from flux.expiry import WATERMARK_KEY
        self.state, self.mark = KeyedState(), WATERMARK_KEY

    def process(self, record):
        self.state[record[0]] = record[1]
        self.state[self.mark] = (record[1], record[1])
        return []


def test_a_partition_wide_entry_takes_the_smallest_value_of_the_old_partitions():
    flow = Dataflow([Stage("marks", first_field, (LastWatermark,))])
    inputs = [(f"k{i}", i) for i in range(1, 60)]
    run, _ = _run(flow, inputs, 4)
    marks = {q: dict((tuple(k) if isinstance(k, list) else k, v)
                     for k, v in run.chains[0][q].get_state()[0]) for q in range(4)}
    for p in range(2):
        state = dict((tuple(k) if isinstance(k, list) else k, v) for k, v in
                     _rescaled(flow, run, 4, 2)[0][p][0])
        want = min(tuple(marks[q][(float("-inf"),)]) for q in sources(p, 2, 4, GROUPS))
        assert tuple(state.pop((float("-inf"),))) == want
        assert all(isinstance(k, str) for k in state)
