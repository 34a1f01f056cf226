"""No pair on one host (DESIGN 6).

A placement says which node holds which replica; Spark says on which machine
each registered task runs. The two replicas of a partition must not share a
machine, or one machine failure loses the pair. So the controller names the
registered tasks (which one is node k) only once it knows their hosts, and
picks a standby away from the survivor's host. Pure: hosts are plain labels.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Hashable, List, Optional, Sequence, Set, Tuple

from controller.placement import Placement
from flux.addresses import Addr

#: steps the search may take before it gives up on a placement (it is only ever
#: needed for placements with no ring-like structure; chained declustering and
#: cluster pairs are solved greedily in one pass when a solution exists)
SEARCH_BUDGET = 200_000


class PlacementError(ValueError):
    """The registered tasks' hosts cannot keep every pair on two machines."""


def twin_nodes(placement: Placement) -> Set[Tuple[int, int]]:
    """Pairs of node indices that hold the two replicas of some partition."""
    pairs = set()
    for addr, node in placement.node_of.items():
        twin = placement.node_of.get(Addr(addr.stage, addr.partition, 1 - addr.replica))
        if twin is not None and twin != node:
            pairs.add((min(node, twin), max(node, twin)))
    return pairs


def assign_hosts(placement: Placement, candidates: Sequence[Tuple[Hashable, str]]
                 ) -> Dict[int, Hashable]:
    """Choose which candidate (a key and its host) runs each node of ``placement`` so that
    no two nodes holding a pair share a host; the candidates left over are standbys.

    Raises ``PlacementError`` naming the hosts when no choice works."""
    nodes = sorted(placement.nodes)
    if len(candidates) < len(nodes):
        raise PlacementError(f"{len(nodes)} nodes need {len(nodes)} tasks, "
                             f"{len(candidates)} registered")
    neighbours: Dict[int, List[int]] = {n: [] for n in nodes}
    for a, b in twin_nodes(placement):
        neighbours[a].append(b)
        neighbours[b].append(a)
    hosts = _search(nodes, neighbours, Counter(h for _, h in candidates))
    if hosts is None:
        raise PlacementError(describe_shortage(len(nodes), [h for _, h in candidates]))
    pool: Dict[str, List[Hashable]] = {}
    for key, host in candidates:
        pool.setdefault(host, []).append(key)
    return {n: pool[hosts[n]].pop(0) for n in nodes}


def _search(nodes: List[int], neighbours: Dict[int, List[int]],
            free: Counter) -> Optional[Dict[int, str]]:
    """Depth-first over the nodes in order, most plentiful host first (for a ring this
    is the greedy that never needs to go back when a solution exists); bounded."""
    chosen: Dict[int, str] = {}
    steps = [0]

    def place(i: int) -> bool:
        if i == len(nodes):
            return True
        steps[0] += 1
        if steps[0] > SEARCH_BUDGET:
            return False
        node = nodes[i]
        taken = {chosen[m] for m in neighbours[node] if m in chosen}
        for host, left in sorted(free.items(), key=lambda hc: (-hc[1], hc[0])):
            if left == 0 or host in taken:
                continue
            chosen[node], free[host] = host, left - 1
            if place(i + 1):
                return True
            del chosen[node]
            free[host] = left
        return False

    return dict(chosen) if place(0) else None


def describe_shortage(nodes: int, hosts: Sequence[str]) -> str:
    counts = Counter(hosts)
    seen = ", ".join(f"{h}: {c}" for h, c in sorted(counts.items(), key=lambda hc: -hc[1]))
    return (f"cannot keep the two replicas of every partition on different hosts: "
            f"{nodes} nodes over {len(counts)} host(s) ({seen} task(s)); chained "
            f"declustering needs at least 2 hosts and no host running more than "
            f"{nodes // 2} of the {nodes} nodes. Give the job executors on more hosts, or "
            f"pass FluxJob(..., distinct_hosts=False) for single-host development")


def standby_away_from(free: Sequence[str], avoid: Set[str],
                      host_of: Dict[str, str]) -> Optional[str]:
    """The first free standby whose host holds none of the survivors (``avoid``); a
    process of unknown host is its own host."""
    return next((n for n in free if host_of.get(n, n) not in avoid), None)
