"""Batches whose items carry Rows cross the wire whole and exactly, are packed once for
both replicas, and every malformed rows-form frame is refused with a reason."""
from __future__ import annotations

import re
import statistics
import sys
import time

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange import wire
from exchange.rows import Rows, merge
from exchange.wire import WireError, decode, encode
from flux.addresses import Addr
from flux.data_messages import Batch
from flux.envelope import Envelope

pytestmark = pytest.mark.timeout(60)

A, B = Addr(1, 2, 0), Addr(2, 0, 1)
LITTLE_ENDIAN = sys.byteorder == "little"


def rows(sns, records) -> Rows:
    return Rows(np.array(sns, dtype=np.int64).reshape(len(records), -1), list(records))


def round_trip(items, bound=(1,), cut=None) -> Batch:
    return decode(encode(Envelope(A, B, 0, Batch(tuple(items), bound, cut), 1, 2))).msg


def wire_form(record):
    """A record as the peer sees it: tuples come back as lists (DESIGN 4.1)."""
    return msgpack.unpackb(msgpack.packb(record), raw=False)


# -- round trips ---------------------------------------------------------------------

records = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=8)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=6)


@st.composite
def rows_items(draw):
    """A batch of Rows items: one conn SN length, per item one SN-matrix width."""
    conn_width = draw(st.integers(1, 4))
    out = []
    for _ in range(draw(st.integers(0, 4))):
        conn = tuple(draw(st.lists(st.integers(0, 2**62), min_size=conn_width,
                                   max_size=conn_width)))
        width, n = draw(st.integers(1, 5)), draw(st.integers(0, 50))
        sns = draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n * width,
                            max_size=n * width))
        out.append((conn, Rows(np.array(sns, dtype=np.int64).reshape(n, width),
                               draw(st.lists(records, min_size=n, max_size=n)))))
    return out


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
@settings(max_examples=150, deadline=None)
@given(rows_items(), st.one_of(st.none(), st.tuples(st.integers(0, 99), st.integers(0, 99))))
def test_rows_items_round_trip(items, cut):
    got = round_trip(items, (7, 1), cut)
    assert (got.bound, got.cut) == ((7, 1), cut)
    assert [conn for conn, _ in got.items] == [conn for conn, _ in items]
    for (_, sent), (_, came) in zip(items, got.items):
        assert came.sns.dtype == np.int64 and came.sns.shape == sent.sns.shape
        assert np.array_equal(came.sns, sent.sns)
        assert came.records == [wire_form(r) for r in sent.records]


def test_an_empty_item_keeps_its_width():
    (_, came), = round_trip([((1,), Rows.empty(3))]).items
    assert came.sns.shape == (0, 3) and came.records == []


def test_records_still_travel_in_their_own_form():
    assert round_trip([((1,), ("a", 1)), ((2,), None)]).items == (((1,), ["a", 1]), ((2,), None))


@pytest.mark.skipif(not LITTLE_ENDIAN, reason="a big-endian host converts the SNs")
def test_the_sn_matrix_is_a_view_of_the_frames_bytes():
    (_, came), = round_trip([((1,), rows([[1, 2], [3, 4]], "ab"))]).items
    assert not came.sns.flags.owndata and isinstance(came.sns.base.base, bytes)


def test_rows_methods_work_on_a_decoded_read_only_matrix():
    item = rows([[1, 1], [1, 2], [2, 1], [3, 1]], ["a", "b", "c", "d"])
    (_, came), = round_trip([((5,), item)]).items
    parts = came.split(np.array([1, 0, 1, 0]), 2)
    assert [p.records for p in parts] == [["b", "d"], ["a", "c"]]
    assert merge(parts).pairs() == item.pairs()
    out = came.outputs([["x"], [], ["y", "z"], []])
    assert out.pairs() == [((1, 1, 1), "x"), ((2, 1, 1), "y"), ((2, 1, 2), "z")]
    assert came.first_sn() == (1, 1) and came.last_sn() == (3, 1)


# -- packed once for both replicas ---------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.one_of(rows_items(), st.lists(st.tuples(st.tuples(st.integers(0, 2**62)), records),
                                        max_size=5)),
       st.one_of(st.none(), st.tuples(st.integers(0, 99), st.integers(0, 99))),
       st.integers(0, 2**40), st.integers(0, 2**40))
def test_a_batch_frame_is_the_one_msgpack_list_of_its_fields(items, cut, view, inc):
    """The items' bytes are packed apart (once for both replicas) and joined with the
    rest: the frame must be exactly the one list the fields make, whatever their sizes."""
    env = Envelope(A, B, view, Batch(tuple(items), (7, 1), cut), inc, 2)
    fields = wire.CODECS["batch"][1](env.msg)
    whole = msgpack.packb([wire.VERSION, "batch", wire._put_endpoint(A), wire._put_endpoint(B),
                           view, inc, 2, *fields], use_bin_type=True)
    assert encode(env) == whole


def test_a_rows_batch_for_both_replicas_is_packed_once(monkeypatch):
    """The same tuples object (Buffer.take for the pair's two replicas) is packed once;
    equal items in another tuple are packed afresh."""
    packed = []
    to_state = Rows.to_state
    monkeypatch.setattr(Rows, "to_state", lambda self: packed.append(self) or to_state(self))
    item = rows([[1], [2]], ["a", "b"])
    items, other = ((((1,), item),), (((1,), item),))
    frames = [encode(Envelope(A, B, 0, Batch(its, (1,)), 1, r)) for its, r in
              ((items, 0), (items, 1), (other, 0))]
    assert len(packed) == 2 and wire._last_encoded[0] is other
    assert frames[0] == frames[2] and decode(frames[1]).msg.items[0][1].records == ["a", "b"]


# -- refused on encode ---------------------------------------------------------------

@pytest.mark.parametrize("items", [
    (((1,), rows([[1]], "a")), ((2,), "b")),
    (((1,), "a"), ((2,), rows([[1]], "b"))),
    (((1,), ["a", rows([[1]], "b")]),),
], ids=["rows first", "record first", "rows in a record"])
def test_a_batch_mixing_rows_and_records_is_a_local_error(items):
    with pytest.raises(ValueError, match="never a mix"):
        encode(Envelope(A, B, 0, Batch(items, (2,)), 1))


def test_other_unpackable_records_are_still_a_type_error():
    with pytest.raises(TypeError, match="can not serialize 'object' object"):
        encode(Envelope(A, B, 0, Batch((((1,), object()),), (1,)), 1))


def test_rows_items_with_conn_sns_of_two_lengths_are_a_local_error():
    with pytest.raises(ValueError, match="one length"):
        encode(Envelope(A, B, 0, Batch((((1,), rows([[1]], "a")),
                                        ((1, 2), rows([[2]], "b"))), (1,)), 1))


# -- refused on decode ---------------------------------------------------------------

def i64(*xs) -> bytes:
    return np.array(xs, dtype="<i8").tobytes()


HEAD = [wire.VERSION, "batch", [1, 2, 0], [2, 0, 1], 0, 1, None]
GOOD_ITEM = [2, 1, i64(1, 2), ["a", "b"]]


def rows_frame(conn_width=1, conn=i64(9), entries=(GOOD_ITEM,), tail=([9], None), form="rows"):
    """A rows-form batch frame, its fields as given (entries: a tuple is sent as a list)."""
    entries = list(entries) if isinstance(entries, tuple) else entries
    return msgpack.packb([*HEAD, form, conn_width, conn, entries, *tail], use_bin_type=True)


def item(**changes):
    fields = dict(zip(["n", "width", "raw", "records"], GOOD_ITEM), **changes)
    return list(fields.values())


def test_the_reference_rows_frame_is_itself_valid():
    (conn, came), = decode(rows_frame()).msg.items
    assert conn == (9,) and came.pairs() == [((1,), "a"), ((2,), "b")]


MALFORMED = [
    (rows_frame(entries=[item(raw=i64(1, 2)[:-1])]), "an item of 2 rows has 15 bytes of SNs"),
    (rows_frame(entries=[item(raw=i64(1, 2, 3))]), "an item of 2 rows has 24 bytes of SNs"),
    (rows_frame(entries=[item(raw=b"")]), "an item of 2 rows has 0 bytes of SNs of length 1"),
    (rows_frame(entries=[item(width=2)]), "an item of 2 rows has 16 bytes of SNs of length 2"),
    (rows_frame(entries=[item(n=3)]), "an item of 3 rows has 2 records"),
    (rows_frame(entries=[item(records=["a"])]), "an item of 2 rows has 1 records"),
    (rows_frame(entries=[item(n=2**63)]), "an item of 9223372036854775808 rows has 2 records"),
    (rows_frame(entries=[item(n=-1)]), "row count must be an int >= 0, got -1"),
    (rows_frame(entries=[item(n="2")]), "row count must be an int >= 0, got '2'"),
    (rows_frame(entries=[item(n=2.0)]), "row count must be an int >= 0, got 2.0"),
    (rows_frame(entries=[item(n=True)]), "row count must be an int >= 0, got True"),
    (rows_frame(entries=[item(n=None)]), "row count must be an int >= 0, got None"),
    (rows_frame(entries=[item(width=-1)]), "SN length must be an int in 0..256, got -1"),
    (rows_frame(entries=[item(width=257)]), "SN length must be an int in 0..256, got 257"),
    (rows_frame(entries=[item(width=2**64 - 1)]), "SN length must be an int in 0..256"),
    (rows_frame(entries=[item(width="1")]), "SN length must be an int in 0..256, got '1'"),
    (rows_frame(entries=[item(width=0, raw=b"")]), "an item of 2 rows has SNs of length 0"),
    (rows_frame(entries=[item(raw="\x01" * 16)]), "an item's rows must be SN bytes"),
    (rows_frame(entries=[item(raw=[1, 2])]), "an item's rows must be SN bytes"),
    (rows_frame(entries=[item(records={"a": 1})]), "and a list of records"),
    (rows_frame(entries=[item(records="ab")]), "and a list of records"),
    (rows_frame(entries=[GOOD_ITEM[:3]]), "an item's rows are [rows, width, SN bytes, records]"),
    (rows_frame(entries=[[*GOOD_ITEM, 0]]), "an item's rows are [rows, width, SN bytes, records]"),
    (rows_frame(entries=["rows"]), "an item's rows are [rows, width, SN bytes, records]"),
    (rows_frame(conn=i64(9, 10), entries=[GOOD_ITEM, item(raw=b"\x00" * 9)]),
     "an item of 2 rows has 9 bytes of SNs"),
    (rows_frame(conn=i64(9, 10)), "batch of 1 items has 16 bytes of SNs of length 1"),
    (rows_frame(conn=i64(9)[:7]), "batch of 1 items has 7 bytes of SNs of length 1"),
    (rows_frame(entries=[GOOD_ITEM] * 2), "batch of 2 items has 8 bytes of SNs of length 1"),
    (rows_frame(conn_width=0, conn=b""), "batch of 1 items has 0 bytes of SNs of length 0"),
    (rows_frame(conn_width=-1), "batch SN length must be an int in 0..256, got -1"),
    (rows_frame(conn_width=1.0), "batch SN length must be an int in 0..256, got 1.0"),
    (rows_frame(conn_width=10**6, conn=b"", entries=[]), "batch SN length must be an int in"),
    (rows_frame(conn=[9]), "batch items must be SN bytes and a list of rows"),
    (rows_frame(entries={"a": 1}), "batch items must be SN bytes and a list of rows"),
    (rows_frame(entries="ab"), "batch items must be SN bytes and a list of rows"),
    (rows_frame(tail=([9],)), "expected 6 fields, got 5"),
    (rows_frame(tail=([9], None, "extra")), "expected 6 fields, got 7"),
    (rows_frame(form="rowz"), "expected 5 fields, got 6"),
    (rows_frame(form=b"rows"), "expected 5 fields, got 6"),
    (rows_frame(tail=(["9"], None)), "bound must be a list of ints"),
    (rows_frame(tail=([9], [1, -1])), "a checkpoint cut must be [checkpoint, input]"),
]


@pytest.mark.parametrize("data,reason", MALFORMED, ids=[reason for _, reason in MALFORMED])
def test_malformed_rows_frames_are_refused_with_a_reason(data, reason):
    with pytest.raises(WireError, match="^batch: .*" + re.escape(reason)):
        decode(data)


def test_a_width_zero_item_without_rows_is_an_empty_item():
    (_, came), = decode(rows_frame(entries=[[0, 0, b"", []]])).msg.items
    assert came.sns.shape == (0, 0) and came.records == []


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_damaged_rows_frame_decodes_or_is_refused_never_anything_else(data):
    """Truncated or flipped bytes anywhere in a rows-form frame: a WireError, or a batch
    that is whole (every item a Rows with as many records as SN rows)."""
    frame = bytearray(encode(Envelope(A, B, 0, Batch(
        (((1,), rows([[1, 1], [1, 2]], ["a", [1, None]])), ((2,), rows([[2, 1]], [2.5]))),
        (2,)), 1)))
    if data.draw(st.booleans()):
        del frame[data.draw(st.integers(0, len(frame) - 1)):]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    try:
        msg = decode(bytes(frame)).msg
    except WireError:
        return
    for _, came in msg.items:
        assert isinstance(came, Rows)
        assert came.sns.dtype == np.int64 and came.sns.shape[0] == len(came.records)


# -- timing ------------------------------------------------------------------------

PACKET = ["10.0.0.1", "10.0.0.2", "http", "start", 12345]


def us_per_row(batches, rows_per_batch: int) -> float:
    """Median of 5 samples, each encoding and decoding every batch once; each batch is
    its own tuples object, so none is served from the packed-once cache."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for batch in batches:
            decode(encode(Envelope(A, B, 0, batch, 1)))
        samples.append((time.perf_counter() - start) / len(batches) / rows_per_batch * 1e6)
    return statistics.median(samples)


@pytest.mark.parametrize("width", [1, 3])
def test_print_the_cost_of_rows_against_records(width):
    """Not a budget: figures to compare the two forms on one host."""
    n, reps = 1024, 50
    records = [list(PACKET) for _ in range(n)]
    sns = np.arange(n * width, dtype=np.int64).reshape(n, width)
    item = Rows(sns, records)
    rows_batches = [Batch(tuple([((r,), item)]), (1,)) for r in range(reps)]
    tuples = [(tuple(sn), rec) for sn, rec in zip(sns.tolist(), records)]
    record_batches = [Batch(tuple(tuples), (1,)) for _ in range(reps)]
    as_rows, as_records = us_per_row(rows_batches, n), us_per_row(record_batches, n)
    print(f"\nwire encode+decode, SN width {width}, 1024-row items: rows form "
          f"{as_rows:.3f} us/row, records form {as_records:.3f} us/row "
          f"({as_records / as_rows:.1f}x)")
