"""An operator that only spends CPU: it makes a stage the bottleneck on purpose.

The paper's overhead experiment (5.4) adds work to the first group-by so
that the comparison of replication modes measures the cost of replication
where it matters, in a CPU-bound stage. ``BusyWork`` passes every record on
unchanged after ``rounds`` steps of integer arithmetic; it has no state.
"""
from __future__ import annotations

from typing import Any, List


class BusyWork:
    def __init__(self, rounds: int = 200):
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
        self.rounds = rounds

    def process(self, record: Any) -> List[Any]:
        h = 0
        for i in range(self.rounds):
            h = (h * 31 + i) & 0xFFFF
        return [record]

    def get_state(self) -> None:
        return None

    def install_state(self, state: None) -> None:
        pass
