"""Event-time expiry (flux/expiry.py): the library's operators on an endless
feed of ever new keys hold a bounded state, expire exactly as a model says, and a
replica rebuilt mid-stream (whole snapshot, or bulk parts plus delta) expires as its
twin does."""
from __future__ import annotations

import random

import msgpack
import pytest

from flux.expiry import WATERMARK_KEY, Expiry
from flux.keyed_state import DELETED, KeyedState
from flux.operator import wire_form
from flux.examples.sessions import SessionReconstruction
from flux.examples.stats import WindowedDurationStats
from flux.state_codec import pack_part, unpack_part

pytestmark = pytest.mark.timeout(60)


def endless_sessions(n: int, seed: int, lost: float = 0.1, longest: int = 40):
    """``n`` packets ``(src, dst, app, kind, ts)``, every session on a new ``(src, dst)``;
    a fraction ``lost`` of them never ends, a few last long; ts advances 3 per packet."""
    rng = random.Random(seed)
    ends: dict = {}  # packet index -> the end packet due then
    out, k = [], 0
    for i in range(n):
        ts = 3 * i
        due = ends.pop(i, None)
        if due is not None:
            out.append((*due, "end", ts))
            continue
        src, dst, app = k, k % 7, f"app{k % 3}"
        k += 1
        out.append((src, dst, app, "start", ts))
        if rng.random() >= lost:  # one in 20 lasts up to 3 times longer
            j = i + rng.randrange(1, longest if rng.random() < 0.95 else 3 * longest)
            while j in ends:
                j += 1
            ends[j] = (src, dst, app)
    return out


def model_sessions(packets, ttl):
    """The sessions' outputs with expiry, written the obvious way (no sweeps)."""
    open_, watermark, out = {}, None, []
    for src, dst, app, kind, ts in packets:
        watermark = ts if watermark is None else max(watermark, ts)
        if kind == "start":
            open_[src, dst] = (app, ts)
        else:
            s = open_.pop((src, dst), None)
            if s is not None and (ttl is None or s[1] >= watermark - ttl):
                out.append((s[0], src, ts - s[1], ts))
    return out


def run(op, records):
    return [o for r in records for o in op.process(r)]


def test_keyed_state_expire_deletes_what_matches_and_tracks_it():
    s = KeyedState([[("a", 1), 5], [("b", 1), 50], [("c", 1), 7]])
    s.clear_dirty()
    assert s.expire(lambda k, v: v < 10) == 2
    assert s.items() == [(("b", 1), 50)]
    assert s.dirty() == [(("a", 1), DELETED), (("c", 1), DELETED)]


def test_the_watermark_moves_with_the_largest_event_time_and_sweeps_every_half_ttl():
    s = KeyedState()
    e = Expiry(s, 100, lambda k, v: v)
    assert e.watermark is None and not e.expired(-10 ** 9)
    for t in (0, 10, 20):
        s[("k", t)] = t
        e.advance(t)
    assert e.watermark == 20 and e.keys() == 3
    assert e.advance(5) == 0 and e.watermark == 20  # late records do not move it back
    assert e.advance(49) == 0 and e.keys() == 3  # < half the ttl since the last sweep
    assert e.advance(115) == 2  # a sweep: the horizon 15 drops the keys of times 0 and 10
    assert [k for k in s.keys() if k != WATERMARK_KEY] == [("k", 20)] and e.keys() == 1
    assert e.advance(160) == 0  # 45 since that sweep
    assert e.expired(59) and not e.expired(60)  # the watermark is 160
    with pytest.raises(ValueError, match="ttl must be > 0"):
        Expiry(s, 0, lambda k, v: v)


@pytest.mark.parametrize("ttl", [150, 600])
def test_sessions_that_never_end_expire_and_the_state_stays_bounded(ttl):
    packets = endless_sessions(60_000, seed=1)
    op = SessionReconstruction(ttl=ttl)
    most = 0
    out = []
    for p in packets:
        out.extend(op.process(p))
        most = max(most, op.expiry.keys())
    assert out == model_sessions(packets, ttl)
    if ttl == 150:  # sessions longer than the ttl ended after they expired: no output
        assert len(out) < len(model_sessions(packets, None))
    # at most the sessions started within 1.5 ttl (3 event-time units per packet)
    assert most <= 1.5 * ttl / 3 + 1
    # without expiry the 10% that never end pile up: the bound above would not hold
    forever = SessionReconstruction()
    assert run(forever, packets) == model_sessions(packets, None)
    assert len(forever.state) > 20 * most


def stats_records(n: int, seed: int):
    """``(app, src, duration, ts_end)`` with ever new sources (3% come back from long
    ago); ts_end mostly increasing."""
    rng = random.Random(seed)
    return [(f"app{rng.randrange(3)}",
             i // 5 + rng.randrange(3) if rng.random() < 0.97 else rng.randrange(i // 5 + 1),
             rng.randrange(1, 50), 3 * i + rng.randrange(-6, 6)) for i in range(n)]


def model_stats(records, window, emit_every, idle_ttl):
    keys, watermark, out = {}, None, []
    for app, src, d, t in records:
        watermark = t if watermark is None else max(watermark, t)
        k = keys.get((app, src))
        if k is not None and idle_ttl is not None and k[0] < watermark - idle_ttl:
            k = None
        newest, updates, entries = k if k is not None else (t, 0, [])
        newest, updates = max(newest, t), updates + 1
        entries = sorted(entries + [(t, d)])
        entries = [e for e in entries if e[0] > newest - window] or entries[-1:]
        keys[(app, src)] = (newest, updates, entries)
        if updates % emit_every == 0:
            ds = [x for _, x in entries]
            out.append((app, src, max(ds), sum(ds) / len(ds), newest))
    return out


def test_idle_keys_of_the_windowed_stats_expire_and_the_state_stays_bounded():
    records = stats_records(30_000, seed=2)
    op = WindowedDurationStats(window=60, emit_every=2, idle_ttl=300)
    most, out = 0, []
    for r in records:
        out.extend(op.process(r))
        most = max(most, op.expiry.keys())
    assert out == model_stats(records, 60, 2, 300)
    assert out != model_stats(records, 60, 2, None)  # returning keys started afresh
    assert most < 200
    forever = WindowedDurationStats(window=60, emit_every=2)
    assert run(forever, records) == model_stats(records, 60, 2, None)
    assert len(forever.state) > 20 * most


def move_whole(a, b):
    b.install_state(msgpack.unpackb(msgpack.packb(wire_form(a.get_state()))))


def move_in_parts(a, b, records):
    """As a catch-up does: parts read while the active keeps processing
    ``records``, then the delta of everything since; returns the active's outputs."""
    store = a.state
    store.clear_dirty()
    pieces = store.parts(7)
    out, fed = [], iter(records)
    for keys, values in pieces:
        _, ks, vs = unpack_part(pack_part(0, keys, values))
        b.state.install_part(ks, vs)
        out.extend(o for r in [next(fed, None)] if r is not None for o in a.process(r))
    for r in fed:
        out.extend(a.process(r))
    b.state.apply_delta(msgpack.unpackb(msgpack.packb(wire_form(store.delta()))))
    store.stop_tracking()
    return out


@pytest.mark.parametrize("how", ["whole", "parts"])
@pytest.mark.parametrize("make, records", [
    (lambda: SessionReconstruction(ttl=150), endless_sessions(6000, seed=3)),
    (lambda: WindowedDurationStats(window=60, idle_ttl=300), stats_records(6000, seed=4)),
], ids=["sessions", "stats"])
def test_a_replica_rebuilt_mid_stream_expires_exactly_as_its_twin(how, make, records):
    a, b = make(), make()
    third = len(records) // 3
    run(a, records[:third])
    if how == "whole":
        move_whole(a, b)
        rest = records[third:]
    else:  # the active processes another third while the parts go
        run_during = records[third:2 * third]
        move_in_parts(a, b, run_during)
        rest = records[2 * third:]
    assert b.state == a.state and b.expiry.watermark == a.expiry.watermark
    assert run(b, rest) == run(a, rest)
    assert b.state == a.state


def readme_block(marker: str) -> str:
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if marker in b]
    assert len(blocks) == 1, f"the README has {len(blocks)} python blocks with {marker!r}"
    return blocks[0]


def test_the_readme_pattern_forgets_idle_users_and_moves_with_its_state():
    namespace: dict = {}
    exec(compile(readme_block("class VisitCounter"), "README.md", "exec"), namespace)
    counter = namespace["VisitCounter"]
    rng = random.Random(5)
    # a visit every 10 s for 10 days; 20 new users an hour, a visit in 100 by an old user
    visits = [(f"u{t // 3600 * 20 + rng.randrange(20)}" if rng.random() < 0.99
               else f"u{rng.randrange(t // 3600 * 20 + 1)}", t) for t in range(0, 864_000, 10)]
    a, b = counter(), counter()
    half = len(visits) // 2
    out, most = [], 0
    for v in visits[:half]:
        out.extend(a.process(v))
        most = max(most, a.expiry.keys())
    move_whole(a, b)
    for v in visits[half:]:
        got = b.process(v)
        assert got == a.process(v)
        out.extend(got)
        most = max(most, b.expiry.keys())
    # the model: a user's count restarts after a day without visits
    last, count, want = {}, {}, []
    for user, t in visits:
        if user not in last or t - last[user] > 86_400:
            count[user] = 0
        count[user] += 1
        last[user] = t
        want.append((user, count[user]))
    assert out == want
    # the users of the last day and a half at most (20 new an hour, 86 returning a day),
    # not all of the ten days' (4800)
    assert most <= 20 * 36 + 86 * 1.5 + 50
    assert len(set(user for user, _ in visits)) > 4 * most
