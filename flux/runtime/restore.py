"""A restarted job's segments start from a complete checkpoint (DESIGN 10, 13).

At the checkpoint's partition count each segment installs its own partition's chain (a
whole snapshot and the deltas after it, flux.snapshot_chain). At another count (the job
run again with another ``nodes=``) each segment reads the chains of the old partitions
whose key groups overlap its own (``controller.key_groups.sources``: a few, not all) and
installs the key groups it owns of them (``flux.rescale``). A checkpoint whose cut
carried live moves of key groups (DESIGN 13) holds snapshots of the groups each
partition owned before them: each segment installs the groups it owns after them, from
the snapshots that hold them (its own, and the moves' sources').
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from controller.key_groups import map_sources, restore_maps
from exchange.group_map import GroupMap
from flux.errors import CheckpointCorrupt, RescaleRefused
from flux.rescale import regrouped_states, rescaled_states
from flux.runtime.checkpoint_store import CheckpointStore
from flux.snapshot_chain import install, rebuild
from flux.state_codec import unpack_state

log = logging.getLogger(__name__)


def restore_operators(store: CheckpointStore, checkpoint: int, machines: Dict,
                      dataflow=None, partitions: Optional[int] = None,
                      key_groups: Optional[int] = None) -> None:
    """Every segment starts from complete checkpoint ``checkpoint``: its operators' state
    after exactly the inputs up to the checkpoint's cut. ``dataflow``, ``partitions``
    and ``key_groups``: the job's, for a checkpoint of another partition count or whose
    cut carried live moves of key groups."""
    manifest = store.manifest(checkpoint)
    old = manifest["partitions"]
    rescaling = partitions is not None and old != partitions
    if rescaling and (key_groups is None or manifest.get("key_groups") != key_groups):
        raise RescaleRefused(f"checkpoint {checkpoint} of {store.url} has {old} partitions "
                             f"and key groups {manifest.get('key_groups')}, this job "
                             f"{partitions} partitions and key groups {key_groups}")
    maps = restore_maps(manifest, partitions or old)
    rebuilt: Dict[tuple, list] = {}  # (stage, old partition) -> its operators' states
    for addr, segment in machines.items():
        try:
            before, after = maps.get(addr.stage, (None, None))
            if not rescaling and before == after:  # its own partition's groups, as written
                own = _chain(store, manifest, addr.stage, addr.partition)
                if own:  # (none: a dormant partition's, empty at the cut: it starts so)
                    install(segment.chain, own)
                continue
            stage = dataflow.stages[addr.stage - 1]
            keyed = [s is not None for s in segment.chain.keyed_stores()]
            sources = map_sources(addr.partition, before, after)
            if not rescaling:  # its own state that is not keyed stays
                sources = sorted(set(sources) | {addr.partition})
            old_states = {}
            for q in sources:
                if (addr.stage, q) not in rebuilt:  # read and rebuilt once per process
                    snapshots = _chain(store, manifest, addr.stage, q)
                    rebuilt[addr.stage, q] = rebuild(snapshots) if snapshots else \
                        segment.chain.get_state()  # a dormant partition's: empty
                old_states[q] = rebuilt[addr.stage, q]
            split = rescaled_states if rescaling else regrouped_states
            segment.chain.install_state(split(stage, keyed, old_states, addr.partition,
                                              before, after))
        except (CheckpointCorrupt, RescaleRefused):
            raise
        except Exception as exc:
            raise RuntimeError(f"stage {addr.stage} partition {addr.partition}: its state "
                               f"in checkpoint {checkpoint} of {store.url} could not be "
                               f"installed: {type(exc).__name__}: {exc}") from exc
    log.info("restored %d segments from checkpoint %d (cut %d) of %s%s", len(machines),
             checkpoint, manifest["cut"], store.url,
             f", rescaled from {old} to {partitions} partitions" if rescaling else "")


def routing_maps(manifest: Optional[dict], partitions: int) -> Dict[int, GroupMap]:
    """The key groups each stage's partitions own in a job restarted from ``manifest``
    at ``partitions`` (``MachineBuilder.groups``): the manifest's map after its cut's
    moves, where not contiguous ranges (none at another count: a rescale from a
    checkpoint starts from contiguous ranges)."""
    if manifest is None or manifest.get("key_groups") is None:
        return {}
    maps = restore_maps(manifest, partitions)
    return {s: after for s, (_, after) in maps.items()
            if after != GroupMap.even(partitions, manifest["key_groups"])}


def dormant_start(manifest: Optional[dict], partitions: int, running: int,
                  key_groups: Optional[int], stages: int) -> Tuple[Dict[int, GroupMap], int]:
    """Where a job whose pairs from ``running`` on start dormant (``running`` 0: none)
    starts from ``manifest`` (None: the first input): each stage's map
    (``routing_maps``: the stages whose groups are not contiguous ranges over every
    partition) and how many pairs run. Dormant again are the pairs past the last one
    owning a group and past those that ran when it was cut (``running`` for a manifest
    that does not say): a restart runs the pairs the failure-free run ran there, an idle
    one with what it kept that is not a key's, and not those a rescale to fewer took out
    at or before its cut (docs/design/rescaling.md)."""
    maps = routing_maps(manifest, partitions)
    if not running or key_groups is None:
        return maps, 0
    if manifest is None:
        even = GroupMap.even(running, key_groups, partitions)
        return {s: even for s in range(1, stages + 1)}, running
    owners = [int(m.owners.max()) + 1 for m in maps.values()]
    if len(maps) < stages:  # a stage contiguous over every partition: all of them run
        owners.append(partitions)
    count = max([manifest.get("running") or running] + owners)
    return maps, 0 if count == partitions else count


def _chain(store: CheckpointStore, manifest: dict, stage: int, partition: int) -> List[dict]:
    """The snapshots that rebuild ``stage``'s ``partition``, decoded."""
    files = store.part_files(manifest, stage, partition)
    snapshots = []
    for (k, name), data in zip(files, store.read_part(manifest, stage, partition)):
        try:  # verified already: only a checkpoint from before checksums gets here
            snapshots.append(unpack_state(data))
        except Exception as exc:
            raise CheckpointCorrupt(store.path(k, name), f"it cannot be decoded: "
                                    f"{type(exc).__name__}: {exc}") from exc
    return snapshots
