"""Where each last-stage partition's sink writer runs (docs/design/parallel_io.md).

A writer runs on a node beside one replica of its partition, so it dies only with that
replica's node; then it starts again beside the surviving replica, in the view that
declares the node dead. If no replica of the partition survives whole, the pair is
lost (the job stops or restarts) and no writer moves. Pure (DESIGN 3).
"""
from __future__ import annotations

from typing import Collection, Dict, Mapping, Tuple

from flux.addresses import Addr, P, S
from flux.control_messages import WriterMove


class WriterPlacement:
    """Partition -> the node its writer runs on; at the start, its P replica's node."""

    def __init__(self, stages: int, partitions: int, node_of: Mapping[Addr, str]):
        self.stages = stages
        self.node: Dict[int, str] = {p: node_of[Addr(stages, p, P)] for p in range(partitions)}

    def writer(self, partition: int) -> Addr:
        return Addr(self.stages + 1, partition, P)

    def after_failure(self, group: Collection[str], node_of: Mapping[Addr, str],
                      missing: Collection[Addr], inc: Mapping[str, int]) -> Tuple[WriterMove, ...]:
        """The writers of the nodes in ``group`` (failed together), each to the node of its
        partition's replica that is live and not being rebuilt."""
        moves = []
        for p, node in sorted(self.node.items()):
            if node not in group:
                continue
            live = [a for a in (Addr(self.stages, p, P), Addr(self.stages, p, S))
                    if a in node_of and a not in missing and node_of[a] not in group]
            if live:
                self.node[p] = node_of[live[0]]
                moves.append(WriterMove(self.writer(p), inc[self.node[p]], self.node[p]))
        return tuple(moves)
