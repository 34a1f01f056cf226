"""Operator API, helpers and the example operators: exact outputs and state round trips."""
from __future__ import annotations

import pytest

from flux.errors import DataflowError
from flux.operator import (
    REQUIRED_METHODS,
    Filter,
    FlatMap,
    KeyedAggregate,
    Map,
    OperatorChain,
    check_operator_api,
    keyed_state,
    keyed_table,
    tuplify,
    wire_form,
)
from flux.testing.counter import KeyedCounter, first_field, key_and_count
from flux.examples.sessions import SessionReconstruction, session_key
from flux.examples.stats import WindowedDurationStats, stats_key


def run(op, records):
    return [list(op.process(r)) for r in records]


def continue_from_copy(factory, first, rest):
    """Outputs of the original and of a copy rebuilt from its msgpack'd state, on ``rest``."""
    original = factory()
    run(original, first)
    copy = factory()
    copy.install_state(wire_form(original.get_state()))
    assert wire_form(copy.get_state()) == wire_form(original.get_state())
    return run(original, rest), run(copy, [wire_form(r) for r in rest])


# --- API --------------------------------------------------------------------

def test_required_methods():
    assert REQUIRED_METHODS == ("process", "get_state", "install_state")


def test_check_operator_api_names_operator_and_method():
    class NoInstall:
        def process(self, r):
            return [r]

        def get_state(self):
            return None

    with pytest.raises(DataflowError, match=r"my-op: NoInstall object has no install_state\(\)"):
        check_operator_api(NoInstall(), "my-op")
    check_operator_api(Map(str), "map")  # complete: no error
    assert issubclass(DataflowError, ValueError)


def test_stateless_helpers():
    assert run(Map(lambda x: x * 2), [1, 2]) == [[2], [4]]
    assert run(Filter(lambda x: x % 2), [1, 2, 3]) == [[1], [], [3]]
    assert run(FlatMap(lambda x: range(x)), [0, 3]) == [[], [0, 1, 2]]
    for op in (Map(str), Filter(bool), FlatMap(list)):
        assert op.get_state() is None
        op.install_state(None)
        with pytest.raises(DataflowError):
            op.install_state([1])


def test_keyed_state_is_sorted_pairs_and_keys_come_back_as_tuples():
    table = {("b", (1, 2)): 1, ("a", (3, 4)): 2}
    pairs = keyed_state(table)
    assert pairs == [[("a", (3, 4)), 2], [("b", (1, 2)), 1]]
    assert keyed_table(wire_form(pairs)) == table
    assert keyed_state({1: "x", "a": "y"}) == [[1, "x"], ["a", "y"]]  # msgpack-byte order
    assert tuplify([1, [2, [3]]]) == (1, (2, (3,)))


def test_keyed_aggregate_outputs_and_round_trip():
    def make():
        return KeyedAggregate(key=lambda r: (r[0], r[1]), fold=lambda v, r: v + r[2], initial=0)

    records = [("a", 1, 5), ("b", 1, 1), ("a", 1, 2), ["a", 1, 1]]
    assert run(make(), records) == [[(("a", 1), 5)], [(("b", 1), 1)], [(("a", 1), 7)], [(("a", 1), 8)]]
    op = make()
    run(op, records)
    assert op.get_state() == [[("a", 1), 8], [("b", 1), 1]]
    original, copy = continue_from_copy(make, records, [("b", 1, 3), ("c", 0, 1)])
    assert original == copy == [[(("b", 1), 4)], [(("c", 0), 1)]]


def test_keyed_aggregate_calls_a_callable_initial_per_key():
    op = KeyedAggregate(key=first_field, fold=lambda v, r: v + [r[1]], initial=list,
                        emit=lambda k, v, r: [(k, len(v))])
    assert run(op, [("a", 1), ("b", 2), ("a", 3)]) == [[("a", 1)], [("b", 1)], [("a", 2)]]


# --- chains -----------------------------------------------------------------

class Tagger:
    """Emits two tagged copies of each input and logs what it saw and which hooks ran."""

    def __init__(self, tag, log):
        self.tag, self.log, self.n = tag, log, 0

    def process(self, record):
        self.log.append((self.tag, record))
        self.n += 1
        return [f"{record}{self.tag}1", f"{record}{self.tag}2"]

    def get_state(self):
        return self.n

    def install_state(self, state):
        self.n = state

    def init_trans(self):
        self.log.append((self.tag, "init"))

    def end_trans(self):
        self.log.append((self.tag, "end"))


def test_chain_runs_depth_first_and_keeps_order():
    log = []
    chain = OperatorChain([Tagger("a", log), Tagger("b", log)])
    assert chain.process("x") == ["xa1b1", "xa1b2", "xa2b1", "xa2b2"]
    assert log == [("a", "x"), ("b", "xa1"), ("b", "xa2")]
    assert chain.get_state() == [1, 2]
    chain.install_state([5, 6])
    assert chain.get_state() == [5, 6]
    with pytest.raises(DataflowError):
        chain.install_state([1])


def test_chain_hooks_are_optional():
    log = []
    chain = OperatorChain([Tagger("a", log), Map(str), Tagger("b", log)])
    chain.init_trans()
    chain.end_trans()
    assert log == [("a", "init"), ("b", "init"), ("a", "end"), ("b", "end")]
    assert OperatorChain([]).process(7) == [7]


# --- sessions ---------------------------------------------------------------

PACKETS = [
    (1, 2, "http", "start", 10),
    (3, 4, "ftp", "start", 11),
    (1, 2, "http", "end", 15),     # closes (1, 2): duration 5
    (1, 2, "http", "end", 16),     # no open session: nothing
    (3, 4, "ftp", "start", 20),    # restart: the session now starts at 20
    (5, 6, "dns", "end", 21),      # never opened: nothing
    [3, 4, "ftp", "end", 29],      # list, as after msgpack: duration 9
]


def test_sessions_exact_outputs():
    assert run(SessionReconstruction(), PACKETS) == [
        [], [], [("http", 1, 5, 15)], [], [], [], [("ftp", 3, 9, 29)],
    ]
    assert session_key([7, 8, "x", "start", 1]) == (7, 8)


def test_sessions_state_and_round_trip():
    op = SessionReconstruction()
    run(op, PACKETS[:5])
    assert op.get_state() == [[(3, 4), ("ftp", 20)]]
    first = [(9, 9, "ssh", "start", 1), (1, 1, "dns", "start", 2)] + PACKETS[:2]
    rest = [(1, 1, "dns", "end", 30), (9, 9, "ssh", "end", 31), (3, 4, "ftp", "end", 32)]
    original, copy = continue_from_copy(SessionReconstruction, first, rest)
    assert original == [[("dns", 1, 28, 30)], [("ssh", 9, 30, 31)], [("ftp", 3, 21, 32)]]
    assert wire_form(copy) == wire_form(original)


def test_sessions_reject_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        SessionReconstruction().process((1, 2, "x", "middle", 3))


# --- windowed stats ---------------------------------------------------------

def test_stats_exact_outputs_with_event_time_window():
    op = WindowedDurationStats(window=10, emit_every=2)
    out = run(op, [
        ("web", 1, 4, 100),
        ("web", 1, 8, 105),    # 2nd update: window {100: 4, 105: 8}
        ("ftp", 1, 1, 106),
        ("web", 1, 3, 110),    # newest 110 drops ts 100 (window is (100, 110])
        ("web", 1, 6, 108),    # late record inside the window: 4th update
        ["ftp", 1, 7, 200],    # 2nd ftp update, 106 dropped
        ("web", 1, 9, 99),     # too old: counted, then dropped at once
        ("web", 1, 1, 130),    # 6th update: only itself remains
    ])
    assert out == [
        [],
        [("web", 1, 8, 6.0, 105)],
        [],
        [],
        [("web", 1, 8, 17 / 3, 110)],
        [("ftp", 1, 7, 7.0, 200)],
        [],
        [("web", 1, 1, 1.0, 130)],
    ]
    assert stats_key(["web", 1, 4, 100]) == ("web", 1)


def test_stats_round_trip_continues_identically():
    def make():
        return WindowedDurationStats(window=10, emit_every=2)

    first = [("a", 1, 4, 100), ("a", 1, 8, 105), ("b", 2, 3, 101)]
    rest = [("a", 1, 6, 109), ("b", 2, 5, 107), ("a", 1, 2, 112), ("a", 1, 7, 113)]
    original, copy = continue_from_copy(make, first, rest)
    assert original == [[], [("b", 2, 5, 4.0, 107)], [("a", 1, 8, 16 / 3, 112)], []]
    assert wire_form(copy) == wire_form(original)
    op = make()
    run(op, first)
    # the values are immutable tuples in memory; the form that travels is unchanged
    assert wire_form(op.get_state()) == [
        [["a", 1], [105, 2, [[100, 4], [105, 8]]]], [["b", 2], [101, 1, [[101, 3]]]]]


def test_stats_reject_bad_knobs():
    with pytest.raises(ValueError):
        WindowedDurationStats(window=0)
    with pytest.raises(ValueError):
        WindowedDurationStats(emit_every=0)


# --- keyed counter ----------------------------------------------------------

def test_counter_exact_outputs_with_fanout():
    op = KeyedCounter(fanout_every=2)
    assert run(op, [("a", 10), ("b", 11), ("a", 12), ["a", 13], ("a", 14)]) == [
        [("a", 1, 10)],
        [("b", 1, 11)],
        [("a", 2, 12), ("a", -2, 12)],
        [("a", 3, 13)],
        [("a", 4, 14), ("a", -4, 14)],
    ]
    assert op.get_state() == [["a", 4], ["b", 1]]
    assert run(KeyedCounter(), [("a", 1), ("a", 2)]) == [[("a", 1, 1)], [("a", 2, 2)]]
    assert first_field(("k", 1)) == "k" and key_and_count(["k", 3, 9]) == ("k", 3)


def test_counter_round_trip_with_tuple_keys():
    def make():
        return KeyedCounter(fanout_every=3)

    first = [((1, "x"), 0), ((2, "y"), 1), ((1, "x"), 2)]
    rest = [((1, "x"), 3), ((2, "y"), 4)]
    original, copy = continue_from_copy(make, first, rest)
    assert original == [[((1, "x"), 3, 3), ((1, "x"), -3, 3)], [((2, "y"), 2, 4)]]
    assert copy == original  # list keys became tuples again


def test_ballast_carries_the_state_size_it_is_given_and_round_trips():
    import msgpack

    from flux.testing.ballast import Ballast

    op = Ballast(1.0)
    size = len(msgpack.packb(op.get_state(), use_bin_type=True))
    assert 0.9e6 < size < 1.1e6
    assert op.process(("a", 1)) == [("a", 1)]  # a pass-through...
    twin = Ballast(0)
    twin.install_state(wire_form(op.get_state()))
    assert twin.get_state() == op.get_state()  # ...whose state changed and moves whole
    assert op.get_state() != Ballast(1.0).get_state()
