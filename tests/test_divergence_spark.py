"""Divergence detection on Spark (slow, DESIGN 14): an operator that reads the clock into
its state makes the two replicas of every partition disagree. With the default policy
the job stops with ``ReplicasDiverged`` at the first checkpoint, naming the operator;
with ``on_divergence="rebuild"`` it goes on (its outputs do not depend on the clock, so
they equal the failure-free run's) and reports the divergences and the rebuilds."""
from __future__ import annotations

import time

import pytest

from flux.keyed_state import KeyedOperator, KeyedState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPARK_EXECUTORS = 5


class CountsWithLastSeen:
    """Counts per key (the output), and keeps when each key was last seen by the wall
    clock (a real-world slip: the state differs in each replica, the outputs do not)."""

    def __init__(self):
        self.counts = {}

    def process(self, record):
        key = record[0]
        count = self.counts.get(key, [0, 0.0])[0] + 1
        self.counts[key] = [count, time.time()]
        return [(key, count)]

    def get_state(self):
        return {"counts": self.counts}

    def install_state(self, state):
        self.counts = {k: list(v) for k, v in state["counts"].items()}


def key_of(record):
    return record[0]


class LastSeenPerKey(KeyedOperator):
    """``CountsWithLastSeen`` keeping its state in a ``KeyedState``: a divergence then
    names a key (the digest is kept in groups of keys, DESIGN 14)."""

    def __init__(self):
        self.state = KeyedState()

    def process(self, record):
        key = record[0]
        count = self.state.get(key, [0, 0.0])[0] + 1
        self.state[key] = [count, time.time()]
        return [(key, count)]


def job_of(spark, tmp_path, records, operator=CountsWithLastSeen, **kw):
    from flux.connectors.sources import Paced
    from flux.dataflow import Dataflow, Stage
    from flux.spark.job import FluxJob

    flow = Dataflow([Stage("counts", key_of, (operator,))])
    cuts = {"checkpoint": str(tmp_path / "ckpt"), "checkpoint_interval": 0.5} \
        if "verify_interval" not in kw else {}
    return FluxJob(spark, flow, Paced(records, 5_000), nodes=2, standbys=1,
                   check_records=0, **cuts, **kw)  # the deploy check would refuse it


def test_a_clock_in_the_state_stops_the_job_at_the_first_checkpoint_naming_the_operator(
        spark, tmp_path):
    from flux.errors import ReplicasDiverged
    from flux.testing.workloads import keyed_workload

    job = job_of(spark, tmp_path, keyed_workload(40_000, seed=3, keys=20))
    with job:
        with pytest.raises(ReplicasDiverged, match=r"stage 1 partition \d disagree at "
                                                   r"checkpoint \d+ \(cut \d+\): the state "
                                                   r"of CountsWithLastSeen differ") as caught:
            job.wait(timeout=120)
    assert caught.value.operators == (0,)
    # within one interval: the first checkpoint the pair crossed found it
    assert caught.value.number == 1
    assert not job.restart_log  # a restart would diverge again: the job stops
    assert job.metrics.events.counts.get("divergence", 0) >= 1


def test_with_rebuild_the_job_goes_on_and_reports_each_divergence(spark, tmp_path):
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.dataflow import Dataflow, Stage
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(30_000, seed=4, keys=20)
    job = job_of(spark, tmp_path, records, on_divergence="rebuild")
    with job:
        job.wait(timeout=240)
    flow = Dataflow([Stage("counts", key_of, (CountsWithLastSeen,))])
    want = reference_output(flow, records, 2)
    assert [wire_form(x) for x in job.delivered] == [wire_form(x) for x in want]
    counts = job.metrics.events.counts
    assert counts.get("divergence", 0) >= 1
    assert counts.get("catch-up done", 0) >= 1  # the replica was rebuilt from its twin


def test_without_checkpoints_verify_cuts_find_it(spark, tmp_path):
    from flux.errors import ReplicasDiverged
    from flux.testing.workloads import keyed_workload

    job = job_of(spark, tmp_path, keyed_workload(40_000, seed=5, keys=20), verify_interval=0.5)
    with job:
        with pytest.raises(ReplicasDiverged, match="the state of CountsWithLastSeen") as caught:
            job.wait(timeout=120)
    assert caught.value.number == 1  # the first verify cut
    assert not (tmp_path / "ckpt").exists()  # nothing written


def test_a_split_job_without_checkpoints_finds_it_at_a_verify_cut(spark):
    """The input read on the executors (``ListSplits``): the driver names an epoch's end
    every ``verify_interval`` and the pairs of ingresses cut there, as for a checkpoint
    (nothing is written)."""
    from flux.connectors.split_sources import ListSplits
    from flux.dataflow import Dataflow, Stage
    from flux.errors import ReplicasDiverged
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(40_000, seed=5, keys=20)]
    splits = ListSplits([records[0::2], records[1::2]], rate=2_500)
    job = FluxJob(spark, Dataflow([Stage("counts", key_of, (CountsWithLastSeen,))]), splits,
                  nodes=2, standbys=1, check_records=0, verify_interval=0.5)
    with job:
        with pytest.raises(ReplicasDiverged, match="the state of CountsWithLastSeen") as caught:
            job.wait(timeout=120)
    assert caught.value.number == 1  # the first verify cut
    assert job.attempt.ingress_process is None  # the driver read no input


def test_a_keyed_state_that_diverges_names_a_key_whose_values_differ(spark, tmp_path):
    """The controller asks both replicas for their pairs in the groups of the digest that
    differ, as at the cut, and names the first key there whose values differ."""
    from flux.errors import ReplicasDiverged
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(40_000, seed=6, keys=20_000)
    job = job_of(spark, tmp_path, records, operator=LastSeenPerKey)
    with job:
        with pytest.raises(ReplicasDiverged, match=r"the state of LastSeenPerKey differ \(a "
                                                   r"key whose value differs: ") as caught:
            job.wait(timeout=120)
    operator, key = caught.value.key
    assert operator == 0 and key in {key_of(r) for r in records}
    assert caught.value.number == 1


class WordsPerKey(KeyedOperator):
    """Per key, the distinct words seen, kept in the order a ``set`` of them iterates: a
    set of strings iterates in an order its process's hash seed decides. The outputs (how
    many distinct words) do not depend on it."""

    def __init__(self):
        self.state = KeyedState()

    def process(self, record):
        key, word = record
        words = set(self.state.get(key, ()))
        words.add(word)
        self.state[key] = list(words)
        return [(key, len(words))]


def words_workload(n: int, seed: int):
    from flux.testing.workloads import keyed_workload

    return [(key, f"word{value % 40}") for key, value in keyed_workload(n, seed=seed, keys=50)]


@pytest.fixture
def random_hash_seeds(spark):
    """Executors whose Pythons each draw their own hash seed. PySpark gives every worker
    the driver's ``PYTHONHASHSEED`` (0 when the driver has none), so by default a set of
    strings iterates alike in both replicas; a driver started with
    ``PYTHONHASHSEED=random`` gives each executor's Python a seed of its own."""
    env = spark.sparkContext.environment
    before = env.get("PYTHONHASHSEED")
    env["PYTHONHASHSEED"] = "random"  # new worker daemons for this job's tasks
    yield
    env["PYTHONHASHSEED"] = before


def test_a_set_of_strings_iterated_in_hash_order_stops_the_job_naming_the_operator(
        spark, tmp_path, random_hash_seeds):
    from flux.errors import ReplicasDiverged

    job = job_of(spark, tmp_path, words_workload(30_000, seed=7), operator=WordsPerKey)
    with job:
        with pytest.raises(ReplicasDiverged, match=r"the state of WordsPerKey differ") as caught:
            job.wait(timeout=120)
    assert caught.value.number == 1  # within one interval
    assert caught.value.key is not None and caught.value.key[0] == 0


def test_a_set_of_strings_with_rebuild_goes_on_and_reports_it(spark, tmp_path,
                                                              random_hash_seeds):
    from flux.dataflow import Dataflow, Stage
    from flux.operator import wire_form
    from flux.reference import reference_output

    records = words_workload(20_000, seed=8)
    job = job_of(spark, tmp_path, records, operator=WordsPerKey, on_divergence="rebuild")
    with job:
        job.wait(timeout=240)
    want = reference_output(Dataflow([Stage("words", key_of, (WordsPerKey,))]), records, 2)
    assert [wire_form(x) for x in job.delivered] == [wire_form(x) for x in want]
    counts = job.metrics.events.counts
    assert counts.get("divergence", 0) >= 1 and counts.get("catch-up done", 0) >= 1


def test_with_pysparks_own_hash_seed_a_set_of_strings_iterates_alike_in_both_replicas(
        spark, tmp_path):
    """What the docs say of PySpark: every worker gets the driver's seed (0 by default),
    so the same operator finishes without a divergence (no false alarm either)."""
    from flux.dataflow import Dataflow, Stage
    from flux.operator import wire_form
    from flux.reference import reference_output

    assert spark.sparkContext.environment.get("PYTHONHASHSEED") != "random"
    records = words_workload(10_000, seed=9)
    job = job_of(spark, tmp_path, records, operator=WordsPerKey)
    with job:
        job.wait(timeout=120)
    want = reference_output(Dataflow([Stage("words", key_of, (WordsPerKey,))]), records, 2)
    assert [wire_form(x) for x in job.delivered] == [wire_form(x) for x in want]
    assert job.metrics.events.counts.get("divergence", 0) == 0
