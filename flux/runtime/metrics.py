"""What a running job measures: per interval, inputs taken and dropped, outputs and their
average end-to-end latency; failure, take-over, catch-up and state-movement events.

Latency is the time from an input's arrival (at the source: queueing in front
of the ingress counts) to the egress handing an output derived from it to the
sink; an output's SN starts with its input's number (DESIGN 4.1), so no
timestamp travels with the data. The ingress and the egress run in the driver
and share its clock. Each counter has one writer thread (ingress, egress,
controller); readers take copies.
"""
from __future__ import annotations

import csv
import json
import time
from array import array
from typing import Any, Callable, Dict, List, Optional

#: the columns of ``timeline()`` rows, in order (also the CSV header)
TIMELINE_COLUMNS = ("t_s", "inputs", "dropped", "outputs", "avg_latency_ms")


class Metrics:
    def __init__(self, interval: float = 0.1, clock: Callable[[], float] = time.monotonic):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self.clock = clock
        self.t0: Optional[float] = None
        self.arrivals = array("d")  # arrival time of input n at index n - 1
        self.inputs: Dict[int, int] = {}
        self.drops: Dict[int, int] = {}
        self.dropped_total = 0
        self.outputs: Dict[int, int] = {}
        self.latency_sum: Dict[int, float] = {}
        self.output_total = 0
        self.last_output: Optional[float] = None
        self.max_output_gap = 0.0  # the longest wait between two outputs, in seconds
        self.max_output_gap_at: Optional[float] = None  # when that wait ended
        #: (time, what, detail), appended by the controller: "detected", "take-over done",
        #: "state moved" (detail: (addr, bytes, seconds)), "catch-up done"; and by
        #: ``kill_node``: "killed"
        self.events: List[tuple] = []

    def begin(self) -> None:
        """Time zero of the timeline: data starts to flow."""
        self.t0 = self.clock()

    def _bucket(self, now: float) -> int:
        return int((now - self.t0) // self.interval) if self.t0 is not None else 0

    # -- writers: ingress ---------------------------------------------------------------
    def input_taken(self, arrival: Optional[float]) -> None:
        now = self.clock()
        self.arrivals.append(now if arrival is None else arrival)
        b = self._bucket(now)
        self.inputs[b] = self.inputs.get(b, 0) + 1

    def inputs_dropped(self, total: int) -> None:
        """The source's running count of dropped inputs."""
        if total > self.dropped_total:
            b = self._bucket(self.clock())
            self.drops[b] = self.drops.get(b, 0) + total - self.dropped_total
            self.dropped_total = total

    # -- writers: egress ----------------------------------------------------------------
    def output(self, sn: tuple) -> None:
        now = self.clock()
        if self.last_output is not None and now - self.last_output > self.max_output_gap:
            self.max_output_gap, self.max_output_gap_at = now - self.last_output, now
        self.last_output = now
        b = self._bucket(now)
        self.outputs[b] = self.outputs.get(b, 0) + 1
        self.latency_sum[b] = self.latency_sum.get(b, 0.0) + now - self.arrivals[sn[0] - 1]
        self.output_total += 1

    # -- readers ------------------------------------------------------------------------
    def timeline(self) -> List[Dict[str, Any]]:
        """One row per interval from time zero to the last interval with activity."""
        inputs, drops = dict(self.inputs), dict(self.drops)
        outputs, latency = dict(self.outputs), dict(self.latency_sum)
        last = max([*inputs, *drops, *outputs, -1])
        rows = []
        for b in range(last + 1):
            n = outputs.get(b, 0)
            rows.append({"t_s": round(b * self.interval, 6), "inputs": inputs.get(b, 0),
                         "dropped": drops.get(b, 0), "outputs": n,
                         "avg_latency_ms": round(1000 * latency[b] / n, 3) if n else None})
        return rows

    def relative_events(self) -> List[tuple]:
        """The events with their time in seconds since time zero."""
        t0 = self.t0 or 0.0
        return sorted(((round(t - t0, 6), what, detail) for t, what, detail in list(self.events)),
                      key=lambda e: e[0])

    def state_moves(self) -> List[tuple]:
        """(addr, bytes, seconds) of every completed state movement."""
        return [detail for _, what, detail in list(self.events) if what == "state moved"]

    def catchup_pauses(self) -> List[float]:
        """Seconds each catch-up's active held its sources paused (phase 2; issue 11)."""
        return [detail[1] for _, what, detail in list(self.events) if what == "paused"]

    def summary(self) -> Dict[str, Any]:
        moves = self.state_moves()
        pauses = self.catchup_pauses()
        rows = self.timeline()
        busy = [r for r in rows if r["inputs"]]
        span = len(busy) * self.interval
        lat = [r["avg_latency_ms"] for r in rows if r["avg_latency_ms"] is not None]
        return {
            "interval_s": self.interval,
            "inputs": len(self.arrivals),
            "dropped_inputs": self.dropped_total,
            "outputs": self.output_total,
            "input_rate_tps": round(len(self.arrivals) / span, 1) if span else 0.0,
            "median_interval_latency_ms": sorted(lat)[len(lat) // 2] if lat else None,
            "max_output_gap_s": round(self.max_output_gap, 6),
            "max_output_gap_end_s": (round(self.max_output_gap_at - (self.t0 or 0.0), 6)
                                     if self.max_output_gap_at is not None else None),
            "events": [list(e) for e in self.relative_events()],
            "state_bytes_moved": sum(m[1] for m in moves),
            "state_move_s": round(sum(m[2] for m in moves), 6),
            "max_catchup_pause_s": round(max(pauses), 6) if pauses else None,
        }

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=TIMELINE_COLUMNS)
            writer.writeheader()
            writer.writerows(self.timeline())

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.summary(), f, indent=2, default=str)
