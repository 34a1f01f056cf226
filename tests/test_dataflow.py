"""Building dataflows: API checks and the state round-trip check (DESIGN 4.1, 5)."""
from __future__ import annotations

import pickle
from functools import partial

import pytest

from flux.dataflow import Dataflow, Stage
from flux.deploy_checks import check_state_round_trip
from flux.errors import DataflowError
from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow, packet_dataflow
from flux.operator import Map, OperatorChain, keyed_state, keyed_table, tuplify
from flux.testing.counter import KeyedCounter, first_field
from flux.testing.workloads import keyed_workload, packet_workload

PACKETS = packet_workload(3000, seed=5, pairs=300, apps=3, sources=20, concurrent=50)
KEYED = keyed_workload(600, seed=5, keys=6)


def one_stage(factory, name="solo"):
    return Dataflow([Stage(name, first_field, (factory,))])


# --- construction ------------------------------------------------------------

def test_stage_builds_fresh_chains():
    stage = Stage("count", first_field, [partial(KeyedCounter, fanout_every=2), partial(Map, str)])
    assert isinstance(stage.operators, tuple)
    a, b = stage.build_chain(), stage.build_chain()
    assert isinstance(a, OperatorChain) and len(a.operators) == 2
    assert a.operators[0] is not b.operators[0]
    assert a.operators[0].fanout_every == 2


def test_dataflow_basics():
    flow = counting_dataflow(3)
    assert len(flow) == 3 and isinstance(flow.stages, tuple)
    assert [s.name for s in flow.stages] == ["count1", "count2", "count3"]
    assert len(paper_dataflow()) == 2
    assert [s.name for s in packet_dataflow(1).stages] == ["sessions"]
    assert [s.name for s in packet_dataflow(4).stages] == ["sessions", "stats", "count3", "count4"]


@pytest.mark.parametrize("flow", [paper_dataflow(window=100), counting_dataflow(2), packet_dataflow(3)])
def test_example_dataflows_pickle(flow):
    for stage in flow.stages:
        clone = pickle.loads(pickle.dumps(stage))
        assert clone.name == stage.name
        assert type(clone.build_chain().operators[0]) is type(stage.build_chain().operators[0])


def test_rejects_empty_dataflow():
    with pytest.raises(DataflowError, match="at least one stage"):
        Dataflow([])


def test_rejects_a_key_that_is_neither_a_function_nor_columns():
    with pytest.raises(DataflowError, match="stage 'bad': key 42 is neither callable nor "
                                            "column names"):
        Dataflow([Stage("bad", 42, (KeyedCounter,))])


def test_a_key_of_columns_needs_its_input_as_columns():
    with pytest.raises(DataflowError, match="stage 'bad': key 'src' names columns, and its "
                                            "input comes as records: give it schema="):
        Dataflow([Stage("bad", "src", (KeyedCounter,))])


class NoProcess:
    def get_state(self):
        return None

    def install_state(self, state):
        pass


def test_rejects_operator_without_process():
    with pytest.raises(DataflowError, match=r"stage 'second' operator 0 \(NoProcess\).*no process\(\)"):
        Dataflow([Stage("first", first_field, (KeyedCounter,)),
                  Stage("second", first_field, (NoProcess,))])


def test_rejects_factory_that_shares_one_instance():
    shared = KeyedCounter()
    with pytest.raises(DataflowError, match="same object twice"):
        Dataflow([Stage("s", first_field, (lambda: shared,))])


def test_rejects_non_callable_factory_and_duplicate_names():
    with pytest.raises(DataflowError, match="not callable"):
        Dataflow([Stage("s", first_field, (KeyedCounter(),))])
    with pytest.raises(DataflowError, match="two stages"):
        Dataflow([Stage("s", first_field, (KeyedCounter,)), Stage("s", first_field, (KeyedCounter,))])


# --- state round trip: accepted ----------------------------------------------

@pytest.mark.parametrize("flow, inputs", [
    (paper_dataflow(window=200), PACKETS),
    (packet_dataflow(4, window=200), PACKETS),
    (counting_dataflow(1), KEYED),
    (counting_dataflow(3), KEYED),
])
def test_examples_survive_state_round_trip(flow, inputs):
    check_state_round_trip(flow, inputs, partitions=3)


def test_tuple_versus_list_alone_is_not_a_failure():
    # The copy sees its input as lists and re-emits it; the original emits tuples.
    check_state_round_trip(one_stage(partial(Map, tuple)), KEYED[:10], 2)
    check_state_round_trip(one_stage(partial(Map, list)), KEYED[:10], 2)


class CountsAsAMap:
    """State as a msgpack map whose copy is rebuilt in the reverse key order: other bytes,
    the same state."""

    def __init__(self):
        self.counts = {}

    def process(self, record):
        key = str(record[0])
        self.counts[key] = self.counts.get(key, 0) + 1
        return [(key, self.counts[key])]

    def get_state(self):
        return dict(self.counts)

    def install_state(self, state):
        self.counts = dict(reversed(list(state.items())))


def test_a_map_rebuilt_in_another_key_order_is_the_same_state():
    check_state_round_trip(one_stage(CountsAsAMap), KEYED[:40], 2)


# --- state round trip: rejected ----------------------------------------------

class Base:
    """A hand-made keyed counter (its own dict, not a KeyedState) to break in one way per subclass."""

    def __init__(self):
        self.counts = {}

    def process(self, record):
        key = tuplify(record[0])
        count = self.counts[key] = self.counts.get(key, 0) + 1
        return [(key, count, record[1])]

    def get_state(self):
        return keyed_state(self.counts)

    def install_state(self, state):
        self.counts = keyed_table(state)


class SetState(Base):
    def get_state(self):
        return {"keys": set(self.counts)}


class ObjectState(Base):
    def get_state(self):
        return [object()] if self.counts else []


class TupleKeyedDict(Base):
    def get_state(self):
        return {(k, 0): v for k, v in self.counts.items()}


class DropsOneKey(Base):
    def install_state(self, state):
        super().install_state(state[1:])


class HidesPartOfState(Base):
    """get_state leaves out the counter that drives the outputs."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def process(self, record):
        self.seen += 1
        return [(record[0], self.seen, record[1])]


class EmitsInDictOrder(Base):
    """Emits all counts in dict order: the original's is the order its keys first came in,
    a copy's the key order of its state (DESIGN 4.1)."""

    def process(self, record):
        super().process(record)
        return list(self.counts.items())


class NeedsTuples(Base):
    """Breaks on records that crossed msgpack (lists), as the first operator of a stage sees them."""

    def process(self, record):
        return super().process(record + (0,))


@pytest.mark.parametrize("cls, why", [
    (SetState, "cannot be serialized by msgpack"),
    (ObjectState, "cannot be serialized by msgpack"),
    (TupleKeyedDict, "does not decode from msgpack"),
    (DropsOneKey, "does not round-trip"),
    (HidesPartOfState, "copy rebuilt from msgpack'd state emits"),
    (EmitsInDictOrder, "copy rebuilt from msgpack'd state emits"),
    (NeedsTuples, "copy rebuilt from msgpack'd state failed on"),
])
def test_broken_state_is_rejected_naming_the_operator(cls, why):
    first = cls is NeedsTuples  # only a stage's first operator gets records off the wire
    flow = Dataflow([Stage("count", first_field, (KeyedCounter,)),
                     Stage("broken", first_field, (cls,) if first else (KeyedCounter, cls))])
    with pytest.raises(DataflowError) as info:
        check_state_round_trip(flow, KEYED[:40], partitions=2)
    message = str(info.value)
    assert f"stage 'broken' operator {0 if first else 1} ({cls.__name__})" in message
    assert why in message


def test_state_that_turns_bad_late_is_rejected():
    class SetAfterFive(Base):
        def get_state(self):
            return set() if sum(self.counts.values()) > 5 else super().get_state()

    with pytest.raises(DataflowError, match=r"\(SetAfterFive\).*cannot be serialized"):
        check_state_round_trip(one_stage(SetAfterFive), KEYED[:20], partitions=1)

    class TupleKeysAfterFive(Base):
        """Undecodable once the copy runs beside it (after 10 records), the same way in
        the original and its copy."""

        def get_state(self):
            if sum(self.counts.values()) > 15:
                return {(k, 0): v for k, v in sorted(self.counts.items())}
            return super().get_state()

    with pytest.raises(DataflowError, match=r"\(TupleKeysAfterFive\).*does not decode"):
        check_state_round_trip(one_stage(TupleKeysAfterFive), KEYED[:20], partitions=1)
