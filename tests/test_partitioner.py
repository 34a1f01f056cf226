"""Stable hash partitioning (exchange/partitioner.py; DESIGN 4.1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exchange.partitioner import HashPartitioner, UnhashableKey, group_owner, owned_groups

ROOT = Path(__file__).resolve().parents[1]

# Computed once (CRC-32 of the msgpack bytes, modulo n: the routing before key groups,
# which checkpoints written then restore with). Strings and bytes are the keys whose
# Python hash() is salted by PYTHONHASHSEED.
KNOWN = [
    # (partitions, key, partition)
    (2, "alice", 0),
    (2, "bob", 1),
    (2, 3.5, 0),
    (4, "alice", 0),
    (4, 1, 3),
    (4, 3.5, 2),
    (4, ("10.0.0.1", "10.0.0.2"), 3),
    (7, "alice", 1),
    (7, "bob", 2),
    (7, "", 0),
    (7, 42, 6),
    (7, (1, 2), 6),
    (7, b"xy", 3),
    (16, "alice", 4),
    (16, 0, 13),
    (16, 1, 11),
    (16, -7, 5),
    (16, ("10.0.0.1", "10.0.0.2"), 3),
    (16, None, 13),
]


# Computed once with key groups (256): (CRC-32 % 256) * n // 256: key group, partition.
KNOWN_GROUPED = [
    (2, "alice", 164, 1),
    (2, "bob", 165, 1),
    (4, 1, 27, 0),
    (4, ("10.0.0.1", "10.0.0.2"), 35, 0),
    (7, "alice", 164, 4),
    (7, b"xy", 69, 1),
    (16, None, 61, 3),
    (16, -7, 53, 3),
]


@pytest.mark.parametrize("n, key, expected", KNOWN)
def test_known_values_without_key_groups(n, key, expected):
    assert HashPartitioner(n, key_groups=None)(key) == expected


@pytest.mark.parametrize("n, key, group, expected", KNOWN_GROUPED)
def test_known_values_through_key_groups(n, key, group, expected):
    partitioner = HashPartitioner(n)
    assert partitioner.group(key) == group
    assert partitioner(key) == expected
    assert partitioner.router(lambda record: record)(key) == expected


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7, 16, 256])
def test_a_partition_owns_a_contiguous_range_of_groups(n):
    owners = [group_owner(g, 256, n) for g in range(256)]
    assert owners == sorted(owners) and set(owners) == set(range(n))
    for p in range(n):
        assert list(owned_groups(p, n, 256)) == [g for g in range(256) if owners[g] == p]


def test_key_groups_below_the_partition_count_are_refused():
    with pytest.raises(ValueError, match="key_groups must be an int from the partition "
                                         "count \\(8\\)"):
        HashPartitioner(8, key_groups=4)


_CHILD = """
import json, sys
from exchange.partitioner import HashPartitioner
cases = json.loads(sys.argv[1])
out = []
for n, key, is_tuple in cases:
    if is_tuple:
        key = tuple(key)
    out.append(HashPartitioner(n, key_groups=None)(key))
print(json.dumps({"parts": out, "salted": hash("alice")}))
"""


def test_values_do_not_depend_on_pythonhashseed():
    cases = [
        (n, list(k) if isinstance(k, tuple) else k, isinstance(k, tuple))
        for n, k, _ in KNOWN
        if not isinstance(k, bytes)
    ]
    expected = [p for n, k, p in KNOWN if not isinstance(k, bytes)]
    salted = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        res = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(cases)],
            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=30,
        )
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["parts"] == expected, seed
        salted.add(got["salted"])
    # The two children really had different salted hashes for strings.
    assert len(salted) == 2


def test_tuples_and_lists_route_alike():
    for n in (2, 3, 7, 16, 101):
        part = HashPartitioner(n)
        for key in [(1, 2), ("10.0.0.1", "10.0.0.2"), (1, ("a", 2.5)), ()]:
            as_list = [list(x) if isinstance(x, tuple) else x for x in key]
            assert part(key) == part(as_list), (n, key)


def test_result_is_in_range_and_one_partition_gets_everything():
    part = HashPartitioner(5)
    assert {part(k) for k in range(200)} == set(range(5))
    one = HashPartitioner(1)
    assert {one(k) for k in ["a", 1, (1, 2), None]} == {0}


class Opaque:
    def __repr__(self):
        return "<Opaque key 42>"


@pytest.mark.parametrize("key", [Opaque(), {1, 2}, frozenset({"x"}), 2 ** 70])
def test_unencodable_key_raises_unhashable_key_naming_it(key):
    with pytest.raises(UnhashableKey) as exc:
        HashPartitioner(4)(key)
    assert repr(key) in str(exc.value)
    assert type(key).__name__ in str(exc.value)
    assert isinstance(exc.value, TypeError)


@pytest.mark.parametrize("bad", [0, -1, 2.0, "2", None])
def test_bad_partition_counts_raise(bad):
    with pytest.raises(ValueError):
        HashPartitioner(bad)


def test_repr():
    assert repr(HashPartitioner(3)) == "HashPartitioner(3, key_groups=256)"
    assert HashPartitioner(3).partitions == 3


def test_a_bool_is_not_a_partition_count():
    with pytest.raises(ValueError):
        HashPartitioner(True)


def test_routing_stays_exact_after_a_refused_key_and_from_several_threads():
    """One packer serves every call: a key it refused leaves nothing behind,
    and threads routing at once route as one thread does."""
    import threading
    import zlib

    import msgpack

    part = HashPartitioner(7)
    keys = [("k%d" % i, i, [i % 3]) for i in range(2000)]
    want = [zlib.crc32(msgpack.packb(k, use_bin_type=True)) % 256 * 7 // 256 for k in keys]
    with pytest.raises(UnhashableKey):
        part(("half", object()))
    assert [part(k) for k in keys] == want
    got = {}

    def route(n):
        got[n] = [part(k) for k in keys]

    threads = [threading.Thread(target=route, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == want for g in got.values())
