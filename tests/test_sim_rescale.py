"""Rescaling from a checkpoint in the simulator (DESIGN 13): every restart of the job runs
at another partition count, each new partition starting from the key groups it owns of
the old partitions' snapshots. The oracle is unchanged: the output is the failure-free
run's (the regrouping dataflow's output does not depend on the count: checked when the
world is made), and every snapshot written after a rescale is the failure-free state of
its partition at the new count. With a sink per partition, what each sink partition
holds is the failure-free output of that partition at the count in force for each
output's input (docs/design/rescaling.md: drained rescales)."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import schedules
from flux.sim.schedule import VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]

RESCALE = dict(dataflow="regroup", checkpoints=4, inputs=40, restarts=2,
               rescale_to=(3, 5, 2))


def failures(results):
    return "\n".join(f"seed {r.seed}: {r.reason}" for r in results if r.status == VIOLATION)


@pytest.mark.parametrize("shape", [
    dict(standbys=1),
    dict(stages=3, crashes=3, standbys=2, cuts=1),
    dict(placement="cluster-pairs", rescale_to=(2, 6)),
    dict(source_partitions=3, corrupt_checkpoints=1),
    dict(ingresses=3, ingress_pairs=True, crashes=2, standbys=1, rescale_cuts=1),
    dict(ingresses=2, crashes=2),
], ids=["standbys", "3-stages-cuts", "cluster-pairs", "logged-corrupt", "ingress-pairs",
        "ingresses"])
def test_restarts_at_other_counts_keep_the_failure_free_output(shape):
    results = schedules(SimParams(**{**RESCALE, **shape}), range(1, 61))
    assert not failures(results), failures(results)
    assert sum(r.rescales for r in results) >= 15  # restored from a checkpoint, split


def test_rescales_asked_while_the_job_runs_cut_then_restart_at_the_new_count():
    """``job.rescale``: a checkpoint cut at once, the job restarted from it (the driver
    lives: the sink commits what it was handed first) at the next count."""
    results = schedules(SimParams(**RESCALE, rescale_cuts=2, crashes=3, standbys=2),
                        range(1, 61))
    assert not failures(results), failures(results)
    assert sum(r.rescales for r in results) >= 40
    assert not any(r.sets_rebuilt for r in results)  # a rescale's cut is not a set's


@pytest.mark.parametrize("shape", [{}, dict(ingresses=3, ingress_pairs=True)],
                         ids=["one-ingress", "ingress-pairs"])
def test_state_installed_unsplit_is_caught(shape):
    results = schedules(SimParams(**RESCALE, **shape, variant="rescale-unsplit"),
                        range(1, 41))
    assert failures(results)


def test_a_dataflow_whose_output_depends_on_the_count_is_refused():
    with pytest.raises(ValueError, match="--dataflow regroup"):
        SimParams(**{**RESCALE, "dataflow": "counter"}).validate()


DRAINED = dict(RESCALE, restarts=1, rescale_cuts=2, standbys=1)
DRAINED_SHAPES = [dict(partitioned_egress=True, crashes=2),
                  dict(writers_on_nodes=True, corrupt_checkpoints=1),
                  dict(partitioned_egress=True, ingresses=3, ingress_pairs=True, crashes=2)]
DRAINED_IDS = ["sink-per-partition", "writers", "ingress-pairs"]


@pytest.mark.parametrize("shape", DRAINED_SHAPES, ids=DRAINED_IDS)
def test_a_sink_per_partition_rescales_at_a_drained_cut(shape):
    """A sink per partition, each committed up to its own SN: ``job.rescale`` cuts a
    checkpoint past every output a sink committed, the source gives nothing past the
    cut, the job restarts from it at the next count once it completes (again at the same
    cut if a replica died before its snapshot). Every sink partition then holds exactly
    the outputs of the inputs up to the cut (checked), and each holds the failure-free
    outputs of its partition at the count in force for their inputs. With several
    ingresses the cut is an epoch's end, and past it no ingress accepts an input (their
    epochs still end)."""
    results = schedules(SimParams(**{**DRAINED, **shape}), range(1, 61))
    assert not failures(results), failures(results)
    least = 20 if shape.get("ingresses") else 40  # (with several, fewer rescales fit)
    assert sum(len(r.drains) for r in results) >= least
    assert sum(r.rescales for r in results) >= least  # restored from a checkpoint, split


@pytest.mark.parametrize("variant", ["rescale-undrained", "rescale-under-sinks"])
@pytest.mark.parametrize("shape", DRAINED_SHAPES[:2], ids=DRAINED_IDS[:2])
def test_a_rescale_that_is_not_drained_is_caught(shape, variant):
    """The source going on past the rescale's cut, or a cut under what a sink committed
    (after a restart from an older checkpoint): sink partitions hold outputs the new
    count writes again elsewhere."""
    seeds = range(1, 21) if variant == "rescale-undrained" else range(1, 41)
    results = schedules(SimParams(**{**DRAINED, **shape, "variant": variant}), seeds)
    assert failures(results)


def test_several_ingresses_going_on_past_a_drain_or_cutting_under_the_sinks_are_caught():
    """Several ingresses (no pairs: a restarted ingress's epochs may start under what
    the sinks hold, so a cut can fall there): each broken variant is caught."""
    shape = dict(DRAINED, partitioned_egress=True, ingresses=2, crashes=2)
    assert failures(schedules(SimParams(**shape, variant="rescale-undrained"), range(1, 21)))
    assert failures(schedules(SimParams(**shape, variant="rescale-under-sinks"),
                              range(1, 101)))


def test_a_sink_per_partition_rescales_only_at_a_drained_cut():
    with pytest.raises(ValueError, match="drained rescales"):
        SimParams(**{**RESCALE, "partitioned_egress": True}).validate()
