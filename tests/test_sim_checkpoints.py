"""Checkpoint cuts in the protocol and the simulator (DESIGN 10, docs/design/checkpoints.md):
every snapshot is the failure-free state after exactly the inputs up to its cut, the sink
commits at a cut only with every output of those inputs, and every checkpoint the ingress
takes completes (or a later one does first)."""
from __future__ import annotations

import pytest

from flux.protocol.cuts import Cuts
from flux.errors import LocalProtocolError
from flux.testing.dataflows import counting_dataflow
from flux.protocol.builder import MachineBuilder
from flux.sim.__main__ import crash_window, schedules
from flux.sim.schedule import OK, VIOLATION, SimParams, format_trace, run_schedule

pytestmark = pytest.mark.timeout(300)


def all_ok(params, seeds):
    """Run ``seeds``; every schedule must end OK (the first bad ones' traces otherwise)."""
    results = schedules(params, seeds)
    bad = [r for r in results if r.status != OK]
    assert not bad, "\n".join(f"seed {r.seed}: {r.reason}\n{format_trace(r, last=20)}"
                              for r in bad[:3])
    return results


def test_a_cut_is_due_once_the_frontier_passes_it_and_in_order():
    cuts = Cuts()
    cuts.learn((1, 5))
    cuts.learn((1, 5))  # every batch says it again
    cuts.learn((2, 9))
    assert cuts.due((5, 3)) is None  # outputs of input 5 may still come
    assert cuts.due((5,)) == (1, 5)
    cuts.crossed(1)
    assert cuts.due((8,)) is None and cuts.due((9, 0)) is None and cuts.due((10,)) == (2, 9)
    again = Cuts()
    again.install_state(cuts.to_state())
    assert again.pending == {2: 9} and again.latest == (2, 9)


def test_the_ingress_stamps_its_cut_on_every_batch_from_then_on():
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    ingress = builder.ingress()
    for record in [("a", 1), ("b", 2), ("c", 3)]:
        ingress.accept(record)
    effects = ingress.choose_cut(1)
    assert [(e.number, e.cut) for e in effects] == [(1, 3)]
    sends = [s for i, d in ingress.flushable() for s in ingress.flush(i, d)]
    assert sends and all(s.msg.cut == (1, 3) for s in sends)
    assert not ingress.flushable()  # told on every connection: nothing more to say
    with pytest.raises(LocalProtocolError, match="after checkpoint 1"):
        ingress.choose_cut(1)


@pytest.mark.sim
@pytest.mark.parametrize("params", [
    SimParams(checkpoints=3),
    SimParams(checkpoints=3, crashes=2, standbys=2),
    SimParams(checkpoints=2, stages=3, partitions=3, crashes=2, standbys=2,
              dataflow="packets-ttl"),
], ids=["no-failure", "crashes-and-catch-up", "3x3-packets-ttl"])
def test_checkpoints_are_exact_and_complete_through_failures(params):
    results = all_ok(params, range(1, 41))
    assert sum(r.snapshots for r in results) > 40 * params.checkpoints
    assert sum(len(r.complete) for r in results) >= 30


def test_a_snapshot_taken_after_processing_past_the_cut_is_caught():
    params = SimParams(checkpoints=3, variant="late-snapshot")
    window = crash_window(params)
    assert any(run_schedule(seed, params, window).status == VIOLATION for seed in range(1, 11))


@pytest.mark.sim
@pytest.mark.parametrize("params", [
    SimParams(checkpoints=3, restarts=1),
    SimParams(checkpoints=2, crashes=3),  # double failures: a lost pair restarts the job
    SimParams(checkpoints=3, crashes=3, standbys=2, restarts=1),
    SimParams(restarts=1),  # no checkpoint: the job starts over, the sink drops repeats
], ids=["driver-kill", "double-failure", "all-together", "from-the-beginning"])
def test_a_restarted_job_gives_the_sink_exactly_the_failure_free_output(params):
    results = all_ok(params, range(1, 41))
    restarts = [k for r in results for k in r.restarts]
    assert len(restarts) >= 15
    if params.checkpoints:
        assert sum(k is not None for k in restarts) >= 5  # from a checkpoint, not the start


def test_quick_checkpoints_and_restarts_through_crashes():
    """The two runs above in small, for the quick suite."""
    for params in (SimParams(checkpoints=2, crashes=2, standbys=1, restarts=1),
                   SimParams(checkpoints=2, crashes=3)):
        window = crash_window(params)
        for seed in range(1, 9):
            r = run_schedule(seed, params, window)
            assert r.status == OK, f"seed {seed}: {r.reason}\n{format_trace(r, last=20)}"


# -- a source of several partitions: the input log (DESIGN 10) ------------------------------

def test_an_ingress_with_an_input_log_sends_nothing_before_it_is_logged():
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=3, batch_size=4, batch_rows=2)
    ingress = builder.ingress(log_inputs=True)
    records = [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    for record in records[:3]:  # item 2 is cut (inputs 1 and 2), input 3 is pending
        assert ingress.accept(record) is not None
    def flushed():
        return [s.msg for i, d in ingress.flushable() for s in ingress.flush(i, d)]

    # only bounds below item 2 leave (nothing of (2, ...) can come before them)
    assert ingress.log_due() and ingress.frontier() == (1,)
    assert all(not b.items and b.bound == (1,) for b in flushed())
    ingress.inputs_logged(1)  # not the whole item: it stays held
    assert not flushed() and ingress.frontier() == (1,)
    ingress.inputs_logged(3)  # item 2, and input 3 ahead of its item
    sent = [t for b in flushed() for t in b.items]
    assert sorted(sn for sub_sn, rows in sent for sn, _ in rows.pairs()) == [
        (1,), (1,), (2,), (2,)]  # both replicas each
    assert {sub_sn for sub_sn, _ in sent} == {(2, 0)}
    assert ingress.frontier() == (2,) and not ingress.log_due()
    assert ingress.cut_item() == 3  # logged before it was cut: it leaves at once
    assert ingress.frontier() == (3,) and not ingress.log_due()
    with pytest.raises(LocalProtocolError, match="logged up to 2: 3 were logged"):
        ingress.inputs_logged(2)
    # held items count against their partitions' buffers: back-pressure, not growth
    while ingress.can_accept(records[3]):
        ingress.accept(records[3])
    assert all(len(b) + h <= 3 for b, h in zip(ingress.out.buffers, ingress.held_for))
    assert ingress.log_due()


@pytest.mark.sim
@pytest.mark.parametrize("params", [
    SimParams(checkpoints=3, crashes=3, standbys=2, restarts=1, source_partitions=3),
    SimParams(checkpoints=2, crashes=3, source_partitions=2),
    SimParams(restarts=2, crashes=0, source_partitions=3),
], ids=["all-together", "double-failure", "driver-kill-no-checkpoint"])
def test_a_partitioned_source_replays_every_committed_input_under_its_sn(params):
    results = all_ok(params, range(1, 41))
    assert sum(len(r.restarts) for r in results) >= 15


def test_inputs_sent_before_the_log_has_them_are_caught():
    params = SimParams(restarts=2, crashes=0, source_partitions=3, variant="unlogged-send")
    window = crash_window(params)
    assert any(run_schedule(seed, params, window).status == VIOLATION for seed in range(1, 21))
    params = SimParams(restarts=2, crashes=0, source_partitions=3)
    assert all(run_schedule(seed, params, window).status == OK for seed in range(1, 21))
