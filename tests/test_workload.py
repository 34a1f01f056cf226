"""Seeded workloads: deterministic, and with the requested numbers of distinct keys."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flux.testing.workloads import PacketWorkload, keyed_workload, packet_workload

SMALL = dict(pairs=40, apps=2, sources=5, concurrent=8)


def test_packet_workload_is_deterministic_for_a_seed():
    a = packet_workload(500, seed=7, **SMALL)
    assert a == packet_workload(500, seed=7, **SMALL)
    assert a != packet_workload(500, seed=8, **SMALL)
    assert list(PacketWorkload(500, 7, **SMALL)) == a
    assert len(PacketWorkload(500, 7, **SMALL)) == 500


def test_packet_workload_is_the_same_in_another_process():
    code = (
        "import json; from flux.testing.workloads import packet_workload, keyed_workload; "
        "print(json.dumps([packet_workload(300, 11, pairs=40, apps=2, sources=5, concurrent=8), "
        "keyed_workload(50, 11)]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    here = [packet_workload(300, 11, **SMALL), keyed_workload(50, 11)]
    assert json.loads(out) == json.loads(json.dumps(here))


def test_packet_workload_has_exactly_the_requested_distinct_keys():
    records = packet_workload(400, seed=1, **SMALL)
    assert len(records) == 400
    assert len({(r[0], r[1]) for r in records}) == 40   # (src, dst) pairs
    assert len({(r[2], r[0]) for r in records}) == 10   # (app, src) = apps * sources
    assert {r[2] for r in records} == {"app0", "app1"}
    assert all(r[2] == f"app{r[1] % 2}" for r in records)  # app is determined by dst


def test_packet_records_are_sessions_on_event_time():
    records = packet_workload(3000, seed=2, **SMALL)
    ts = [r[4] for r in records]
    assert all(b > a for a, b in zip(ts, ts[1:]))
    assert {r[3] for r in records} == {"start", "end"}
    open_, matched, ends = set(), 0, 0
    for src, dst, _, kind, _ in records:
        if kind == "start":
            open_.add((src, dst))
        else:
            ends += 1
            matched += (src, dst) in open_
            open_.discard((src, dst))
    assert 0.9 * ends <= matched < ends  # mostly matched, a few stray "end"s
    assert len(open_) <= 3 * SMALL["concurrent"]


def test_packet_workload_rejects_impossible_knobs():
    with pytest.raises(ValueError, match="apps \\* sources"):
        PacketWorkload(10, 1, pairs=9, apps=2, sources=5)
    with pytest.raises(ValueError):
        PacketWorkload(-1, 1)


def test_keyed_workload():
    records = keyed_workload(200, seed=3, keys=4)
    assert records == keyed_workload(200, seed=3, keys=4)
    assert records != keyed_workload(200, seed=4, keys=4)
    assert [v for _, v in records] == list(range(1, 201))
    assert {k for k, _ in records} == {"k0", "k1", "k2", "k3"}
    assert keyed_workload(0, seed=3) == []
