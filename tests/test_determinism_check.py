"""The determinism check: a dataflow run twice in fresh processes with different hash
seeds must compute the same outputs and state (DESIGN 4.1), else the job is refused
naming the stage or operator."""
from __future__ import annotations

import pytest

from flux.dataflow import Dataflow, Stage
from flux.errors import DataflowError
from flux.examples import paper_dataflow
from flux.keyed_state import KeyedOperator, KeyedState
from flux.runtime.determinism import check_deterministic
from flux.testing.workloads import keyed_workload, packet_workload

pytestmark = pytest.mark.timeout(120)


def first_field(record):
    return record[0]


class WordsInSetOrder:
    """Emits the words of a record's key in ``set`` order: hash order, per process."""

    def process(self, record):
        return [(word, record[1]) for word in {f"{record[0]}-{i}" for i in range(6)}]

    def get_state(self):
        return None

    def install_state(self, state):
        pass


class SortedWords(WordsInSetOrder):
    def process(self, record):
        return [(word, record[1]) for word in sorted({f"{record[0]}-{i}" for i in range(6)})]


class SeenInSetOrder(KeyedOperator):
    """Same outputs whatever the order, but its state lists a set in hash order."""

    def __init__(self):
        self.state = KeyedState()
        self.seen = set()

    def process(self, record):
        self.seen.add(str(record[0]))
        return [record]

    def get_state(self):
        return list(self.seen)

    def install_state(self, state):
        self.seen = set(state)


class Passing(SortedWords):
    def process(self, record):
        return [record]


class Exploding(SortedWords):
    def process(self, record):
        raise RuntimeError("no such table")


@pytest.mark.parametrize("operator,stage,message", [
    (WordsInSetOrder, 1, "stage 1 .'words': WordsInSetOrder. gives other outputs"),
    (SeenInSetOrder, 1, "stage 1 .'words'., operator SeenInSetOrder: its state"),
])
def test_an_operator_that_iterates_a_set_of_strings_is_named(operator, stage, message):
    dataflow = Dataflow([Stage("words", first_field, (operator,)),
                         Stage("pass", first_field, (Passing,))])
    with pytest.raises(DataflowError, match=message) as caught:
        check_deterministic(dataflow, keyed_workload(60, seed=2, keys=9), partitions=2)
    assert "iterate sets and dicts in a sorted order" in str(caught.value)


def test_a_deterministic_dataflow_passes():
    check_deterministic(paper_dataflow(), packet_workload(300, seed=1), partitions=4)
    check_deterministic(Dataflow([Stage("words", first_field, (SortedWords,))]),
                        keyed_workload(60, seed=2, keys=9), partitions=2)


def test_an_operator_that_fails_in_a_fresh_process_says_so():
    with pytest.raises(DataflowError, match="failed in a fresh process .*no such table"):
        check_deterministic(Dataflow([Stage("x", first_field, (Exploding,))]),
                            [("a", 1)], partitions=1)


def test_a_job_refuses_a_nondeterministic_dataflow_before_it_deploys_unless_told_not_to():
    from flux.spark.job import FluxJob

    dataflow = Dataflow([Stage("words", first_field, (WordsInSetOrder,)),
                         Stage("pass", first_field, (Passing,))])
    records = keyed_workload(300, seed=2, keys=9)
    with pytest.raises(DataflowError, match="stage 1 .'words': WordsInSetOrder. gives other "
                                            "outputs from the same 200 records"):
        FluxJob(None, dataflow, records, nodes=2)
    FluxJob(None, dataflow, records, nodes=2, check_determinism=False)
