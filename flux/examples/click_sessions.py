"""Click-stream sessions by event time, a per-key handler with a timer
(``TransformWithStateInPandas``): a user's session ends ``gap_ms`` of event time
after their last click, and is emitted as ``(user, clicks, start, end)``.

A timer at ``last + gap_ms``, moved at every click, ends the session once the
watermark passes it; a click that comes before the watermark has passed the timer
(the watermark trails the largest event time by ``watermark_delay_ms``) ends the
old session in the handler itself. ``click_workload`` makes clicks in roughly
increasing event time, some out of order.
"""
from __future__ import annotations

from functools import partial
from typing import List, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa

from flux.dataflow import Dataflow, Stage
from flux.stateful_processor import StatefulProcessor
from flux.transform_with_state import TransformWithStateInPandas

CLICKS = pa.schema([("user", pa.int64()), ("ts", pa.int64())])
SESSIONS = pa.schema([("user", pa.int64()), ("clicks", pa.int64()), ("start", pa.int64()),
                      ("end", pa.int64())])


class ClickSessions(StatefulProcessor):
    def __init__(self, gap_ms: int = 30_000):
        self.gap = gap_ms

    def init(self, handle):
        self.handle = handle
        self.session = handle.getValueState("session")  # (clicks, start, last)

    def handleInputRows(self, key, rows, timerValues):
        ended = []
        for frame in rows:
            for ts in frame["ts"].tolist():
                clicks, start, last = self.session.get() or (0, ts, ts)
                if clicks:
                    self.handle.deleteTimer(last + self.gap)
                    if ts > last + self.gap:
                        ended.append((key[0], clicks, start, last))
                        clicks, start = 0, ts
                self.session.update((clicks + 1, min(start, ts), max(last, ts)))
                self.handle.registerTimer(max(last, ts) + self.gap)
        yield pd.DataFrame(ended, columns=SESSIONS.names)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        clicks, start, last = self.session.get()
        self.session.clear()
        yield pd.DataFrame([(key[0], clicks, start, last)], columns=SESSIONS.names)


def click_sessions(gap_ms: int = 30_000, watermark_delay_ms: int = 5_000):
    return TransformWithStateInPandas(partial(ClickSessions, gap_ms), "user", SESSIONS,
                                      time_mode="EventTime", event_time="ts",
                                      watermark_delay_ms=watermark_delay_ms)


def click_sessions_dataflow(gap_ms: int = 30_000, watermark_delay_ms: int = 5_000) -> Dataflow:
    """One stage keyed by user: ``(user, ts)`` clicks in, sessions out."""
    return Dataflow([Stage("sessions", "user", (partial(
        click_sessions, gap_ms, watermark_delay_ms),), schema=CLICKS)])


def click_workload(n: int, users: int = 100, seed: int = 1, step_ms: int = 400,
                   disorder_ms: int = 3_000) -> List[Tuple[int, int]]:
    """``n`` clicks ``(user, ts)``: ts grows by up to ``step_ms`` a click, less up to
    ``disorder_ms`` of disorder; users are drawn uniformly."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.integers(0, step_ms, n)) + disorder_ms - rng.integers(0, disorder_ms + 1, n)
    return [(int(u), int(t)) for u, t in zip(rng.integers(0, users, n), ts)]
