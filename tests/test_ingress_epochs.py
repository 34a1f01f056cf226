"""Several ingresses numbering in epochs (DESIGN 12, docs/design/parallel_io.md): each
numbers its inputs above ``epoch_first(epoch, index, ingresses)``, its items carry its
index as the connection SN's second part, and ending an epoch sends its pending inputs
as an item first, then moves its progress bound to the next epoch; a stage-1 merge fed
by all of them releases their items in one order, whatever order they arrive in."""
from __future__ import annotations

import pytest

from exchange.merge import OrderedMerge
from flux.addresses import Addr, P
from flux.effects import CutPassed
from flux.errors import LocalProtocolError
from flux.protocol.epoch_ingress import EpochIngress
from flux.protocol.ingress import Ingress, ingress_addr
from flux.sequence import EPOCH_INPUTS, epoch_first
from items import by

M = EPOCH_INPUTS


def route(record):
    return {"k0": 0, "k1": 1}[record[0]]


def make(index, ingresses=2, capacity=8, batch_rows=1024, log_inputs=False):
    return EpochIngress(2, by(route), capacity, 16, batch_rows=batch_rows, index=index,
                        ingresses=ingresses, log_inputs=log_inputs)


def test_epoch_numbers_order_by_epoch_then_ingress_then_position():
    assert epoch_first(0, 0, 2) == 0
    assert epoch_first(0, 1, 2) == M
    assert epoch_first(1, 0, 2) == 2 * M
    assert epoch_first(3, 1, 2) == 7 * M
    with pytest.raises(ValueError, match="ingress 2 of 2"):
        epoch_first(0, 2, 2)


def test_one_ingress_numbers_as_before_and_epochs_need_several():
    ingress = Ingress(2, by(route), 8, 16)
    assert ingress.addr == Addr(0, 0, P)
    assert [ingress.accept(("k0", i)) for i in range(3)] == [(1,), (2,), (3,)]
    with pytest.raises(ValueError, match="several ingresses, got 1"):
        EpochIngress(2, by(route), 8, 16, index=0, ingresses=1)


def test_an_ingress_numbers_its_epochs_and_its_items_carry_its_index():
    ingress = make(1)
    assert ingress.addr == ingress_addr(1) == Addr(0, 1, P)
    assert ingress.frontier() == (M,)  # below its first epoch's numbers
    assert ingress.accept(("k0", 1)) == (M + 1,)
    assert ingress.accept(("k1", 2)) == (M + 2,)
    ingress.advance_epoch(2)  # the pending inputs leave as item M + 2 first
    assert [sn for sn, _ in ingress.out.buffers[0].entries()] == [(M + 2, 1)]
    assert [sn for sn, _ in ingress.out.buffers[1].entries()] == [(M + 2, 1)]
    assert ingress.frontier() == (5 * M,)  # epoch 2 of ingress 1: (2 * 2 + 1) * M
    assert ingress.accept(("k0", 3)) == (5 * M + 1,)
    assert ingress.inputs == 3
    with pytest.raises(LocalProtocolError, match="epoch 2 after epoch 2"):
        ingress.advance_epoch(2)


def test_an_epoch_does_not_end_while_its_item_has_no_room():
    ingress = make(0, capacity=1, batch_rows=1)
    ingress.accept(("k0", 1))  # a full item: it leaves and fills partition 0's buffer
    ingress.accept(("k0", 2))  # pending, no room for its item
    assert not ingress.can_advance()
    with pytest.raises(LocalProtocolError, match="no room"):
        ingress.advance_epoch(1)
    assert ingress.accept(("k0", 3)) is None  # back-pressure as before


def test_a_full_epoch_takes_no_more_inputs_until_it_ends():
    ingress = make(0)
    ingress.accepted = ingress.floor + EPOCH_INPUTS - 2  # as if it took that many
    assert ingress.accept(("k0", 1)) == (EPOCH_INPUTS - 1,)
    assert not ingress.can_accept()
    assert ingress.accept_many([("k0", 2)]) == 0
    ingress.advance_epoch(1)
    assert ingress.accept(("k0", 2)) == (2 * M + 1,)


def released(merge):
    """The connection SNs of every item the merge may release now, in order."""
    out = []
    while merge.ready():
        out += [item[0] for _, item in merge.pop_item()]
    return out


def test_a_checkpoint_cuts_at_an_epochs_end_and_each_ingress_tells_when_it_passed():
    a, b = make(0), make(1)
    with pytest.raises(LocalProtocolError, match="cut at an epoch's end"):
        a.choose_cut(1)
    a.advance_epoch(1)
    with pytest.raises(LocalProtocolError, match="which it ended already"):
        a.cut_at_epoch(1, 0)
    for ingress in (a, b):
        ingress.cut_at_epoch(1, 1)  # after every input of epochs 0 and 1: 2 * 2 * M
    assert a.out.cut == b.out.cut == (1, 4 * M)
    assert a.advance_epoch(2) == [CutPassed(1, 4 * M, 0)]
    assert b.advance_epoch(1) == []  # still in the cut's epoch
    assert b.advance_epoch(3) == [CutPassed(1, 4 * M, 1)]
    assert b.advance_epoch(4) == []  # told once


def test_a_restart_numbers_from_the_epoch_after_the_cut():
    ingress = make(1)
    ingress.resume_after(4 * M)  # checkpoint of epochs 0 and 1 of 2 ingresses
    assert ingress.epoch == 2 and ingress.frontier() == (5 * M,)
    assert ingress.accept(("k0", 1)) == (5 * M + 1,)
    logged = make(1, log_inputs=True)
    logged.resume_after(4 * M)
    assert logged.frontier() == (4 * M,) and logged.log_due()  # the epoch's start first
    logged.inputs_logged(logged.accepted)
    assert logged.frontier() == (5 * M,)
    with pytest.raises(LocalProtocolError, match="no epoch's end"):
        make(0).resume_after(4 * M + 3)


def test_with_an_input_log_the_bound_waits_for_the_log_epochs_included():
    """A bound lets the merges release the other ingresses' items below it: a restart
    must not number a replayed input under it, so it tells only what the log holds."""
    ingress = make(0, log_inputs=True)
    ingress.advance_epoch(2)  # no input: the epoch's start alone
    assert ingress.frontier() == (0,) and ingress.log_due()
    ingress.inputs_logged(ingress.accepted)
    assert ingress.frontier() == (4 * M,) and not ingress.log_due()
    ingress.accept(("k0", 1))
    ingress.advance_epoch(3)  # item 4M + 1 waits for the log, and so does the bound
    assert ingress.frontier() == (4 * M,)
    assert ingress.out.buffers[0].entries() == []
    ingress.inputs_logged(ingress.accepted)
    assert ingress.frontier() == (6 * M,)
    assert [sn for sn, _ in ingress.out.buffers[0].entries()] == [(4 * M + 1, 0)]


def test_a_merge_of_two_ingresses_releases_one_order_whatever_the_arrival_order():
    """Stage 1's merge: ingress 1's epoch-0 items wait for ingress 0's epoch to end, and
    ingress 0's epoch-1 item waits for ingress 1 to end epoch 0 too."""
    a, b = make(0), make(1)
    a.accept(("k0", "a1"))
    b.accept(("k0", "b1"))
    b.accept(("k0", "b2"))
    b.cut_item()
    a.advance_epoch(1)  # item 1 leaves, the bound moves to epoch 1
    a.accept(("k0", "a2"))
    a.cut_item()
    merge = OrderedMerge([a.addr, b.addr])

    def sent(ingress):
        return [(sn, rows) for sn, rows in ingress.out.buffers[0].entries()], \
            ingress.frontier()

    items_b, bound_b = sent(b)
    merge.push(b.addr, items_b, bound_b)
    assert released(merge) == []  # ingress 0 may still send epoch-0 items below
    items_a, bound_a = sent(a)
    merge.push(a.addr, items_a, bound_a)
    assert released(merge) == [(1, 0), (M + 2, 1)]  # epoch 0: ingress 0, then ingress 1
    b.advance_epoch(1)
    merge.bound(b.addr, b.frontier())
    assert released(merge) == [(2 * M + 1, 0)]  # epoch 1
