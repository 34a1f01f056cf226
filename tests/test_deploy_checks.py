"""Bad configuration is refused when the job is built, before any Spark task starts, with
a message that says what to fix (no Spark needed: the checks run on the driver)."""
from __future__ import annotations

from functools import partial

import pytest

from flux.dataflow import Dataflow, Stage
from flux.errors import DataflowError
from flux.examples import paper_dataflow
from flux.operator import Map
from flux.examples.sessions import SessionReconstruction, session_key
from flux.connectors.sources import RateLimited
from flux.spark.job import FluxJob
from flux.testing.workloads import packet_workload

RECORDS = packet_workload(300, seed=1, pairs=200, apps=2, sources=10)


def job(dataflow=None, source=RECORDS, **kw):
    return FluxJob(None, dataflow or paper_dataflow(), source, **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(nodes=1), "Flux needs at least 2 nodes"),
    (dict(standbys=-1), "standbys must be >= 0, got -1"),
])
def test_impossible_cluster_sizes_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        job(**kw)


class SetState:
    """Keeps its state in a set, which msgpack cannot carry."""

    def __init__(self):
        self.seen = set()

    def process(self, record):
        self.seen.add(record[0])
        return [record]

    def get_state(self):
        return self.seen

    def install_state(self, state):
        self.seen = set(state or ())


def test_a_state_msgpack_cannot_serialize_is_refused_naming_the_operator():
    flow = Dataflow([Stage("tag", session_key, (SetState,))])
    with pytest.raises(DataflowError, match=r"stage 'tag' operator 0 \(SetState\) in partition "
                                            r"\d: get_state\(\) cannot be serialized by msgpack"):
        job(flow)


def object_key(record):
    return object()


def test_a_partition_key_msgpack_cannot_hash_is_refused():
    flow = Dataflow([Stage("sessions", object_key, (SessionReconstruction,))])
    with pytest.raises(DataflowError, match="fails on the source's first 200 records: "
                                            "UnhashableKey: partition key <object object"):
        job(flow)


def explode(record):
    raise ZeroDivisionError("the operator has a bug")


def test_an_operator_that_raises_on_the_first_records_is_refused():
    flow = Dataflow([Stage("sessions", session_key, (partial(Map, explode),))])
    with pytest.raises(DataflowError, match="on one of the source.s first 200 records in stage "
                                            "1 .'sessions'., partition [0-3], operator Map raised "
                                            "ZeroDivisionError: the operator has a bug"):
        job(flow)


def test_the_checks_take_nothing_away_from_an_iterator_source():
    j = job(source=iter(RECORDS))
    assert list(j.source) == RECORDS


def test_the_checks_do_not_make_a_rate_limited_feed_arrive_early():
    feed = RateLimited(RECORDS, rate=1e9)
    j = job(source=feed)
    assert j.source is feed and feed.read == 0 and feed.start is None
    assert list(feed) == RECORDS


def test_a_node_builds_ahead_the_chains_its_placement_gives_one_node():
    """Before it registers, every task (standbys too) builds the operator chains a node
    hosts per stage: a catch-up never waits for a standby to build big operators."""
    from pyspark import cloudpickle

    from flux.examples import paper_dataflow
    from flux.runtime.config import NodeConfig
    from flux.spark.node_task import load_dataflow

    df = paper_dataflow()
    for replication, per_stage in (("flux", 2), ("none", 1)):
        config = NodeConfig(dataflow=cloudpickle.dumps(df), stages=len(df.stages), partitions=4,
                            replication=replication)
        dataflow, spares = load_dataflow(config)
        assert {s: len(chains) for s, chains in spares.items()} == {1: per_stage, 2: per_stage}
        chains = [c for cs in spares.values() for c in cs]
        assert len({id(c) for c in chains}) == len(chains)  # fresh, never shared


def test_a_rebalancing_policy_is_refused_where_groups_cannot_move(tmp_path):
    """``rebalance=`` needs live moves: checkpoints to ride, a stage that can move."""
    from flux import ListSplits, Rebalance
    from flux.errors import RescaleRefused

    with pytest.raises(ValueError, match="give the job checkpoint="):
        job(rebalance=Rebalance())
    with pytest.raises(TypeError, match="rebalance must be a flux.Rebalance"):
        job(rebalance=30.0, checkpoint=str(tmp_path / "a"))
    split_job = job(source=ListSplits([RECORDS[:150], RECORDS[150:]]),
                    rebalance=Rebalance(), checkpoint=str(tmp_path / "b"))
    split_job.stop()  # several ingresses move groups too: each switches at the cut's epoch
    with pytest.raises(RescaleRefused, match="stage 3 cannot move live"):
        job(rebalance=Rebalance(stages=(3,)), checkpoint=str(tmp_path / "c"))


def test_kill_node_says_what_a_machine_crash_signals_and_refuses_other_kinds():
    # chaos's double failures rely on "machine" taking the worker with its JVM: a JVM
    # killed alone leaves the worker alive long enough to hand its state on
    from flux.spark.job import _targets

    assert [p for _, p in _targets("machine", 11, 22)] == [11, 22]
    assert _targets("worker", 11, 22) == [("Python worker", 11)]
    assert _targets("executor", 11, 22) == [("executor JVM", 22)]
    with pytest.raises(ValueError, match="'worker', 'executor' or 'machine'"):
        _targets("host", 11, 22)
