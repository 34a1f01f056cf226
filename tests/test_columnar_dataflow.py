"""Stages of batch operators on the columnar data plane (DESIGN 11): Arrow batches through
the whole protocol, routed by key columns, with exactly the per-record dataflow's output,
SN for SN, through failures too; and the errors that name what is wrong."""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flux.dataflow import Dataflow, Stage
from flux.deploy_checks import check_batch_api, check_state_round_trip
from flux.errors import DataflowError, OperatorError
from flux.examples import paper_dataflow, vectorized_dataflow
from flux.keyed_state import KeyedOperator, KeyedState
from flux.operator import Map, wire_form
from flux.reference import reference_output
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import packet_workload
from thread_runs import assert_exact_and_caught_up_in_parts, run

pytestmark = pytest.mark.timeout(120)

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.int64())])


class Spread:
    """A batch operator without state: a row with x < 0 makes nothing, any other row
    ``(k, x)`` makes x % 3 rows ``(k, x, i)``: some rows none, some several."""

    def process_arrow(self, batch):
        x = batch.column("x").to_numpy()
        counts = np.where(x < 0, 0, x % 3)
        rows = np.repeat(np.arange(batch.num_rows), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        i = np.arange(len(rows)) - first
        out = pa.RecordBatch.from_arrays(
            [batch.column("k").take(pa.array(rows)), batch.column("x").take(pa.array(rows)),
             pa.array(i, pa.int64())], names=["k", "x", "i"])
        return rows, out

    def get_state(self):
        return None

    def install_state(self, state):
        pass


class Sums:
    """A keyed running sum on batches: per row, ``(k, sum of x of k so far)``."""

    def __init__(self):
        self.sums = {}

    def process_arrow(self, batch):
        out = []
        for k, x in zip(batch.column("k").to_pylist(), batch.column("x").to_pylist()):
            self.sums[k] = self.sums.get(k, 0) + x
            out.append(self.sums[k])
        result = pa.RecordBatch.from_arrays([batch.column("k"), pa.array(out, pa.int64())],
                                            names=["k", "sum"])
        return np.arange(batch.num_rows), result

    def get_state(self):
        return sorted([k, v] for k, v in self.sums.items())

    def install_state(self, state):
        self.sums = {k: v for k, v in (state or [])}


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_the_vectorized_paper_dataflow_gives_the_per_record_output_sn_for_sn():
    records = packet_workload(2500, seed=3, pairs=200, apps=4, sources=20)
    expected = reference_output(paper_dataflow(), records, 4)
    assert [wire_form(x) for x in reference_output(vectorized_dataflow(), records, 4)] == \
        [wire_form(x) for x in expected]
    cluster, _ = run(vectorized_dataflow(), records, partitions=4, batch_rows=256)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@pytest.mark.parametrize("victim", ["node1", "node2"])
def test_a_node_killed_under_batch_operators_changes_nothing_in_the_output(victim):
    records = packet_workload(6000, seed=8, pairs=600, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 4)
    cluster, _ = run(vectorized_dataflow(), records, partitions=4, kill=victim)
    assert not cluster.errors and not cluster.controller.error
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
    kinds = [what for _, what, _ in cluster.controller.events]
    assert "take-over done" in kinds and "catch-up done" in kinds


def test_batch_and_record_stages_mix_in_one_dataflow():
    """Records become columns where a stage of batch operators begins (its schema) and
    tuples where a stage of record operators follows one."""
    dataflow = Dataflow([
        Stage("spread", "k", (Spread,), schema=SCHEMA),
        Stage("sums", ("k",), (Sums,)),
        Stage("records", lambda r: r[0], (lambda: Map(lambda r: (r[0], r[1] * 10)),)),
    ])
    records = [(i % 7, (i * 5) % 11 - 2) for i in range(900)]
    cluster, expected = run(dataflow, records, partitions=3, batch_rows=64)
    assert not cluster.errors, cluster.errors
    assert len(expected) > 500
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


def test_a_stage_of_batch_operators_needs_columns_in():
    with pytest.raises(DataflowError, match="stage 'spread': its operators take Arrow batches "
                                            r"\(process_arrow\), and its input comes as "
                                            "records: give it schema="):
        Dataflow([Stage("spread", lambda r: r[0], (Spread,))])
    with pytest.raises(DataflowError, match=r"key columns \['y'\] are not in its schema"):
        Dataflow([Stage("spread", ("k", "y"), (Spread,), schema=SCHEMA)])
    with pytest.raises(DataflowError, match="mixes operators on Arrow batches"):
        Dataflow([Stage("mixed", "k", (Spread, lambda: Map(str)), schema=SCHEMA)])
    with pytest.raises(DataflowError, match="schema must be a pyarrow.Schema"):
        Dataflow([Stage("spread", "k", (Spread,), schema=["k", "x"])])
    # after a stage of batch operators, columns come without a schema
    Dataflow([Stage("a", "k", (Spread,), schema=SCHEMA), Stage("b", ("k", "i"), (Spread,))])


class Raises(Spread):
    def process_arrow(self, batch):
        if pc.any(pc.equal(batch.column("x"), 99)).as_py():
            raise ValueError("x is 99")
        return super().process_arrow(batch)


class Misnumbers(Spread):
    def process_arrow(self, batch):
        rows, out = super().process_arrow(batch)
        return rows[::-1].copy(), out


def first_error(dataflow, records):
    """The error that stops a job over ``records``."""
    cluster = ThreadCluster(dataflow, 2, iter(records), standbys=1)
    with cluster:
        cluster.wait_until(lambda: cluster.errors or cluster.controller.error, 60)
    return cluster.controller.error or (cluster.errors and cluster.errors[0])


@pytest.mark.parametrize("operator, message", [
    (Raises, r"operator Raises \(on a batch of \d+ records, \(\d+,\) to \(\d+,\)\) failed in "
             r"stage 1, partition \d, on the record with sequence number \(\d+,\): "
             r"ValueError: x is 99"),
    (Misnumbers, r"operator Misnumbers .* process_arrow must return \(rows, RecordBatch\), "
                 r"rows non-decreasing"),
])
def test_a_batch_operator_that_fails_is_named(operator, message):
    records = [(i % 5, 99 if i == 300 else i % 7 + 1) for i in range(600)]
    error = first_error(Dataflow([Stage("s", "k", (operator,), schema=SCHEMA)]), records)
    assert isinstance(error, OperatorError), error
    assert re.search(message, str(error)), str(error)


def test_a_record_that_does_not_fit_the_schema_is_named_by_its_input():
    records = [(i % 5, i) for i in range(100)] + [(1, "not an int")] + [(2, 3)] * 10
    error = first_error(Dataflow([Stage("s", "k", (Spread,), schema=SCHEMA)]), records)
    assert isinstance(error, OperatorError), error
    assert "sequence number (101,)" in str(error) and "does not fit the columns" in str(error)


class PerBatch(Spread):
    """Breaks the batch contract: one output per batch, whatever its rows."""

    def process_arrow(self, batch):
        return np.array([0]), batch.slice(0, 1)


class Forgets(Sums):
    """Breaks the state contract: its snapshot leaves the last key out."""

    def get_state(self):
        return super().get_state()[:-1]


def test_the_deploy_checks_run_batch_operators_and_name_the_one_that_breaks_a_rule():
    records = packet_workload(300, seed=1, pairs=20, apps=3, sources=5)
    check_state_round_trip(vectorized_dataflow(), records, 3)
    check_batch_api(vectorized_dataflow(), records)
    ints = [(i % 4, i) for i in range(60)]
    with pytest.raises(DataflowError, match=r"stage 'p' operator 0 \(PerBatch\): a batch gives"):
        check_batch_api(Dataflow([Stage("p", "k", (PerBatch,), schema=SCHEMA)]), ints)
    with pytest.raises(DataflowError, match=r"stage 'f' operator 0 \(Forgets\) in partition "
                                            r"\d: .*state does not round-trip|emits"):
        check_state_round_trip(Dataflow([Stage("f", "k", (Forgets,), schema=SCHEMA)]), ints, 2)


def explode_even(df):
    """Drops odd x, and makes x // 2 rows (k, x, j) of each even one (pandas keeps the
    input row's position as the index through the filter and the explode)."""
    df = df[df.x % 2 == 0]
    df = df.assign(j=[list(range(x // 2)) for x in df.x]).explode("j")
    return df.dropna(subset=["j"]).astype({"j": "int64"})


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_pandas_function_is_an_operator_numbered_as_record_by_record():
    from flux import MapInPandas

    dataflow = Dataflow([Stage("pandas", "k", (lambda: MapInPandas(explode_even),),
                               schema=SCHEMA),
                         Stage("sums", ("k",), (Sums,))])
    records = [(i % 6, i % 9) for i in range(700)]
    cluster, expected = run(dataflow, records, partitions=2, batch_rows=50)
    assert not cluster.errors, cluster.errors
    # by hand: input n = (k, x) with x even makes x // 2 rows, each (k, running sum of k)
    sums, by_hand = {}, []
    for n, (k, x) in enumerate(records, 1):
        for j in range(x // 2 if x % 2 == 0 else 0):
            sums[k] = sums.get(k, 0) + x
            by_hand.append(((n, j + 1, 1), (k, sums[k])))
    assert expected == by_hand
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in by_hand]


def test_a_pandas_function_that_loses_the_index_is_named():
    from flux import MapInPandas

    records = [(i % 3, i) for i in range(40)]
    error = first_error(Dataflow([Stage("p", "k", (lambda: MapInPandas(
        lambda df: df.reset_index(drop=True).iloc[::-1]),), schema=SCHEMA)]), records)
    assert isinstance(error, OperatorError), error
    assert "rows non-decreasing" in str(error)


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_source_of_arrow_batches_gives_the_output_of_its_rows_as_records():
    """A columnar source's batches are as many inputs as their rows, numbered in order;
    records between them make items of their own kind."""
    from exchange.columns import to_batch
    from flux.examples.vectorized import PACKET_SCHEMA

    records = packet_workload(3000, seed=5, pairs=150, apps=3, sources=10)
    source, i, size = [], 0, 1
    while i < len(records):
        chunk = records[i:i + size]
        if size % 5 == 0:
            source.extend(chunk)  # now and then plain records between batches
        else:
            source.append(to_batch(chunk, PACKET_SCHEMA))
        i, size = i + size, size % 97 + 3
    expected = reference_output(paper_dataflow(), records, 3)
    assert reference_output(vectorized_dataflow(), source, 3) == expected
    cluster = ThreadCluster(vectorized_dataflow(), 3, iter(source), standbys=1, batch_rows=512)
    with cluster:
        cluster.wait_until(lambda: len(cluster.delivered) >= len(expected) or cluster.errors, 60)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


class AsTable(Spread):
    """Returns its outputs as a pyarrow.Table (taken as one batch)."""

    def process_arrow(self, batch):
        rows, out = super().process_arrow(batch)
        return rows, pa.Table.from_batches([out.slice(0, 2), out.slice(2)], schema=out.schema)


def test_dict_records_and_table_outputs_are_taken():
    """Records may be dicts by column name; an operator may return a Table."""
    records = [(i % 5, i % 7) for i in range(400)]
    as_dicts = [{"k": k, "x": x} for k, x in records]
    expected = reference_output(Dataflow([Stage("s", "k", (Spread,), schema=SCHEMA)]),
                                records, 2)
    cluster, _ = run(Dataflow([Stage("s", "k", (AsTable,), schema=SCHEMA)]), as_dicts,
                     partitions=2, batch_rows=64)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


class KeyedSums(KeyedOperator):
    """``Sums`` with its state in a KeyedState: per row, (k, the running sum of x)."""

    def __init__(self):
        self.state = KeyedState()

    def process_arrow(self, batch):
        keys = batch.column("k").to_pylist()
        xs = batch.column("x").to_pylist()
        distinct = list(dict.fromkeys(keys))
        sums = dict(zip(distinct, self.state.get_many(distinct, 0)))
        out = []
        for k, x in zip(keys, xs):
            sums[k] += x
            out.append(sums[k])
        self.state.set_many(list(sums), list(sums.values()))
        return np.arange(batch.num_rows), pa.RecordBatch.from_arrays(
            [batch.column("k"), pa.array(out, pa.int64())], names=["k", "sum"])


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_batch_operator_on_a_keyed_state_catches_up_in_parts():
    """A batch operator whose state is a KeyedState is offered to the two-phase catch-up
    as a record operator is: the new replica installs bulk parts, then the keys changed
    meanwhile, and the output stays exact."""
    from flux.operator import OperatorChain

    assert OperatorChain([KeyedSums()]).keyed_stores()[0] is not None
    dataflow = Dataflow([Stage("sums", "k", (KeyedSums,), schema=SCHEMA)])
    records = [(i % 3000, i % 11) for i in range(30_000)]  # 3000 keys: several parts
    cluster, expected = run(dataflow, records, partitions=2, kill="node1", batch_rows=128)
    assert_exact_and_caught_up_in_parts(cluster, expected)


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_per_record_operators_keyed_by_columns_give_the_paper_output():
    """The paper's per-record operators with their stages keyed by columns (Arrow between
    the stages, routing by a vectorized hash): the same output, SN for SN."""
    from flux.examples.dataflows import paper_dataflow_on_columns

    records = packet_workload(3000, seed=4, pairs=300, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 3)
    cluster, _ = run(paper_dataflow_on_columns(), records, partitions=3, batch_rows=256)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
