"""Checkpoint coordination: when is checkpoint ``k`` complete, and what its manifest says.

Pure (DESIGN 2, 10). The ingress chooses a cut ``n`` for checkpoint ``k`` (the
last input it sent) and records the source position after input ``n``; every
partition of every stage snapshots when its merge has released every tuple
derived from inputs up to ``n`` and none beyond, and one of its replicas
writes that snapshot; the sink commits every output derived from inputs up to
``n``. This machine hears those reports in any order and says when ``k`` is
complete: only then may its manifest be written, and only complete checkpoints
are ever read. A later checkpoint completing first makes every earlier
incomplete one useless (``abandoned``): a restart always takes the newest.
"""
from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from controller.key_groups import groups_to_manifest
from flux.dataflow import Dataflow, factory_name


def fingerprint(dataflow: Dataflow, partitions: Optional[int]) -> str:
    """What a checkpoint must match to be restored: stage names, partition keys and the
    operator factories, in order, and the partition count (None: at any count, the
    shape a manifest written with key groups names; ``controller.checkpoint_shape``)."""
    shape = [[s.name, factory_name(s.key), [factory_name(f) for f in s.operators]]
             for s in dataflow.stages]
    fields = {"stages": shape} if partitions is None else {"stages": shape,
                                                            "partitions": partitions}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


class Phase(enum.Enum):
    OPEN = "open"  # reports still missing
    COMPLETE = "complete"  # every report in: the manifest may be written
    ABANDONED = "abandoned"  # a later checkpoint completed first


@dataclass
class Checkpoint:
    """What is known of one checkpoint."""

    number: int
    cut: int  # the last input number it covers
    phase: Phase = Phase.OPEN
    position: Any = None  # the source position after input ``cut``
    has_position: bool = False
    parts: Dict[Tuple[int, int], str] = field(default_factory=dict)  # (stage, p) -> file
    #: (stage, p) -> the files that rebuild its state: ``(checkpoint, name)`` from a whole
    #: snapshot through the deltas to ``parts``' file (flux.snapshot_chain)
    chains: Dict[Tuple[int, int], Tuple[Tuple[int, str], ...]] = field(default_factory=dict)
    #: ``"<checkpoint>/<name>"`` -> the checksum of that file of a chain, as its writer
    #: computed it (a restore verifies every file against it)
    digests: Dict[str, str] = field(default_factory=dict)
    sink: Optional[Tuple[int, ...]] = None  # the last SN the sink committed at the cut
    has_sink: bool = False  # every sink partition committed
    #: sink partition -> the last SN it committed at the cut (an egress per partition)
    sinks: Dict[int, Optional[Tuple[int, ...]]] = field(default_factory=dict)
    #: the key groups' maps before and after the live moves its cut carries (DESIGN 13)
    groups: Optional[tuple] = None
    #: with dormant pairs: how many ran when it was cut (a restart runs as many at least)
    running: Optional[int] = None


class CheckpointCoordinator:
    """Hears the reports of every checkpoint; returns manifests of complete ones."""

    def __init__(self, stages: int, partitions: int, fingerprint: str, sinks: int = 1,
                 key_groups: Optional[int] = None, shape: Optional[str] = None):
        """``sinks``: the sink partitions that commit at each cut (1: ordered output; the
        partitions: an egress per partition, docs/design/parallel_io.md). ``key_groups``
        and ``shape``: the job's key groups and its dataflow's fingerprint at any count,
        named in every manifest (None: keys routed by ``hash % partitions``, as before key
        groups: such a manifest restores only at its count; DESIGN 13)."""
        self.stages, self.partitions, self.fingerprint = stages, partitions, fingerprint
        self.sinks = sinks
        self.key_groups, self.shape = key_groups, shape
        self.checkpoints: Dict[int, Checkpoint] = {}
        self.latest_complete: Optional[int] = None
        #: sink partition -> the last SN it committed at any cut (an egress per
        #: partition): what a partition empty at a cut holds (``begin``)
        self.last_commits: Dict[int, Optional[Tuple[int, ...]]] = {}

    # -- events --------------------------------------------------------------------------
    def begin(self, number: int, cut: int, groups: Optional[tuple] = None,
              dormant: Iterable[int] = (), running: Optional[int] = None) -> None:
        """The ingress chose cut ``cut`` for checkpoint ``number``; ``groups``: the key
        groups of each stage's partitions before and after the live moves its cut carries
        (two dicts stage -> ``GroupMap``; None: contiguous ranges, DESIGN 13);
        ``dormant``: partitions not started yet, whose state is empty at the cut (they
        never owned a group): their snapshots are taken as written, with an empty chain
        (docs/design/rescaling.md); ``running``: with dormant pairs, how many pairs
        had started (a restart from it runs as many at least, their state restored)."""
        if number in self.checkpoints:
            raise ValueError(f"checkpoint {number} was begun already")
        if self.checkpoints and number < max(self.checkpoints):
            raise ValueError(f"checkpoint {number} after checkpoint {max(self.checkpoints)}")
        live = [c for c in self.checkpoints.values() if c.phase is not Phase.ABANDONED]
        last = max(live, key=lambda c: c.number) if live else None
        if last is not None and cut < last.cut:
            raise ValueError(f"checkpoint {number}'s cut {cut} is before {last.cut}")
        c = self.checkpoints[number] = Checkpoint(number, cut, groups=groups, running=running)
        for s in range(1, self.stages + 1):
            for p in dormant:
                c.parts[s, p], c.chains[s, p] = "", ()
        if self.sinks > 1:  # their sink partitions hold what they committed last: no more
            for p in dormant:  # (a partition that left, or never started, writes nothing)
                c.sinks[p] = self.last_commits.get(p)
            self._sinks_heard(c)

    def source_recorded(self, number: int, position: Any) -> Optional[dict]:
        c = self._open(number)
        if c is None:
            return None
        c.position, c.has_position = position, True
        return self._maybe_complete(c)

    def part_written(self, number: int, stage: int, partition: int, name: str,
                     chain: Sequence[Tuple[int, str]] = (),
                     digests: Sequence[str] = ()) -> Optional[dict]:
        """A replica of ``stage``'s ``partition`` wrote its snapshot as ``name`` (its twin
        may write too: the first one counts); ``chain``: the files that rebuild it, ending
        with this one (empty: a whole snapshot, ``name`` alone); ``digests``: their
        checksums, in the chain's order (empty: not known)."""
        settled = self.checkpoints.get(number)
        if settled is not None and settled.phase is not Phase.OPEN:
            return None  # late: a rescale's restart may have changed the partitions since
        if not (1 <= stage <= self.stages and 0 <= partition < self.partitions):
            raise ValueError(f"no stage {stage} partition {partition} in this job")
        chain = tuple((k, n) for k, n in chain) or ((number, name),)
        if chain[-1] != (number, name) or any(k >= j for (k, _), (j, _) in zip(chain, chain[1:])):
            raise ValueError(f"checkpoint {number}: stage {stage} partition {partition}'s "
                             f"chain {list(chain)} does not end with {name} in order")
        c = self._open(number)
        if c is None:
            return None
        if digests and len(digests) != len(chain):
            raise ValueError(f"checkpoint {number}: stage {stage} partition {partition}'s "
                             f"chain of {len(chain)} files has {len(digests)} checksums")
        if (stage, partition) not in c.parts:
            c.parts[stage, partition], c.chains[stage, partition] = name, chain
            c.digests.update((f"{k}/{n}", d) for (k, n), d in zip(chain, digests))
        return self._maybe_complete(c)

    def sink_committed(self, number: int, sn: Optional[Tuple[int, ...]],
                       partition: int = 0) -> Optional[dict]:
        """The sink (partition) committed every output derived from inputs up to the cut;
        ``sn`` the last (None: no output yet). The checkpoint's ``sink`` is the largest of
        its partitions': what a restart's input log must still cover."""
        if not 0 <= partition < self.sinks:
            raise ValueError(f"no sink partition {partition} in this job ({self.sinks})")
        c = self._open(number)
        if c is None:
            return None
        sn = tuple(sn) if sn is not None else None
        c.sinks.setdefault(partition, sn)
        if sn is not None and self.sinks > 1:
            last = self.last_commits.get(partition)
            self.last_commits[partition] = sn if last is None else max(last, sn)
        self._sinks_heard(c)
        return self._maybe_complete(c)

    def _sinks_heard(self, c: Checkpoint) -> None:
        if len(c.sinks) == self.sinks:
            c.has_sink = True
            c.sink = max((s for s in c.sinks.values() if s is not None), default=None)

    def restarted(self, restored: Optional[int] = None) -> None:
        """The job restarts from complete checkpoint ``restored`` (None: from the first
        input): what was still open will never complete (its cut may even lie beyond the
        restart's), and a complete checkpoint after ``restored`` is one whose files did not
        verify (the restart fell back past it): it is abandoned too, so the next cuts,
        which follow ``restored``'s, are not refused as earlier than its cut."""
        for c in self.checkpoints.values():
            if c.phase is Phase.OPEN or (c.phase is Phase.COMPLETE and
                                         (restored is None or c.number > restored)):
                c.phase = Phase.ABANDONED
        if restored is not None and restored not in self.checkpoints:
            restored = None  # a driver's earlier run completed it: this one never saw it
        self.latest_complete = restored

    def rescaled(self, partitions: int) -> None:
        """The job restarted (``restarted``) at another partition count: the checkpoints
        from now on wait for its partitions (DESIGN 13). Every open one was abandoned."""
        if any(c.phase is Phase.OPEN for c in self.checkpoints.values()):
            raise ValueError("a rescale while a checkpoint is open: restart first")
        self.partitions = partitions
        if self.sinks > 1:  # a sink partition per last-stage partition
            self.sinks = partitions
            self.last_commits = {}

    # -- queries -------------------------------------------------------------------------
    def abandoned(self) -> List[int]:
        return sorted(k for k, c in self.checkpoints.items() if c.phase is Phase.ABANDONED)

    def missing(self, number: int) -> List[str]:
        """What checkpoint ``number`` still waits for, for a log line."""
        c = self.checkpoints[number]
        want = [f"stage {s} partition {p}" for s in range(1, self.stages + 1)
                for p in range(self.partitions) if (s, p) not in c.parts]
        if not c.has_position:
            want.append("the source position")
        if not c.has_sink:
            want.append("the sink's commit" if self.sinks == 1 else "the commits of sink "
                        "partitions " + ", ".join(str(p) for p in range(self.sinks)
                                                  if p not in c.sinks))
        return want

    # -- rules ---------------------------------------------------------------------------
    def _open(self, number: int) -> Optional[Checkpoint]:
        c = self.checkpoints.get(number)
        if c is None:
            raise ValueError(f"a report for checkpoint {number}, which was never begun")
        return c if c.phase is Phase.OPEN else None  # late reports of a settled one

    def _maybe_complete(self, c: Checkpoint) -> Optional[dict]:
        if len(c.parts) < self.stages * self.partitions or not (c.has_position and c.has_sink):
            return None
        c.phase = Phase.COMPLETE
        for older in self.checkpoints.values():
            if older.number < c.number and older.phase is Phase.OPEN:
                older.phase = Phase.ABANDONED
        self.latest_complete = c.number
        manifest = {"fingerprint": self.fingerprint, "partitions": self.partitions,
                    "stages": self.stages, "cut": c.cut, "source": c.position,
                    "sink": list(c.sink) if c.sink is not None else None,
                    "files": [c.parts[s, p] for s in range(1, self.stages + 1)
                              for p in range(self.partitions)],
                    "chains": [[list(f) for f in c.chains[s, p]]
                               for s in range(1, self.stages + 1) for p in range(self.partitions)],
                    "digests": dict(sorted(c.digests.items()))}
        if self.key_groups is not None:
            manifest.update(key_groups=self.key_groups, shape=self.shape)
        if c.groups is not None:  # where key groups moved live (DESIGN 13)
            manifest.update(groups_to_manifest(*c.groups))
        if c.running is not None:
            manifest["running"] = c.running
        if self.sinks > 1:  # each sink partition's last committed SN
            manifest["sinks"] = [list(c.sinks[p]) if c.sinks[p] is not None else None
                                 for p in range(self.sinks)]
        return manifest
