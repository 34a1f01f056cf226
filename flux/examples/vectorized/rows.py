"""A batch's rows by key, and what runs along them without a loop over rows
(``flux.examples.vectorized``): grouping, running maxima, first positions reaching a
bound, and event-time expiry replayed over a batch."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

_FAR = 2.0 ** 62  # shifted times stay below it (_shifts)


class _Groups(NamedTuple):
    """A batch's rows grouped by key: ``order`` sorts them by ``(key, row)``, so a key's rows
    are contiguous and in input order; ``gid`` is each sorted position's group, ``starts``
    and ``ends`` each group's first and one-past-last sorted position, ``slots`` its slot."""

    order: np.ndarray
    gid: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    slots: np.ndarray

    @property
    def last_rows(self) -> np.ndarray:
        return self.order[self.ends - 1]


def _group(slots: np.ndarray, size: int) -> _Groups:
    """Group rows by their slot (< ``size``): a radix sort while slots fit 16 bits."""
    n = len(slots)
    if size <= 1 << 16:
        order = np.argsort(slots.astype(np.uint16), kind="stable")
    else:
        order = np.argsort(slots * n + np.arange(n))
    ordered = slots[order]
    new = np.empty(n, dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    return _Groups(order, np.cumsum(new) - 1, starts, np.append(starts[1:], n), ordered[starts])


def _shifts(lo: np.ndarray, hi: np.ndarray) -> Optional[np.ndarray]:
    """Per segment, the offset that moves its values ``[lo, hi + 1]`` above every earlier
    segment's once ``lo`` is subtracted: then one running max, or one sorted array, serves
    all segments at once. None if that would leave int64 (then the callers use ranks)."""
    if len(lo) and (hi.max() >= _FAR or lo.min() <= -_FAR
                    or float(np.sum(hi.astype(np.float64) - lo + 2)) >= _FAR):
        return None
    width = hi - lo + 2
    return np.cumsum(width) - width


def _running_max(values: np.ndarray, starts: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The running max of ``values``, restarting at each of ``starts`` (``segment`` gives
    each position's)."""
    lo, hi = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
    base = _shifts(lo, hi)
    if base is None:
        uniques, ranks = np.unique(values, return_inverse=True)
        return uniques[_running_max(ranks.astype(np.int64), starts, segment)]
    shift = base[segment] - lo[segment]
    return np.maximum.accumulate(values + shift) - shift


def _first_reaching(low: np.ndarray, starts: np.ndarray, ends: np.ndarray, run: np.ndarray,
                    t: np.ndarray, t_run: np.ndarray) -> np.ndarray:
    """Per query ``(t, t_run)``: the first position of run ``t_run`` whose ``low`` is at
    least ``t`` (the run's end if none); ``low`` is non-decreasing within each run, the
    runs are ``[starts, ends)`` in order, ``run`` gives each position's."""
    lo, hi = low[starts], low[ends - 1]
    base = _shifts(lo, hi)
    if base is None:
        uniques = np.unique(np.concatenate([low, t]))
        return _first_reaching(np.searchsorted(uniques, low), starts, ends, run,
                               np.searchsorted(uniques, t), t_run)
    shifted = low - lo[run] + base[run]
    query = np.minimum(np.maximum(t, lo[t_run]), hi[t_run] + 1) - lo[t_run] + base[t_run]
    return np.searchsorted(shifted, query)


# --- event-time expiry -------------------------------------------------------------------------

class _Expiry(NamedTuple):
    """``flux.expiry.Expiry`` in integers: ``x < watermark - ttl`` is ``x < watermark - cut``
    for integer times, and ``ts - swept >= ttl / 2`` is ``ts >= swept + gap``."""

    cut: int
    gap: int

    @classmethod
    def of(cls, ttl: Optional[float]) -> Optional["_Expiry"]:
        if ttl is None:
            return None
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 (event-time units), got {ttl!r}")
        return cls(math.floor(ttl), math.ceil(ttl / 2))

    def advance(self, ts: np.ndarray, kept: Optional[tuple]) -> tuple:
        """``Expiry.advance`` over a batch: the watermark after each row, the kept
        ``(watermark, last sweep)`` after it, and the row of its last sweep (-1: none).
        A sweep needs the last one's time: one loop step per sweep, none per row."""
        high, swept = kept if kept is not None else (int(ts[0]), int(ts[0]))
        watermark = np.maximum(np.maximum.accumulate(ts), high)
        before = np.empty_like(watermark)
        before[0] = high
        before[1:] = watermark[:-1]
        rising = np.flatnonzero(ts > before)
        peaks = ts[rising]
        last, j = -1, 0
        while True:
            j += int(np.searchsorted(peaks[j:], swept + self.gap))
            if j == len(peaks):
                break
            last, swept = int(rising[j]), int(peaks[j])
            j += 1
        top = int(watermark[-1])
        return watermark, (high if top == high else top, swept), last
