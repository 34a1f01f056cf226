"""A state packed as a stream of small msgpack objects decodes to what one unpackb gives
(no single C call as long as the state is large)."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux import state_codec
from flux.operator import wire_form
from flux.state_codec import StateCodecError, pack_state, unpack_state

leaves = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=5) \
    | st.binary(max_size=5)
states = st.recursive(leaves, lambda inner: st.lists(inner, max_size=12)
                      | st.dictionaries(st.text(max_size=3) | st.integers(0, 50), inner,
                                        max_size=12), max_leaves=80)


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(state_codec, "SLICE", 3)


@settings(max_examples=60, deadline=None)
@given(states)
def test_round_trip_equals_a_plain_msgpack_round_trip(state):
    old = state_codec.SLICE
    state_codec.SLICE = 3  # many containers are "large": the slicing is exercised
    try:
        assert unpack_state(pack_state(state)) == wire_form(state)
    finally:
        state_codec.SLICE = old


def test_a_large_keyed_state_travels_in_slices(small_slices):
    pairs = [[(f"s{i}", i), ["app", i]] for i in range(10)]
    state = {"operators": [pairs, None], "fcons": [], "fprod": [[1, 2]]}
    data = pack_state(state)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    assert len(list(unpacker)) == 1 + 4  # the skeleton, then 10 pairs in slices of 3
    assert unpack_state(data) == wire_form(state)
    assert pack_state(state) == data  # the same state, the same bytes


def test_truncated_or_padded_streams_are_refused(small_slices):
    data = pack_state({"big": list(range(10))})
    with pytest.raises(StateCodecError):
        unpack_state(data[:-3])
    with pytest.raises(StateCodecError):
        unpack_state(data + msgpack.packb([1]))
    with pytest.raises(StateCodecError):
        unpack_state(b"")
