"""Inputs by runs and the batch operator API (issue 16): the fast path gives, to the SN,
what the per-record path gives (flux/protocol/segment.py ``process_ready``, flux/operator.py)."""
from __future__ import annotations

import random

import pytest

from flux.addresses import Addr, P, S
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
    return Segment(X, fcons, chain, fprod, lambda out: out[0] % 3 if isinstance(out, tuple)
                   else out % 3)


def drain(seg):
    """Send every buffered tuple and ack it, so the buffers make room (returns them)."""
    sent = []
    for i, d in seg.flushable():
        for effect in seg.flush(i, d):
            sent.append((i, d, effect.msg.items))
    for i, (p, s) in enumerate(CONSUMERS):
        last = seg.fprod.out.buffers[i].last_put
        if last:
            seg.on_message(s, Ack(last))
    return sent


@pytest.mark.parametrize("seed", range(25))
def test_process_ready_equals_process_called_in_a_row(seed):
    """Same outputs, SNs, buffers, credits and counters, with buffers that fill up
    mid-run (the guard puts inputs back) and runs of every length."""
    rng = random.Random(seed)
    capacity = rng.randint(1, 6)
    one, many = segment(OperatorChain([FanOut()]), capacity), segment(OperatorChain([FanOut()]), capacity)
    n = 0
    for _ in range(30):
        items = tuple(((n + k + 1,), rng.randint(0, 50)) for k in range(rng.randint(0, 8)))
        n += len(items)
        for seg in (one, many):
            seg.on_message(INGRESS, Batch(items, (n,)))
        while one.can_process():
            one.process()
        while many.can_process():
            assert many.process_ready(rng.choice([1, 2, 5, 64])) >= 1
        assert [b.entries() for b in one.fprod.out.buffers] == [
            b.entries() for b in many.fprod.out.buffers]
        assert (one.taken, one.emitted, one.fcons.queued()) == (
            many.taken, many.emitted, many.fcons.queued())
        assert one.credits_due() == many.credits_due()
        if one.credits_due():
            assert one.send_credits() == many.send_credits()
        if rng.random() < 0.6:
            assert drain(one) == drain(many)


def test_an_operator_that_raises_in_a_run_names_its_input():
    class Parser(Map):
        def __init__(self):
            super().__init__(self.parse)

        @staticmethod
        def parse(r):
            if r < 0:
                raise ValueError(f"cannot parse {r}")
            return r

    seg = segment(OperatorChain([Parser()]), 8)
    seg.on_message(INGRESS, Batch((((1,), 4), ((2,), 5), ((3,), -3)), (3,)))
    with pytest.raises(OperatorError) as raised:
        seg.process_ready(64)
    err = raised.value
    assert (err.what, err.stage, err.partition, err.sn) == ("operator Parser", 1, 0, (3,))


def test_a_batch_operator_gives_the_outputs_and_sns_of_the_per_record_api():
    """Doubler (a batch) then Map (record by record): the k-th output of input s is s + (k,)."""
    seg = segment(OperatorChain([Doubler(), Map(lambda r: r + 1)]), 64)
    seg.on_message(INGRESS, Batch(tuple(((k,), k) for k in range(1, 40)), (39,)))
    assert seg.process_ready(64) == 39
    want = [[((k, 1), 2 * k + 1) for k in range(2, 40, 2) if (2 * k + 1) % 3 == i]
            for i in range(3)]
    assert [b.entries() for b in seg.fprod.out.buffers] == want
    assert (seg.taken, seg.emitted) == (39, 19)


def test_a_batch_operator_that_misorders_its_pairs_is_refused_at_run_time():
    seg = segment(OperatorChain([Unordered()]), 64)
    seg.on_message(INGRESS, Batch(tuple(((k,), k) for k in range(1, 9)), (8,)))
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
