"""The paper's dataflow (section 2.4): packets -> sessions by ``(src, dst)`` ->
windowed stats by ``(app, src)``; outputs ``(app, src, max, avg, ts)``.

Keys and factories are module-level functions, classes and
``functools.partial`` objects so they pickle to Spark executors.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from flux.dataflow import Dataflow, Stage
from flux.examples.sessions import SessionReconstruction, session_key
from flux.examples.stats import DEFAULT_WINDOW, WindowedDurationStats, stats_key


def paper_stages(window: int, emit_every: int, session_ttl: Optional[int] = None,
                  idle_ttl: Optional[int] = None) -> list[Stage]:
    sessions = (partial(SessionReconstruction, ttl=session_ttl) if session_ttl is not None
                else SessionReconstruction)
    return [
        Stage("sessions", session_key, (sessions,)),
        Stage(
            "stats",
            stats_key,
            (partial(WindowedDurationStats, window=window, emit_every=emit_every,
                     idle_ttl=idle_ttl),),
        ),
    ]


def paper_dataflow(window: int = DEFAULT_WINDOW, emit_every: int = 2,
                   session_ttl: Optional[int] = None, idle_ttl: Optional[int] = None
                   ) -> Dataflow:
    """The paper's dataflow: session reconstruction, then per-(app, src) windowed stats.
    ``session_ttl``/``idle_ttl``: event-time expiry of open sessions and of idle keys
    (None: never; on an endless feed of ever new keys, set them)."""
    return Dataflow(paper_stages(window, emit_every, session_ttl, idle_ttl))


def paper_dataflow_on_columns(window: int = DEFAULT_WINDOW, emit_every: int = 2) -> Dataflow:
    """The paper's per-record operators, their stages keyed by columns with schemas:
    packets and sessions travel as Arrow columns and are routed by a vectorized hash,
    the operators still get tuples (DESIGN 11); the same output as ``paper_dataflow``."""
    from flux.examples.vectorized import PACKET_SCHEMA, SESSION_SCHEMA
    return Dataflow([
        Stage("sessions", ("src", "dst"), (SessionReconstruction,), schema=PACKET_SCHEMA),
        Stage("stats", ("app", "src"),
              (partial(WindowedDurationStats, window=window, emit_every=emit_every),),
              schema=SESSION_SCHEMA),
    ])


def vectorized_stages(window: int, emit_every: int, session_ttl: Optional[int] = None,
                      idle_ttl: Optional[int] = None) -> list[Stage]:
    from flux.examples.vectorized import PACKET_SCHEMA, VectorizedSessions, VectorizedStats
    return [
        Stage("sessions", ("src", "dst"), (partial(VectorizedSessions, ttl=session_ttl),),
              schema=PACKET_SCHEMA),
        Stage("stats", ("app", "src"),
              (partial(VectorizedStats, window=window, emit_every=emit_every,
                       idle_ttl=idle_ttl),)),
    ]


def vectorized_dataflow(window: int = DEFAULT_WINDOW, emit_every: int = 2,
                        session_ttl: Optional[int] = None, idle_ttl: Optional[int] = None
                        ) -> Dataflow:
    """The paper's dataflow with its operators on Arrow batches
    (``flux.examples.vectorized``): the same packets in (tuples ``(src, dst, app, kind,
    ts)``, made columns of ``PACKET_SCHEMA`` as they enter), routed by key columns, and
    exactly ``paper_dataflow``'s outputs, SN for SN."""
    return Dataflow(vectorized_stages(window, emit_every, session_ttl, idle_ttl))
