"""A per-key handler's side of ``TransformWithStateInPandas``: the processor a user
writes and the state it declares, named as PySpark 4's ``transformWithStateInPandas``
names them so a processor moves between the two with few changes (DESIGN 5, 11).

A processor declares its state in ``init(handle)`` (``handle.getValueState``,
``getListState``, ``getMapState``) and is then called per key with that key's rows
(``handleInputRows(key, rows, timerValues)``); the state objects it holds always
read and write the state of the key being handled. Values are rows: tuples of
plain values (numpy scalars are taken as Python ones), msgpack-safe, because the
state moves between replicas and into checkpoints as msgpack (DESIGN 4.1, 10).

What differs from PySpark: no processing time (the output must not depend on when
a replica ran, DESIGN 4.8), so ``TimerValues`` give -1 for it, processing-time
timers and TTL (which expire by the clock) are refused, and the event-time
watermark advances per input row, not per micro-batch (``flux.transform_with_state``).
``close()`` is not called: a job's state lives on in its checkpoints.

Pure: no I/O, no clock.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

VALUE, LIST, MAP = "value", "list", "map"
#: the name a key's timers are kept under beside its states (a state's name is never "")
TIMERS = ""


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (msgpack refuses numpy's)."""
    item = getattr(type(value), "item", None)
    if item is not None and type(value).__module__ == "numpy":
        return value.item()
    return value


def as_row(value: Any, what: str) -> tuple:
    """``value`` as a state row: a tuple of plain values (a list is taken as one)."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{what} takes a row (a tuple of values), got {type(value).__name__} "
                        f"{value!r:.60}; wrap one value as ({value!r:.40},)")
    return tuple(_plain(v) for v in value)


class KeyStates:
    """The state of the key being handled, as the state objects see it: loaded from the
    operator's store before a call, written back after it if changed."""

    def __init__(self):
        self.values: Dict[str, Any] = {}
        self.changed = False
        #: timers registered by the call under way (the operator indexes them after it)
        self.registered: List[int] = []

    def load(self, stored: Optional[dict]) -> None:
        self.values = dict(stored) if stored else {}
        self.changed = False
        self.registered = []

    def timers(self) -> Tuple[int, ...]:
        return tuple(self.values.get(TIMERS) or ())

    def stored(self) -> Optional[dict]:
        """What goes back into the store (None: nothing left, the key is deleted)."""
        return {name: v for name, v in sorted(self.values.items())} or None

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def put(self, name: str, value: Any) -> None:
        if value is None:
            self.values.pop(name, None)
        else:
            self.values[name] = value
        self.changed = True


class _State:
    def __init__(self, name: str, key_states: KeyStates):
        self._name, self._key = name, key_states

    def exists(self) -> bool:
        return self._key.get(self._name) is not None

    def clear(self) -> None:
        self._key.put(self._name, None)


class ValueState(_State):
    """One row per key."""

    def get(self) -> Optional[tuple]:
        stored = self._key.get(self._name)
        return None if stored is None else tuple(stored)

    def update(self, newValue: Any) -> None:  # noqa: N803 (PySpark's names)
        self._key.put(self._name, as_row(newValue, "ValueState.update"))


class ListState(_State):
    """A list of rows per key, in the order they were put."""

    def get(self) -> Iterator[tuple]:
        return iter([tuple(row) for row in self._key.get(self._name) or ()])

    def put(self, newState: List[Any]) -> None:  # noqa: N803
        rows = tuple(as_row(r, "ListState.put") for r in newState)
        self._key.put(self._name, rows or None)

    def appendValue(self, newState: Any) -> None:  # noqa: N802,N803
        self.appendList([newState])

    def appendList(self, newState: List[Any]) -> None:  # noqa: N802,N803
        rows = tuple(as_row(r, "ListState.appendList") for r in newState)
        if rows:
            self._key.put(self._name, tuple(self._key.get(self._name) or ()) + rows)


class MapState(_State):
    """A map of row -> row per key; ``keys``, ``values`` and ``iterator`` go in key
    order (PySpark leaves the order open; here it is fixed, so outputs are too)."""

    def _map(self) -> Dict[tuple, tuple]:
        return {tuple(k): tuple(v) for k, v in self._key.get(self._name) or ()}

    def _store(self, table: Dict[tuple, tuple]) -> None:
        from flux.keys import sorted_keys

        pairs = tuple((k, table[k]) for k in sorted_keys(table))
        self._key.put(self._name, pairs or None)

    def getValue(self, key: Any) -> Optional[tuple]:  # noqa: N802
        return self._map().get(as_row(key, "MapState.getValue"))

    def containsKey(self, key: Any) -> bool:  # noqa: N802
        return as_row(key, "MapState.containsKey") in self._map()

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802
        table = self._map()
        table[as_row(key, "MapState.updateValue")] = as_row(value, "MapState.updateValue")
        self._store(table)

    def removeKey(self, key: Any) -> None:  # noqa: N802
        table = self._map()
        if table.pop(as_row(key, "MapState.removeKey"), None) is not None:
            self._store(table)

    def iterator(self) -> Iterator[Tuple[tuple, tuple]]:
        return iter(list(self._map().items()))

    def keys(self) -> Iterator[tuple]:
        return iter(list(self._map()))

    def values(self) -> Iterator[tuple]:
        return iter(list(self._map().values()))


class TimerValues:
    """What PySpark passes as ``timerValues``: no processing time here (-1); the event-time
    watermark in ms (-1 before the first row, or without event time)."""

    def __init__(self, watermark_ms: Optional[int] = None):
        self._watermark = -1 if watermark_ms is None else watermark_ms

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802
        return -1

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self._watermark


class ExpiredTimerInfo:
    """What ``handleExpiredTimer`` gets: the timer's expiry."""

    def __init__(self, expiry_ms: int):
        self._expiry = expiry_ms

    def getExpiryTimeInMs(self) -> int:  # noqa: N802
        return self._expiry


class StatefulProcessorHandle:
    """What ``init`` gets: it declares the processor's state, by name."""

    def __init__(self, key_states: KeyStates, event_time: bool = False):
        self._key_states = key_states
        self._event_time = event_time
        self.declared: Dict[str, str] = {}

    def _declare(self, name: str, kind: str, ttl: Optional[int]) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a state's name is a non-empty str, got {name!r}")
        if name in self.declared:
            raise ValueError(f"state {name!r} is declared twice")
        if ttl is not None:
            raise NotImplementedError(
                f"state {name!r}: a TTL is not supported yet (it would expire by "
                f"processing time, which replicas do not share); delete old state "
                f"from the handler by event time carried in the rows")
        self.declared[name] = kind

    def getValueState(self, stateName: str, schema: Any = None,  # noqa: N802,N803
                      ttlDurationMs: Optional[int] = None) -> ValueState:
        self._declare(stateName, VALUE, ttlDurationMs)
        return ValueState(stateName, self._key_states)

    def getListState(self, stateName: str, schema: Any = None,  # noqa: N802,N803
                     ttlDurationMs: Optional[int] = None) -> ListState:
        self._declare(stateName, LIST, ttlDurationMs)
        return ListState(stateName, self._key_states)

    def getMapState(self, stateName: str, userKeySchema: Any = None,  # noqa: N802,N803
                    valueSchema: Any = None,
                    ttlDurationMs: Optional[int] = None) -> MapState:
        self._declare(stateName, MAP, ttlDurationMs)
        return MapState(stateName, self._key_states)

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        """A timer of the key being handled, at event time ``expiryTimestampMs`` (ms):
        ``handleExpiredTimer`` is called once the watermark reaches it."""
        expiry = self._timer(expiryTimestampMs)
        timers = self._key_states.timers()
        if expiry not in timers:
            self._key_states.put(TIMERS, tuple(sorted(timers + (expiry,))))
            self._key_states.registered.append(expiry)

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        expiry = self._timer(expiryTimestampMs)
        timers = self._key_states.timers()
        if expiry in timers:
            self._key_states.put(TIMERS, tuple(t for t in timers if t != expiry) or None)

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        return iter(self._key_states.timers())

    def _timer(self, expiry: Any) -> int:
        if not self._event_time:
            raise NotImplementedError(
                "timers need time_mode='EventTime' (processing-time timers read a clock "
                "replicas do not share, DESIGN 4.8)")
        expiry = _plain(expiry)
        if not isinstance(expiry, int) or isinstance(expiry, bool):
            raise TypeError(f"a timer's expiry is an int of ms, got {expiry!r:.40}")
        return expiry


class StatefulProcessor:
    """Subclass it: ``init(handle)`` declares the state, ``handleInputRows(key, rows,
    timerValues)`` yields pandas DataFrames of outputs for one key's rows (``rows``: an
    iterator of DataFrames, as PySpark's)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        raise NotImplementedError

    def handleInputRows(self, key: tuple, rows: Iterator[Any],  # noqa: N802,N803
                        timerValues: TimerValues) -> Iterator[Any]:
        raise NotImplementedError

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues,  # noqa: N802,N803
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Any]:
        """A timer of ``key`` expired (event time): its outputs, if any."""
        return iter(())

    def close(self) -> None:
        """Not called by Flux (see the module's docstring); here for PySpark's processors."""
