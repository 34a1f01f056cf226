"""Items and the batch operator API (DESIGN 11): a segment that processes whole
items gives, to the SN, what the per-record path gives (flux/protocol/segment_processing.py
``process``/``process_ready``, flux/operator.py ``process_many``)."""
from __future__ import annotations

import random

import pytest

from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM
from flux.data_messages import Ack, Batch
from flux.dataflow import Dataflow, Stage
from flux.deploy_checks import check_batch_api
from flux.errors import DataflowError, OperatorError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.ingress import INGRESS
from flux.operator import Map, OperatorChain
from flux.reference import reference_output
from flux.protocol.segment import Segment
from items import by, inputs

X = Addr(1, 0, P)
CONSUMERS = [(Addr(2, i, P), Addr(2, i, S)) for i in range(3)]


class FanOut:
    """Emits r % 4 copies of r, numbered: 0 to 3 outputs per input, routed by value."""

    def process(self, record):
        return [(record, k) for k in range(record % 4)]

    def get_state(self):
        return None

    def install_state(self, state):
        pass


class Doubler:
    """A vectorizing operator: one output per even record, computed over the batch."""

    def process(self, record):
        return [record * 2] if record % 2 == 0 else []

    def process_batch(self, records):
        return [(i, r * 2) for i, r in enumerate(records) if r % 2 == 0]

    def get_state(self):
        return None

    def install_state(self, state):
        pass


class WrongDoubler(Doubler):
    """Its batch path forgets the last record: it disagrees with ``process``."""

    def process_batch(self, records):
        return super().process_batch(records[:-1])


class Unordered(Doubler):
    def process_batch(self, records):
        return list(reversed(super().process_batch(records)))


def segment(chain, capacity):
    fcons = FluxConsumer(X, [(INGRESS, INGRESS)])
    fprod = FluxProducer(X, CONSUMERS, capacity, 16)
    return Segment(X, fcons, chain, fprod, by(route))


def route(out):
    return out[0] % 3 if isinstance(out, tuple) else out % 3


def plain(items):
    """``(connection SN, Rows)`` tuples as ``(connection SN, pairs)``: Rows compare by
    identity, so assertions compare what they hold."""
    return [(sn, tuple(sub.pairs())) for sn, sub in items]


def drain(seg):
    """Send every buffered sub-item and ack it, so the buffers make room (returns them)."""
    sent = []
    for i, d in seg.flushable():
        for effect in seg.flush(i, d):
            sent.append((i, d, plain(effect.msg.items), effect.msg.bound))
    for i, (p, s) in enumerate(CONSUMERS):
        last = seg.fprod.out.buffers[i].last_put
        if last:
            seg.on_message(s, Ack(last))
    return sent


def reference(records, first=1):
    """The per-record API's outputs: per consumer partition, ``(SN, output)`` of the k-th
    output of input n (SN ``(n, k)``), routed by value, in SN order."""
    chain = OperatorChain([FanOut()])
    want = [[] for _ in CONSUMERS]
    for n, record in enumerate(records, first):
        for k, out in enumerate(chain.process(record), 1):
            want[route(out)].append(((n, k), out))
    return want


@pytest.mark.parametrize("seed", range(25))
def test_items_give_the_outputs_and_sns_of_the_per_record_reference(seed):
    """Items of random sizes through a one-to-many operator, with buffers that fill up
    (the guard holds items back) and limits of every size: ``process_ready`` is
    ``process`` called while ``can_process`` holds (same buffers, credits, counters),
    and what the segment sends is, row for row, the per-record reference with its SNs."""
    rng = random.Random(seed)
    capacity = rng.randint(1, 6)
    one, many = segment(OperatorChain([FanOut()]), capacity), segment(OperatorChain([FanOut()]), capacity)
    records, sent = [], [[] for _ in CONSUMERS]
    n = 0
    for _ in range(30):
        batch = []
        for _ in range(rng.randint(0, 3)):  # items of 1 to 8 inputs, numbered by their last
            size = rng.randint(1, 8)
            new = [rng.randint(0, 50) for _ in range(size)]
            batch.append(((n + size, 0), inputs(n + 1, *new)))
            records += new
            n += size
        for seg in (one, many):
            seg.on_message(INGRESS, Batch(tuple(batch), (n,)))
        while one.can_process():
            one.process()
        while many.can_process():
            assert many.process_ready(rng.choice([1, 2, 5, 64])) >= 1
        assert [plain(b.entries()) for b in one.fprod.out.buffers] == [
            plain(b.entries()) for b in many.fprod.out.buffers]
        assert (one.taken, one.emitted, one.fcons.queued()) == (
            many.taken, many.emitted, many.fcons.queued())
        assert one.credits_due() == many.credits_due()
        if one.credits_due():
            assert one.send_credits() == many.send_credits()
        if rng.random() < 0.6:
            out = drain(one)
            assert out == drain(many)
            for i, d, items, _ in out:
                if d == PRIM:
                    sent[i] += items
    while True:  # the rest: room made, items processed, till nothing is left
        for seg in (one, many):
            seg.process_ready(64)
        out = drain(one)
        assert out == drain(many)
        for i, d, items, _ in out:
            if d == PRIM:
                sent[i] += items
        if not out:
            break
    assert one.taken == len(records) and one.fcons.queued() == 0
    # one sub-item per item and partition that got rows, its SN the item's and ours (0)
    for subs in sent:
        assert all(sn[1] == 0 and rows for sn, rows in subs)
        assert [sn for sn, _ in subs] == sorted({sn for sn, _ in subs})
    assert [[pair for _, rows in subs for pair in rows] for subs in sent] == reference(records)
    assert one.emitted == sum(len(w) for w in reference(records))


def test_an_operator_that_raises_in_an_item_names_the_record():
    class Parser(Map):
        def __init__(self):
            super().__init__(self.parse)

        @staticmethod
        def parse(r):
            if r < 0:
                raise ValueError(f"cannot parse {r}")
            return r

    seg = segment(OperatorChain([Parser()]), 8)
    seg.on_message(INGRESS, Batch((((3, 0), inputs(1, 4, 5, -3)),), (3,)))
    with pytest.raises(OperatorError) as raised:
        seg.process_ready(64)
    err = raised.value
    assert (err.what, err.stage, err.partition, err.sn) == ("operator Parser", 1, 0, (3,))
    assert all(len(b) == 0 for b in seg.fprod.out.buffers)  # nothing of it half-put


def test_a_batch_operator_gives_the_outputs_and_sns_of_the_per_record_api():
    """Doubler (a batch) then Map (record by record): the k-th output of input s is s + (k,)."""
    seg = segment(OperatorChain([Doubler(), Map(lambda r: r + 1)]), 64)
    seg.on_message(INGRESS, Batch((((39, 0), inputs(1, *range(1, 40))),), (39,)))
    assert seg.process_ready(64) == 1  # one item
    want = [[((39, 0), tuple(((k, 1), 2 * k + 1) for k in range(2, 40, 2)
                             if (2 * k + 1) % 3 == i))] for i in range(3)]
    assert [plain(b.entries()) for b in seg.fprod.out.buffers] == want
    assert (seg.taken, seg.emitted) == (39, 19)


def test_a_batch_operator_that_misorders_its_pairs_is_refused_at_run_time():
    seg = segment(OperatorChain([Unordered()]), 64)
    seg.on_message(INGRESS, Batch((((8, 0), inputs(1, *range(1, 9))),), (8,)))
    with pytest.raises(OperatorError, match="process_batch must return .* in input order"):
        seg.process_ready(64)


def test_a_dataflow_with_a_batch_operator_matches_its_per_record_twin():
    records = list(range(200))
    batched = Dataflow([Stage("a", lambda r: r, (Doubler,))])
    assert check_batch_api(batched, records) is None
    with pytest.raises(DataflowError, match=r"stage 'a' operator 0 \(WrongDoubler\): "
                                            r"process_batch gives"):
        check_batch_api(Dataflow([Stage("a", lambda r: r, (WrongDoubler,))]), records)
    assert reference_output(batched, records, 2)  # the reference runs it record by record
