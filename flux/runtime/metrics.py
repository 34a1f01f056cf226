"""What a running job measures: per interval, inputs taken and dropped, outputs and their
average end-to-end latency; a latency histogram; failure, take-over, catch-up and
state-movement events.

Latency is the time from an input's arrival (at the source: queueing in front
of the ingress counts) to the egress handing an output derived from it to the
sink; an output's SN starts with its input's number (DESIGN 4.1), so no
timestamp travels with the data. The ingress and the egress run in the driver
and share its clock. Each counter has one writer thread (ingress, egress,
controller); readers take copies.

Nothing here grows with the length of a run: the timeline is a ring
of the last ``span`` seconds, arrival times are kept only for inputs whose
outputs may still come (the egress retires them as outputs leave in SN order),
the histogram has fixed buckets and the event log keeps the last ``MAX_EVENTS``
events beside running totals.
"""
from __future__ import annotations

import bisect
import csv
import json
import time
from array import array
from collections import deque
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

#: the columns of ``timeline()`` rows, in order (also the CSV header)
TIMELINE_COLUMNS = ("t_s", "inputs", "dropped", "outputs", "avg_latency_ms")

#: events kept for ``relative_events()``; older ones are only counted
MAX_EVENTS = 10_000

#: arrival times are dropped in blocks of this many inputs (a block move is a memmove)
RETIRE_BLOCK = 1 << 16

#: upper edges of the latency histogram's buckets, seconds: 2^(k/4) ms from 0.25 ms to
#: about 137 s (the last bucket, +inf, takes the rest); quantiles are exact to 19%
LATENCY_EDGES = tuple(0.001 * 2 ** (k / 4) for k in range(-8, 70))


class Ring:
    """Per-interval counters of the last ``slots`` intervals: bucket ``b`` lives in slot
    ``b % slots`` and a slot is reset when a newer bucket takes it. One writer thread."""

    def __init__(self, slots: int, fields: Sequence[str], typecodes: Sequence[str]):
        self.slots = slots
        self.stamp = array("q", [-1]) * slots
        self.fields = {f: array(t, [0]) * slots for f, t in zip(fields, typecodes)}
        self.last = -1

    def add(self, b: int, **amounts: float) -> None:
        i = b % self.slots
        stamp = self.stamp[i]
        if stamp != b:
            if stamp > b:
                return  # older than the ring's span: forgotten
            for values in self.fields.values():
                values[i] = 0
            self.stamp[i] = b
            if b > self.last:
                self.last = b
        for f, v in amounts.items():
            self.fields[f][i] += v

    def get(self, b: int, field: str) -> float:
        i = b % self.slots
        return self.fields[field][i] if self.stamp[i] == b else 0


class EventLog:
    """``(time, what, detail)`` events, appended by the controller and ``kill_node``: the
    last ``keep`` of them, and per kind a count; the state moved (bytes, seconds) and the
    longest catch-up pause are summed as they come, so they survive the log's end."""

    def __init__(self, keep: int = MAX_EVENTS):
        self._events: deque = deque(maxlen=keep)
        self.counts: Dict[str, int] = {}
        self.moved_bytes = 0
        self.moved_seconds = 0.0
        self.max_pause: Optional[float] = None

    def append(self, event: tuple) -> None:
        _, what, detail = event
        self._events.append(event)
        self.counts[what] = self.counts.get(what, 0) + 1
        if what == "state moved":
            self.moved_bytes += detail[1]
            self.moved_seconds += detail[2]
        elif what == "paused":
            self.max_pause = detail[1] if self.max_pause is None else max(self.max_pause,
                                                                          detail[1])

    def extend(self, events: Iterable[tuple]) -> None:
        for e in events:
            self.append(e)

    def __iter__(self) -> Iterator[tuple]:
        return iter(list(self._events))

    def __len__(self) -> int:
        return len(self._events)


class RecentMax:
    """The largest value added in the last ``window`` seconds (a monotonic queue: bounded
    by the values of that window, usually a handful)."""

    def __init__(self, window: float):
        self.window = window
        self._q: deque = deque()  # (time, value), values decreasing

    def add(self, at: float, value: float) -> None:
        q = self._q
        while q and q[-1][1] <= value:
            q.pop()
        q.append((at, value))
        while q[0][0] < at - self.window:
            q.popleft()

    def max(self) -> Optional[float]:
        return self._q[0][1] if self._q else None


#: seconds before the first kill whose longest output gap is the failover's yardstick
BEFORE_KILL = 5.0


class Metrics:
    def __init__(self, interval: float = 0.1, clock: Callable[[], float] = time.monotonic,
                 span: float = 3600.0):
        """``span``: seconds of timeline kept (the last ``span`` seconds of the run)."""
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if not span >= interval:
            raise ValueError(f"span must be at least one interval, got {span!r}")
        self.interval = interval
        self.clock = clock
        self.t0: Optional[float] = None
        slots = int(round(span / interval))
        self._taken = Ring(slots, ("inputs", "dropped"), "qq")  # the ingress writes
        self._given = Ring(slots, ("outputs", "latency"), "qd")  # the egress writes
        self.input_total = 0
        #: arrival time of input n at index n - 1 - ``_retired``
        self._arrivals = array("d")
        self._retired = 0
        self.dropped_total = 0
        self.output_total = 0
        self.latency_counts = array("q", [0]) * (len(LATENCY_EDGES) + 1)
        self.latency_sum = 0.0
        self.last_output: Optional[float] = None
        self.max_output_gap = 0.0  # the longest wait between two outputs, in seconds
        self.max_output_gap_at: Optional[float] = None  # when that wait ended
        #: the longest wait between two outputs that ended after the first kill (None: no
        #: kill, or no output after it): the failover's gap, apart from the start-up's
        self.max_output_gap_after_kill: Optional[float] = None
        #: the waits of the last ``BEFORE_KILL`` seconds, frozen at the first kill: what
        #: the job shows without a failure (outputs come in steps of whole items); a
        #: start-up's wait counts only if the kill comes within ``BEFORE_KILL`` of it
        self._gaps_before_kill = RecentMax(BEFORE_KILL)
        self._killed = False
        #: inputs numbered on the wall clock (ingresses on the nodes): input SN -> when
        #: its epoch began, and the clock outputs are timed by then (``time_by_epochs``)
        self._input_time: Optional[Callable[[int], float]] = None
        self._wall: Callable[[], float] = time.time
        #: "detected", "take-over done", "state moved" (detail: (addr, bytes, seconds)),
        #: "paused", "catch-up done", ... (docs/api.md); and "killed" by ``kill_node``
        self.events = EventLog()

    def begin(self) -> None:
        """Time zero of the timeline: data starts to flow."""
        self.t0 = self.clock()

    def _bucket(self, now: float) -> int:
        return int((now - self.t0) // self.interval) if self.t0 is not None else 0

    def renumber(self, cut: int) -> None:
        """The job restarted at a checkpoint (DESIGN 10): the next input taken is input
        ``cut + 1`` (inputs after the cut are taken again, and timed again)."""
        self._arrivals = array("d")
        self._retired = cut

    # -- writers: ingress ---------------------------------------------------------------
    def input_taken(self, arrival: Optional[float]) -> None:
        now = self.clock()
        self._arrivals.append(now if arrival is None else arrival)
        self.input_total += 1
        self._taken.add(self._bucket(now), inputs=1)

    def inputs_taken(self, arrivals: Sequence[Optional[float]]) -> None:
        """Inputs taken now, in order, each with when it arrived (None: now). One call a
        batch: counted per input, this was a tenth of the ingress's time."""
        if not arrivals:
            return
        now = self.clock()
        self._arrivals.extend([now if a is None else a for a in arrivals])
        self.input_total += len(arrivals)
        self._taken.add(self._bucket(now), inputs=len(arrivals))

    def inputs_dropped(self, total: int) -> None:
        """The source's running count of dropped inputs."""
        if total > self.dropped_total:
            self._taken.add(self._bucket(self.clock()), dropped=total - self.dropped_total)
            self.dropped_total = total

    def inputs_counted(self, total: int) -> None:
        """The running count of inputs taken, as counted elsewhere (the ingresses on the
        nodes report theirs): what it grew by is taken now."""
        if total > self.input_total:
            self._taken.add(self._bucket(self.clock()), inputs=total - self.input_total)
            self.input_total = total

    def time_by_epochs(self, input_time: Callable[[int], float],
                       wall: Callable[[], float] = time.time) -> None:
        """Inputs are numbered in epochs of the wall clock (a ``SplitSource``'s ingresses
        on the nodes): an output's latency counts from when its input's epoch began,
        read from its SN (``input_time``), not from an arrival kept here."""
        self._input_time, self._wall = input_time, wall

    # -- writers: egress ----------------------------------------------------------------
    def outputs_elsewhere(self, total: int) -> None:
        """The egresses run on the executors: ``total`` outputs are in their sinks, as
        their writers reported (counted, no latency measured)."""
        self.output_total = total

    def output(self, sn: tuple) -> None:
        self.outputs([sn])

    def outputs(self, sns: Sequence[tuple]) -> None:
        """Outputs delivered now, in order (one call a delivered batch)."""
        if not sns:
            return
        now = self.clock()
        if self.last_output is not None:
            gap = now - self.last_output
            if gap > self.max_output_gap:
                self.max_output_gap, self.max_output_gap_at = gap, now
            after = self.max_output_gap_after_kill
            if not self._killed:
                self._gaps_before_kill.add(now, gap)
            elif after is None or gap > after:
                self.max_output_gap_after_kill = gap
        self.last_output = now
        retired, arrivals, counts = self._retired, self._arrivals, self.latency_counts
        total, count = 0.0, len(sns)
        if self._input_time is not None:
            wall, input_time = self._wall(), self._input_time
            for sn in sns:
                latency = max(0.0, wall - input_time(sn[0]))
                counts[bisect.bisect_left(LATENCY_EDGES, latency)] += 1
                total += latency
            sns = ()  # no arrival kept
        for sn in sns:
            i = sn[0] - 1 - retired
            if i < 0:  # its input was settled: cannot be (outputs leave in SN order)
                raise ValueError(f"output {sn} after its input was settled ({retired})")
            latency = now - arrivals[i]
            counts[bisect.bisect_left(LATENCY_EDGES, latency)] += 1
            total += latency
        self._given.add(self._bucket(now), outputs=count, latency=total)
        self.latency_sum += total
        self.output_total += count

    def settled(self, n: int) -> None:
        """Every output of inputs 1..n was delivered: their arrival times can go. Called by
        the egress's thread as outputs leave (in SN order) and between them from its
        progress bound, so a dataflow that seldom outputs keeps no more than one that
        often does."""
        if n - self._retired >= RETIRE_BLOCK:
            k = n - self._retired
            del self._arrivals[:k]  # only the egress's thread moves _retired
            self._retired = n

    # -- readers ------------------------------------------------------------------------
    @property
    def arrivals_kept(self) -> int:
        """Arrival times held (inputs whose outputs may still come, plus up to a block)."""
        return len(self._arrivals)

    def timeline(self) -> List[Dict[str, Any]]:
        """One row per interval over the last ``span`` seconds, up to the last interval with
        activity."""
        taken, given = self._taken, self._given
        last = max(taken.last, given.last)
        first = max(0, last - taken.slots + 1)
        rows = []
        for b in range(first, last + 1):
            n = given.get(b, "outputs")
            rows.append({"t_s": round(b * self.interval, 6), "inputs": taken.get(b, "inputs"),
                         "dropped": taken.get(b, "dropped"), "outputs": n,
                         "avg_latency_ms": (round(1000 * given.get(b, "latency") / n, 3)
                                            if n else None)})
        return rows

    def latency_quantile(self, q: float, counts: Optional[Sequence[int]] = None) -> Optional[float]:
        """The ``q`` quantile of the latency (seconds) from the histogram (``counts``: a
        difference of two ``latency_counts`` copies gives it over an interval), linear
        within a bucket; None without outputs."""
        counts = list(self.latency_counts if counts is None else counts)
        total = sum(counts)
        if not total:
            return None
        rank = q * total
        seen = 0
        for k, c in enumerate(counts):
            if c and seen + c >= rank:
                low = LATENCY_EDGES[k - 1] if k else 0.0
                high = LATENCY_EDGES[k] if k < len(LATENCY_EDGES) else LATENCY_EDGES[-1]
                return low + (high - low) * max(0.0, rank - seen) / c
            seen += c
        return LATENCY_EDGES[-1]

    def relative_events(self) -> List[tuple]:
        """The events kept with their time in seconds since time zero."""
        t0 = self.t0 or 0.0
        return sorted(((round(t - t0, 6), what, detail) for t, what, detail in self.events),
                      key=lambda e: e[0])

    def state_moves(self) -> List[tuple]:
        """(addr, bytes, seconds) of every state movement still in the event log."""
        return [detail for _, what, detail in self.events if what == "state moved"]

    def catchup_pauses(self) -> List[float]:
        """Seconds each catch-up's active held its sources paused (phase 2), of
        the catch-ups still in the event log."""
        return [detail[1] for _, what, detail in self.events if what == "paused"]

    def killed(self, what: str) -> None:
        """``what`` is killed now (``FluxJob.kill_node``, an experiment): the event, and
        from now on the longest output gap after the kill is kept apart."""
        now = self.clock()
        self.events.append((now, "killed", what))
        if not self._killed:
            self._gaps_before_kill.add(now, 0.0)  # forgets what ended before the window
        self._killed = True

    def _gap_before_kill(self) -> Optional[float]:
        before = self._gaps_before_kill.max() if self._killed else None
        return round(before, 6) if before else None

    def summary(self) -> Dict[str, Any]:
        rows = self.timeline()
        busy = [r for r in rows if r["inputs"]]
        span = len(busy) * self.interval
        busy_inputs = sum(r["inputs"] for r in busy)
        lat = [r["avg_latency_ms"] for r in rows if r["avg_latency_ms"] is not None]
        ms = {q: self.latency_quantile(q) for q in (0.5, 0.9, 0.99)}
        events = self.events
        return {
            "interval_s": self.interval,
            "inputs": self.input_total,
            "dropped_inputs": self.dropped_total,
            "outputs": self.output_total,
            "input_rate_tps": round(busy_inputs / span, 1) if span else 0.0,
            "median_interval_latency_ms": sorted(lat)[len(lat) // 2] if lat else None,
            **{f"latency_p{round(q * 100)}_ms": (round(1000 * v, 3) if v is not None else None)
               for q, v in ms.items()},
            "max_output_gap_s": round(self.max_output_gap, 6),
            "max_output_gap_end_s": (round(self.max_output_gap_at - (self.t0 or 0.0), 6)
                                     if self.max_output_gap_at is not None else None),
            "max_output_gap_after_kill_s": (round(self.max_output_gap_after_kill, 6)
                                            if self.max_output_gap_after_kill is not None
                                            else None),
            "max_output_gap_before_kill_s": self._gap_before_kill(),
            "events": [list(e) for e in self.relative_events()],
            "event_counts": dict(events.counts),
            "state_bytes_moved": events.moved_bytes,
            "state_move_s": round(events.moved_seconds, 6),
            "max_catchup_pause_s": (round(events.max_pause, 6)
                                    if events.max_pause is not None else None),
        }

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=TIMELINE_COLUMNS)
            writer.writeheader()
            writer.writerows(self.timeline())

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.summary(), f, indent=2, default=str)
