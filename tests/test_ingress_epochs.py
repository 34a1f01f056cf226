"""Several ingresses numbering in epochs (DESIGN 12, docs/design/parallel_io.md): each
numbers its inputs above ``epoch_first(epoch, index, ingresses)``, its items carry its
index as the connection SN's second part, and ending an epoch sends its pending inputs
as an item first, then moves its progress bound to the next epoch; a stage-1 merge fed
by all of them releases their items in one order, whatever order they arrive in."""
from __future__ import annotations

import pytest

from exchange.merge import OrderedMerge
from flux.addresses import Addr, P, S
from flux.errors import LocalProtocolError
from flux.protocol.ingress import Ingress, ingress_addr
from flux.sequence import EPOCH_INPUTS, epoch_first
from items import by

M = EPOCH_INPUTS


def route(record):
    return {"k0": 0, "k1": 1}[record[0]]


def make(index, ingresses=2, capacity=8, batch_rows=1024):
    return Ingress(2, by(route), capacity, 16, batch_rows=batch_rows, index=index,
                   ingresses=ingresses)


def test_epoch_numbers_order_by_epoch_then_ingress_then_position():
    assert epoch_first(0, 0, 2) == 0
    assert epoch_first(0, 1, 2) == M
    assert epoch_first(1, 0, 2) == 2 * M
    assert epoch_first(3, 1, 2) == 7 * M
    with pytest.raises(ValueError, match="ingress 2 of 2"):
        epoch_first(0, 2, 2)


def test_one_ingress_numbers_as_before_and_has_no_epochs():
    ingress = Ingress(2, by(route), 8, 16)
    assert ingress.addr == Addr(0, 0, P)
    assert [ingress.accept(("k0", i)) for i in range(3)] == [(1,), (2,), (3,)]
    with pytest.raises(LocalProtocolError, match="without epochs"):
        ingress.advance_epoch(1)


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


def test_checkpoints_and_restarts_of_several_ingresses_are_refused_until_built():
    with pytest.raises(ValueError, match="input log"):
        Ingress(2, by(route), 8, 16, log_inputs=True, index=0, ingresses=2)
    with pytest.raises(LocalProtocolError, match="cut is to be an epoch"):
        make(0).choose_cut(1)
    with pytest.raises(LocalProtocolError, match="restart of several ingresses"):
        make(0).resume_after(5)


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
