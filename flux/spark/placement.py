"""Where a job's tasks run: what ``FluxJob.placement()`` says (a user checks that no pair
shares a machine, finds a node's process, or sees where a catch-up put a replica)."""
from __future__ import annotations

from typing import Dict, List

from flux.addresses import P


def placement_of(controller, topology, stages: int) -> Dict[str, dict]:
    """Per registered task (nodes and standbys) still alive: its host, Spark executor,
    Python worker's pid, and the replicas it holds now (``stage 1 partition 2 P``: after
    a catch-up a standby holds what a dead node held). Called from a user's thread while
    the controller's thread changes these: it reads copies."""
    c, recovery = controller, controller.recovery
    where = dict(recovery.node_of if recovery is not None else topology.where)
    held: Dict[str, List[str]] = {}
    for addr, node in sorted(where.items()):
        if 1 <= addr.stage <= stages:
            replica = "P" if addr.replica == P else "S"
            held.setdefault(node, []).append(
                f"stage {addr.stage} partition {addr.partition} {replica}")
    registered, dead = dict(c.registered), set(c.dead)
    return {name: {"host": c.hosts.get(name, ""), "executor": c.executors.get(name, ""),
                   "pid": registered[name][2], "replicas": held.get(name, [])}
            for name in sorted(registered) if name not in dead}
