"""Test pipelines built on the paper's dataflow and the load operators.

- ``cpu_bound_paper_dataflow``: the paper's, with ``BusyWork`` making the first
  group-by CPU-bound (the overhead experiment).
- ``with_ballast``, ``ballast_paper_dataflow``: keyed state of a given size.
- ``counting_dataflow``: ``(key, value)`` records through ``KeyedCounter``
  stages, repartitioned at every stage; outputs ``(key, ±count, payload)``.
- ``regrouping_dataflow``: the same, each stage counting per its own partition key
  (its state can be rescaled, and its output does not depend on the partition count).
- ``relaying_dataflow``: a ``KeyedCounter`` stage, then a stage keyed by ``(key, count)``
  that passes its records on: every input gives an output carrying its value, so the
  order a job numbered its inputs in can be read from its outputs.
- ``packet_dataflow``: the paper's two stages, then ``KeyedCounter`` stages
  (stage 3 partitioned by ``(app, ts)``, later ones by ``(key, count)``).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional, Sequence

from flux.dataflow import Dataflow, Stage
from flux.operator import Map
from flux.examples.dataflows import paper_dataflow, paper_stages
from flux.examples.stats import DEFAULT_WINDOW
from flux.testing.ballast import Ballast
from flux.testing.busy import BusyWork
from flux.testing.counter import KeyedCounter, first_field, key_and_count


def app_and_time(stats_record: Sequence[Any]) -> tuple:
    """``(app, ts)`` of a stats output: spreads each application over the partitions."""
    return (stats_record[0], stats_record[4])


def cpu_bound_paper_dataflow(rounds: int = 200, window: int = DEFAULT_WINDOW,
                             emit_every: int = 2) -> Dataflow:
    """The paper's dataflow with ``BusyWork(rounds)`` in front of session reconstruction:
    the first group-by is the bottleneck (the overhead experiment, 5.4)."""
    stages = paper_stages(window, emit_every)
    first = stages[0]
    stages[0] = Stage(first.name, first.key, (partial(BusyWork, rounds=rounds), *first.operators))
    return Dataflow(stages)


def with_ballast(dataflow: Dataflow, mb: float) -> Dataflow:
    """``dataflow`` carrying ``Ballast(mb)``, ``mb`` MB of keyed state per partition, in
    front of its first stage's operators: catch-up moves state of that size."""
    stages = list(dataflow.stages)
    first = stages[0]
    stages[0] = Stage(first.name, first.key, (partial(Ballast, mb=mb), *first.operators))
    return Dataflow(stages)


def ballast_paper_dataflow(mb: float, window: int = DEFAULT_WINDOW,
                           emit_every: int = 2) -> Dataflow:
    """The paper's dataflow with ``mb`` MB of keyed state per partition (``with_ballast``)."""
    return with_ballast(paper_dataflow(window, emit_every), mb)


def counting_dataflow(stages: int, fanout_every: int = 3) -> Dataflow:
    """``stages`` KeyedCounter stages over ``keyed_workload`` records ``(key, value)``.

    Stage 1 is partitioned on the input key; stage s > 1 on ``(key, count)``
    of the previous counter's output, so one key spreads over partitions and
    data really moves at every stage. Every ``fanout_every``-th count of a
    key emits a second record (one-to-many). Records stay
    ``(str, int, int)``.
    """
    if stages < 1:
        raise ValueError(f"a counting dataflow needs >= 1 stage, got {stages}")
    counter = partial(KeyedCounter, fanout_every=fanout_every)
    return Dataflow(
        [
            Stage(f"count{s}", first_field if s == 1 else key_and_count, (counter,))
            for s in range(1, stages + 1)
        ]
    )


def regrouping_dataflow(stages: int, fanout_every: int = 3, regroup: int = 3) -> Dataflow:
    """``stages`` KeyedCounter stages over ``keyed_workload`` records, each counting per its
    own partition key (the first field) and naming its outputs ``(key, count % regroup)``:
    data moves at every stage, and every store is keyed by its stage's key, so its state
    can be split over another partition count (DESIGN 13), and the output is the same at
    every count."""
    if stages < 1:
        raise ValueError(f"a regrouping dataflow needs >= 1 stage, got {stages}")
    counter = partial(KeyedCounter, fanout_every=fanout_every, regroup=regroup)
    return Dataflow([Stage(f"regroup{s}", first_field, (counter,))
                     for s in range(1, stages + 1)])


def relaying_dataflow(fanout_every: int = 3) -> Dataflow:
    """``keyed_workload`` records counted by key (outputs ``(key, ±count, value)``), then
    moved on by ``(key, count)`` unchanged: each input's ``value`` is in its outputs, and
    the first output of each value is in the order the job numbered the inputs."""
    counter = partial(KeyedCounter, fanout_every=fanout_every)
    return Dataflow([Stage("count", first_field, (counter,)),
                     Stage("relay", key_and_count, (partial(Map, tuple),))])


def relayed_order(outputs, records) -> list:
    """``records`` in the order a job of ``relaying_dataflow`` numbered them, read from
    its ``outputs`` in SN order: the first output of each value (a positive count)."""
    by_value = {r[1]: r for r in records}
    order, seen = [], set()
    for _, out in outputs:
        if out[1] > 0 and out[2] not in seen:
            seen.add(out[2])
            order.append(by_value[out[2]])
    return order


def relayed_mismatch(outputs, records, splits, partitions: int) -> Optional[str]:
    """What is wrong with the ``outputs`` (``(sn, record)`` in delivery order) of a job of
    ``relaying_dataflow`` over ``records`` read in ``splits`` (each split's records in
    its order) on ``partitions``, or None: SNs increasing and each once, every input
    once, each split's inputs numbered in that split's order, and the outputs exactly
    the failure-free run's over the inputs in the order the job numbered them."""
    from flux.operator import wire_form
    from flux.reference import reference_output

    sns = [tuple(sn) for sn, _ in outputs]
    if sns != sorted(set(sns)):
        return "output SNs not increasing, or one twice"
    order = relayed_order(outputs, records)
    if sorted(order) != sorted(records):
        return f"{len(order)} inputs in the output, {len(records)} read"
    rank = {r: k for k, r in enumerate(order)}
    for k, split in enumerate(splits):
        mine = [rank[r] for r in split]
        if mine != sorted(mine):
            return f"split {k}'s inputs were numbered out of its order"
    expected = [wire_form(r) for _, r in reference_output(relaying_dataflow(), order,
                                                          partitions)]
    if [wire_form(r) for _, r in outputs] != expected:
        return "the output differs from the reference of the order the job numbered"
    return None


def packet_dataflow(stages: int, window: int = DEFAULT_WINDOW, emit_every: int = 2,
                    fanout_every: int = 3, session_ttl: Optional[int] = None,
                    idle_ttl: Optional[int] = None) -> Dataflow:
    """The paper's dataflow cut or extended to ``stages`` stages, over ``packet_workload``.

    1: sessions by ``(src, dst)``; 2: stats by ``(app, src)``; 3: a
    KeyedCounter by ``(app, ts)`` counting per app (outputs
    ``(app, ±count, src)``); 4+: KeyedCounters by ``(app, count)``.
    ``session_ttl``, ``idle_ttl``: as ``paper_dataflow``'s.
    """
    if stages < 1:
        raise ValueError(f"a packet dataflow needs >= 1 stage, got {stages}")
    chosen = paper_stages(window, emit_every, session_ttl, idle_ttl)[:stages]
    counter = partial(KeyedCounter, fanout_every=fanout_every)
    for s in range(3, stages + 1):
        chosen.append(Stage(f"count{s}", app_and_time if s == 3 else key_and_count, (counter,)))
    return Dataflow(chosen)
