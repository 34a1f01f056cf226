"""Seeded synthetic workloads: the paper's packet stream (section 5.4) and a keyed test stream.

Everything is drawn from ``random.Random(seed)``, never ``hash()``, so a
seed gives the same records in every process.

Packet stream construction. Pair ``j`` in ``range(pairs)`` is
``src = j % sources``, ``dst = j // sources``, and the application is
determined by the destination: ``app = "app{dst % apps}"``. Each source
then talks to at least ``apps`` destinations (``pairs >= apps * sources``),
so there are exactly ``pairs`` distinct ``(src, dst)`` and
``apps * sources`` distinct ``(app, src)`` values (the paper: 100K and
10K). "start" events take pairs from a fresh shuffle of all pairs in turn
(so every pair occurs once ``pairs`` sessions have started); "end" events
close a random open session, which keeps about ``concurrent`` sessions
open; a small fraction ``stray_ends`` of "end" events name a random pair,
which usually has no open session.
"""
from __future__ import annotations

import random
from typing import Iterator

DEFAULT_PAIRS = 100_000
DEFAULT_APPS = 10
DEFAULT_SOURCES = 1_000


class PacketWorkload:
    """An iterable of ``n`` packet records ``(src, dst, app, kind, ts)``; iterating twice repeats them."""

    def __init__(
        self,
        n: int,
        seed: int,
        pairs: int = DEFAULT_PAIRS,
        apps: int = DEFAULT_APPS,
        sources: int = DEFAULT_SOURCES,
        concurrent: int = 1_000,
        stray_ends: float = 0.01,
        max_gap: int = 5,
    ):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if min(apps, sources, concurrent, max_gap) < 1:
            raise ValueError("apps, sources, concurrent and max_gap must be >= 1")
        if pairs < apps * sources:
            raise ValueError(
                f"pairs ({pairs}) must be >= apps * sources ({apps * sources}) so every "
                f"source reaches every application"
            )
        self.n = n
        self.seed = seed
        self.pairs = pairs
        self.apps = apps
        self.sources = sources
        self.concurrent = concurrent
        self.stray_ends = stray_ends
        self.max_gap = max_gap

    def __len__(self) -> int:
        return self.n

    def pair(self, j: int) -> tuple[int, int, str]:
        """``(src, dst, app)`` of pair ``j``."""
        dst = j // self.sources
        return j % self.sources, dst, f"app{dst % self.apps}"

    def __iter__(self) -> Iterator[tuple]:
        rng = random.Random(self.seed)
        rand, randrange = rng.random, rng.randrange
        order: list[int] = []
        open_list: list[int] = []  # open pairs; swap-remove keeps removal O(1)
        where: dict[int, int] = {}  # pair -> index in open_list
        sources, pairs, gap, concurrent, strays = (
            self.sources, self.pairs, self.max_gap, self.concurrent, self.stray_ends
        )
        app_names = [f"app{a}" for a in range(self.apps)]
        apps = self.apps
        ts = 0
        for _ in range(self.n):
            ts += 1 + int(rand() * gap)
            n_open = len(open_list)
            if n_open and rand() * (n_open + concurrent) < n_open:
                if rand() < strays:
                    j = randrange(pairs)
                else:
                    j = open_list[int(rand() * n_open)]
                i = where.pop(j, None)
                if i is not None:
                    last = open_list.pop()
                    if last != j:
                        open_list[i] = last
                        where[last] = i
                dst = j // sources
                yield (j % sources, dst, app_names[dst % apps], "end", ts)
            else:
                if not order:
                    order = list(range(pairs))
                    rng.shuffle(order)
                j = order.pop()
                if j not in where:
                    where[j] = len(open_list)
                    open_list.append(j)
                dst = j // sources
                yield (j % sources, dst, app_names[dst % apps], "start", ts)


def packet_workload(
    n: int,
    seed: int,
    pairs: int = DEFAULT_PAIRS,
    apps: int = DEFAULT_APPS,
    sources: int = DEFAULT_SOURCES,
    **knobs,
) -> list[tuple]:
    """``n`` packet records ``(src, dst, app, kind, ts)``; see the module docstring."""
    return list(PacketWorkload(n, seed, pairs=pairs, apps=apps, sources=sources, **knobs))


def keyed_workload(n: int, seed: int, keys: int = 8) -> list[tuple[str, int]]:
    """``n`` records ``(key, value)``: ``key`` in ``k0..k{keys-1}``, ``value`` the 1-based position (= ISN)."""
    if keys < 1:
        raise ValueError(f"keys must be >= 1, got {keys}")
    rng = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    return [(names[rng.randrange(keys)], i) for i in range(1, n + 1)]
