"""The checkpoint store, as the runtime's (DESIGN 10): the snapshot files replicas write,
the chains that rebuild a partition's state (a whole snapshot, then deltas), the
manifests of complete checkpoints, and their pruning.

A restart verifies what it restores (each file against the checksum recorded when it
was written) and falls back to an older complete checkpoint when a file does not.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

from flux.addresses import S, Addr
from flux.effects import Snapshot
from flux.protocol.host import Host
from flux.sim.config import Chain, FileId
from flux.sim.oracle import Violation
from flux.snapshot_chain import BrokenChain, rebuild
from flux.state_codec import pack_state, unpack_state


def checksum(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass
class StoredFile:
    """A snapshot file as a restore reads it: its bytes and what they unpack to. Damage
    replaces both, never the state objects a replica's chain still shares."""

    data: bytes
    state: dict


class CheckpointStore:
    """Files, chains and manifests, kept across restarts."""

    def __init__(self, world):
        self.world = world
        #: its files; per (checkpoint, stage, partition) the chain of the first snapshot
        #: written (a whole one, then deltas); the manifests of complete checkpoints
        #: (number -> cut, each partition's chain); those kept at the last one
        self.files: Dict[FileId, StoredFile] = {}
        self.parts: Dict[Tuple[int, int, int], Chain] = {}
        self.manifests: Dict[int, Tuple[int, Dict[Tuple[int, int], Chain]]] = {}
        self.kept: List[int] = []
        #: checkpoints a snapshot of which could not be written: they never complete
        self.write_failed: set = set()
        #: per writing replica and its process's incarnation, its last snapshot's chain:
        #: each file with the state written (a delta builds on it; the oracle judges it as
        #: written, whatever the store holds)
        self.chains: Dict[Tuple[Addr, int], List[Tuple[Tuple[FileId, str], dict]]] = {}
        #: (checkpoint, stage, partition) a replica crossed without writing (its twin's)
        self.skipped: set = set()
        #: the input log covers the inputs after this one (truncated with the store)
        self.log_from = 0

    # -- writing ------------------------------------------------------------------
    def writes(self, host: Host, addr: Addr) -> bool:
        """The runtime's rule (HostLoop._keeps_snapshot): the S replica writes; the P one
        only once its host knows S's process dead (or S never exists), or at a cut that
        wants both (``Segment.both_replicas_write``, asked by the step)."""
        if addr.replica == S:
            return True
        w = self.world
        twin = w.host_of.get(addr._replace(replica=S))
        return twin is None or w.hosts[twin].inc in host.dead_incs

    def crossed(self, e: Snapshot) -> None:
        """A replica crossed a cut without writing: its twin writes this one."""
        self.world.outcome.snapshots_skipped += 1
        self.skipped.add((e.number, e.addr.stage, e.addr.partition))

    def write(self, e: Snapshot, host: Host) -> None:
        """A snapshot written: judged as its chain rebuilds it, then stored (unless the
        chain lost a file: the runtime's writer refuses, the next snapshot is whole)."""
        w = self.world
        w.outcome.snapshots += 1
        w.outcome.snapshot_deltas += e.base is not None
        chain = self._chain(e, host.inc)
        try:
            state = rebuild([written for _, written in chain])
        except BrokenChain as exc:
            raise Violation(f"checkpoint {e.number}: {e.addr}'s chain: {exc}") from None
        w.judge_snapshot(replace(e, data=pack_state({"operators": state})))
        (fid, _), written = chain[-1]
        if any(f not in self.files for (f, _), _ in chain[:-1]):
            # this checkpoint stays incomplete, the replica's next snapshot is whole
            w.outcome.failed_writes += 1
            self.write_failed.add(e.number)
            del self.chains[e.addr, host.inc]
            host.machines[e.addr].snapshot_lost()
            return
        self.files[fid] = StoredFile(e.data, written)
        self.parts.setdefault((e.number, e.addr.stage, e.addr.partition),
                              tuple(f for f, _ in chain))
        self.report(w.coordinator.part_written(e.number, e.addr.stage, e.addr.partition,
                                               str(e.addr)))

    def _chain(self, snap: Snapshot, inc: int) -> List[Tuple[Tuple[FileId, str], dict]]:
        """The chain a written snapshot ends (the runtime's SnapshotWriter): a whole one
        starts one, a delta extends its replica's last; a failed write makes the next one
        whole, so a delta over anything else is the protocol's error. A file is named by
        its writer's incarnation too: a process declared dead that still runs (a zombie)
        writes beside the replica rebuilt in its place, never over its files."""
        state = unpack_state(snap.data)
        a = snap.addr
        entry = ((snap.number, a.stage, a.partition, a.replica, inc),
                 checksum(snap.data)), state
        if snap.base is None:
            chain = [entry]
        else:
            chain = self.chains.get((a, inc))
            if not chain or chain[-1][1].get("checkpoint") != snap.base:
                raise Violation(f"checkpoint {snap.number}: {a} wrote a delta over "
                                f"checkpoint {snap.base}, its last snapshot written is "
                                f"{chain[-1][1].get('checkpoint') if chain else None}")
            chain = chain + [entry]
        self.chains[a, inc] = chain
        return chain

    # -- complete checkpoints --------------------------------------------------------
    def dormant_at(self, number: int, dormant) -> None:
        """Checkpoint ``number`` takes the partitions ``dormant`` at its cut as written,
        empty (the coordinator's rule): their chains read nothing."""
        for s in range(1, self.world.stages + 1):
            for p in dormant:
                self.parts[number, s, p] = ()

    def report(self, manifest: Optional[dict]) -> None:
        """The coordinator's answer to a report: a complete checkpoint's manifest, or None."""
        if manifest is None:
            return
        w = self.world
        k = w.coordinator.latest_complete
        w.outcome.complete.append(k)
        chains = {(s, p): self.parts[k, s, p] for s in range(1, w.stages + 1)
                  for p in range(w.partitions)}
        if any(f not in self.files for chain in chains.values() for f, _ in chain):
            return  # the runtime's store refuses a manifest that names a missing file
        self.manifests[k] = (w.coordinator.checkpoints[k].cut, chains)
        self._prune(k)
        w.restarts.completed(k)
        w.moves.sinks.checkpoint_complete(k, self.manifests[k][0])

    def _prune(self, k: int) -> None:
        """As the runtime's store when checkpoint ``k`` completes: keep the last ``keep``
        complete checkpoints, every file their chains read and what replicas still writing
        build on (their last chain, unless it is older than every checkpoint kept); the
        input log loses what the oldest kept checkpoint covers."""
        keep = self.world.config.keep
        if keep is None:
            return
        oldest = self.kept[0] if self.kept else k
        done = sorted(self.manifests)
        if len(done) > keep:
            needed = {f[0] for chain in self.chains.values() if chain[-1][0][0][0] >= oldest
                      for (f, _), _ in chain}
            for j in done[-keep:]:
                needed.update(f[0] for chain in self.manifests[j][1].values() for f, _ in chain)
            oldest_kept = done[-keep]
            for j in done[:-keep]:
                del self.manifests[j]
            for f in [f for f in self.files if f[0] < oldest_kept and f[0] not in needed]:
                del self.files[f]
            for key in [key for key in self.parts if key[0] < oldest_kept
                        and key[0] not in needed]:
                del self.parts[key]
            done = done[-keep:]
        self.kept = done
        self.log_from = max(self.log_from, self.manifests[done[0]][0])

    # -- restoring ------------------------------------------------------------------
    def restorable(self) -> Optional[int]:
        """The newest complete checkpoint whose files all verify (as their checksums were
        recorded when they were written), or None; the ones that do not are dropped from
        the store's complete ones: kept, one's cut may lie after the cuts that follow the
        restored one, and the input log would be truncated past those."""
        config, fallbacks = self.world.config, self.world.outcome.fallbacks
        for k in sorted(self.manifests, reverse=True):
            if not config.verify_restores or not self._unverified(k):
                return k
            fallbacks.append(k)
            if config.forget_skipped:
                del self.manifests[k]
        return None

    def _unverified(self, k: int) -> List[FileId]:
        """The files of checkpoint ``k``'s chains that are missing or not as written."""
        files = self.files
        return [f for chain in self.manifests[k][1].values() for f, digest in chain
                if f not in files or checksum(files[f].data) != digest]

    def read(self, chain: Chain) -> List[dict]:
        """What a restore reads of a partition's chain."""
        try:
            return [self.files[f].state for f, _ in chain]
        except KeyError as exc:
            raise FileNotFoundError(f"checkpoint file {exc.args[0]} is not in the store") from None
