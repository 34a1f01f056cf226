"""A pair of ingresses, machine by machine (flux/protocol/ingress_pair.py): the leader's item
and bound wait until its twin acked their ends; the follower cuts exactly the items and
epochs it heard of, with the same SNs, and sends its own to the stage-1 replicas of its
side; when the leader dies the follower cuts what it heard, then decides alone; when the
follower dies the leader stops waiting. The simulator runs the pair through crashes
(tests/test_sim_ingress_pairs.py)."""
from __future__ import annotations

import pytest

from flux.addresses import P, S, Addr
from flux.data_messages import IngressLog, LogAck, Reverse
from flux.effects import CutPassed, Send
from flux.errors import LocalProtocolError
from flux.protocol.builder import MachineBuilder
from flux.protocol.ingress_pair import ALONE, FOLLOWING, LEADING, TWIN
from flux.testing.dataflows import counting_dataflow

pytestmark = pytest.mark.timeout(30)


def pair():
    builder = MachineBuilder(counting_dataflow(1), 2, 8, 4, ingresses=2, ingress_pairs=True)
    return builder.ingress(index=0, replica=P), builder.ingress(index=0, replica=S)


def sent(effects, kind):
    return [e for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def data_sent(machine):
    """Everything ``machine`` flushes to stage 1 now: (destination, item SNs)."""
    out = []
    for i, d in list(machine.flushable()):
        if (i, d) == TWIN:
            continue
        for e in machine.flush(i, d):
            if e.msg.items:
                out.append((e.dst, [sn for sn, _ in e.msg.items]))
    return out


def write_log(replica):
    """The runtime writes the entries ``replica`` has due to its split's log; returns the
    replica's effects (a follower's ack)."""
    entries = replica.unwritten()
    assert entries and replica.log_due()
    return replica.journal_written(entries[-1][0])


def relay_log(leader, follower):
    """The leader's log to its twin, written there, and the ack back; returns the
    follower's effects."""
    (log,) = leader.flush(*TWIN)
    assert isinstance(log.msg, IngressLog) and log.dst == follower.addr
    effects = follower.on_message(leader.addr, log.msg)
    assert sent(effects, LogAck) == []  # acked only once written
    effects += write_log(follower)
    (ack,) = sent(effects, LogAck)
    leader.on_message(follower.addr, ack.msg)
    return effects


def test_the_leaders_item_waits_for_its_twin_and_both_cut_it_alike():
    leader, follower = pair()
    assert (leader.role, follower.role) == (LEADING, FOLLOWING)
    records = [("k1", 1), ("k2", 2), ("k1", 3)]
    numbers = [leader.accept(r) for r in records]
    x = leader.cut_item()
    assert x == numbers[-1][0]
    assert data_sent(leader) == []  # held: its twin has not heard where it ends
    assert TWIN in list(leader.flushable())
    assert not follower.can_accept()  # the follower takes no input before it hears of one
    relay_log(leader, follower)
    assert {dst.replica for dst, _ in data_sent(leader)} == {P}  # to stage 1's P side
    assert [follower.accept(r) for r in records] == numbers  # the same SNs
    assert not follower.can_accept()  # up to the item's end, no further
    assert follower.can_cut() and follower.cut_item() == x
    assert {dst.replica for dst, _ in data_sent(follower)} == {S}
    with pytest.raises(LocalProtocolError, match="follows its twin's epochs"):
        follower.advance_epoch(1)


def test_epochs_are_followed_and_the_bound_waits_for_the_twin():
    leader, follower = pair()
    leader.accept(("k1", 1))
    floor = leader.frontier()
    leader.advance_epoch(2)  # the pending input leaves as an item first
    assert leader.frontier() == floor  # the new epoch's start is not told before the twin has it
    relay_log(leader, follower)
    assert leader.frontier() > floor
    follower.accept(("k1", 1))
    follower.cut_item()
    assert follower.epoch == 2 and follower.frontier() == leader.frontier()


def test_the_follower_of_a_dead_leader_cuts_what_it_heard_then_goes_alone():
    leader, follower = pair()
    leader.accept(("k1", 1))
    leader.accept(("k2", 2))
    x = leader.cut_item()
    relay_log(leader, follower)
    follower.on_fail({leader.addr})
    assert follower.role is ALONE
    follower.accept(("k1", 1))
    follower.accept(("k2", 2))
    assert follower.cut_item() == x  # what it heard, first
    assert follower.accept(("k3", 3)) == (x + 1,)  # then inputs of its own
    assert follower.cut_item() == x + 1


def test_a_leader_whose_twin_died_stops_waiting():
    leader, follower = pair()
    leader.accept(("k1", 1))
    leader.cut_item()
    assert data_sent(leader) == []
    leader.on_fail({follower.addr})
    assert leader.role is ALONE and TWIN not in list(leader.flushable())
    # the item's end its twin never acked: the leader writes it to the split's log itself
    # (its twin may have: the same entry at the same place), then the item leaves
    assert leader.unwritten() == [(1, ("item", 1))] and data_sent(leader) == []
    write_log(leader)
    assert data_sent(leader) and not leader.log_due()
    assert leader.idle() is False  # the items are sent, not yet acked


def test_a_new_twin_takes_the_survivors_state_and_follows_it():
    """The survivor's numbering and buffers move whole (its pending inputs are read again
    by the new replica); both psync the stage-1 replicas; the survivor leads again."""
    from flux.control_messages import Avail
    from flux.data_messages import PSync
    from flux.protocol.ingress_catchup import MOVING, RUNNING
    from flux.protocol.segment_mode import CatchUp
    from statemover.messages import RequestRecv, RequestSend, SendState

    builder = MachineBuilder(counting_dataflow(1), 2, 8, 4, ingresses=2, ingress_pairs=True)
    survivor, dead = pair()
    survivor.on_fail({dead.addr})
    survivor.accept(("k1", 1))
    survivor.mark_source(1, 101)  # where its split's source stood (opaque: an offset)
    x = survivor.cut_item()
    survivor.accept(("k2", 2))  # pending: the new replica reads it again
    survivor.mark_source(2, 102)
    for d in range(2):  # the stage-1 replicas its twin fed reverse to it (take-over done)
        survivor.on_message(Addr(1, d, S), Reverse(()))
    new = builder.standby_segment(dead.addr)
    avail = Avail(dead.addr, 9, 1, "standby0", "node0")
    # its state goes once its own entries are in the split's log (the new twin writes on
    # after them)
    assert survivor.on_avail(avail, "mover-standby") == [] and survivor.log_due()
    (ask,) = write_log(survivor)
    assert isinstance(ask, RequestSend)
    data_sent(survivor)
    assert not survivor.can_accept()  # it decides nothing more until the state is sent
    assert isinstance(new.expect_state(CatchUp(1, "mover-node0"))[0], RequestRecv)
    (state,) = survivor.sm_ready()
    assert isinstance(state, SendState) and survivor.mode is MOVING
    assert not survivor.can_accept() and survivor.flushable() == []
    stage1 = {Addr(1, d, r) for d in range(2) for r in (P, S)}
    psyncs = new.state_received(state.data)
    assert {e.dst for e in sent(psyncs, PSync)} == stage1  # 5.3.2, to every live replica
    assert new.mode is RUNNING and new.role is FOLLOWING and new.accepted == x
    # it reads its split from the survivor's mark at or before its count (not past the
    # pending input it reads again)
    assert new.inputs == 1 and new.source_mark(new.inputs) == (1, 101)
    assert {e.dst for e in sent(survivor.state_sent(), PSync)} == stage1
    assert survivor.role is LEADING
    survivor.cut_item()  # its pending input's item: where it ends, the new twin has to hear
    assert data_sent(survivor) == []  # ... before it leaves
    relay_log(survivor, new)
    assert data_sent(survivor)
    assert new.accept(("k2", 2)) == (x + 1,) and new.cut_item() == x + 1


def test_a_checkpoints_cut_is_an_entry_of_the_log_stamped_by_both_and_passed_by_both():
    leader, follower = pair()
    leader.accept(("k1", 1))
    leader.cut_at_epoch(1, 0)  # the coordinator tells the leader: the cut ends epoch 0
    follower.cut_at_epoch(1, 0)  # told directly, a follower waits for its leader's entry
    assert follower.out.cut is None
    cut = leader.out.cut
    assert cut[0] == 1
    # its pass (at its cut, one input of its split read) waits for its twin to hold the
    # epoch's start: should it die first, its twin would end that epoch elsewhere
    assert leader.advance_epoch(1) == []
    relay_log(leader, follower)
    assert list(leader.flushable())[-1] == TWIN
    assert leader.flush(*TWIN) == [CutPassed(1, cut[1], 0, 1)]
    follower.accept(("k1", 1))
    follower.cut_item()  # its item, the cut, the epoch's start: in the leader's order
    assert follower.out.cut == cut and follower.epoch == 1
    assert list(follower.flushable())[-1] == TWIN  # its pass is told on the flush path
    assert follower.flush(*TWIN) == [CutPassed(1, cut[1], 0, 1)]
    assert follower.flush(*TWIN) == []


def test_a_leaders_pass_whose_epoch_its_dead_twin_never_heard_goes_once_it_is_alone():
    leader, follower = pair()
    leader.accept(("k1", 1))
    leader.cut_at_epoch(1, 0)
    cut = leader.out.cut
    assert leader.advance_epoch(1) == [] and leader.flush(*TWIN)  # the log, not the pass
    leader.on_fail({follower.addr})  # its count is the split's now: it reports it
    assert leader.flush(*TWIN) == [CutPassed(1, cut[1], 0, 1)]


def test_a_replica_alone_told_a_cut_again_takes_it_once_and_refuses_one_it_passed():
    leader, follower = pair()
    leader.cut_at_epoch(1, 0)
    leader.advance_epoch(1)
    relay_log(leader, follower)  # the follower heard the cut and epoch 1's start
    follower.on_fail({leader.addr})
    follower.cut_at_epoch(1, 0)  # told again after the take-over: it knows it already
    follower.cut_item()
    assert follower.out.cut == leader.out.cut and follower.epoch == 1
    follower.cut_at_epoch(2, 3)
    assert follower.out.cut[0] == 2
    with pytest.raises(LocalProtocolError, match="at the end of epoch 0"):
        follower.cut_at_epoch(3, 0)  # it is in epoch 1: that cut cannot be its


def _owner(replica, key) -> int:
    """The stage-1 partition ``replica``'s router sends ``key`` to now."""
    return replica.router.route((key, 1))


def _move_of(replica, key):
    """A live move of ``key``'s key group, alone, to the other stage-1 partition."""
    from exchange.group_map import GroupMove
    from exchange.partitioner import HashPartitioner

    router = replica.router
    group = HashPartitioner(router.partitions, router.key_groups).group(router.key((key, 1)))
    source = _owner(replica, key)
    return GroupMove(1, group, group, source, 1 - source)


def test_a_cuts_moves_switch_both_replicas_routing_as_they_end_its_epoch():
    """The leader logs the cut with its moves; each replica routes by the old map up to
    the cut's epoch's end (an input it numbers in that epoch lies below the cut) and by
    the new one after it."""
    leader, follower = pair()
    move = _move_of(leader, "k1")
    leader.cut_at_epoch(1, 0, (move,))
    assert _owner(leader, "k1") == move.source  # told, not switched: epoch 0 goes on
    assert leader.out.move_cuts == ((1, leader.out.cut[1], (move,)),)
    leader.accept(("k1", 1))
    leader.advance_epoch(1)  # the pending input leaves by the old map, then the switch
    assert _owner(leader, "k1") == move.dest
    relay_log(leader, follower)
    follower.accept(("k1", 1))
    assert _owner(follower, "k1") == move.source
    follower.cut_item()  # its item, the cut with its moves, the epoch's start
    assert _owner(follower, "k1") == move.dest
    assert follower.out.move_cuts == leader.out.move_cuts


def test_a_replica_rebuilt_from_its_twin_routes_and_switches_as_the_twin():
    """The twin's state carries its router's map, the move cuts it tells its
    connections and the moves of cuts it has still to pass: the new replica routes by
    the map after the moves its twin made, and switches at the epochs its twin will."""
    from flux.control_messages import Avail
    from flux.protocol.segment_mode import CatchUp

    builder = MachineBuilder(counting_dataflow(1), 2, 8, 4, ingresses=2, ingress_pairs=True)
    survivor, dead = pair()
    survivor.on_fail({dead.addr})
    made, later = _move_of(survivor, "k1"), _move_of(survivor, "k3")
    survivor.cut_at_epoch(1, 0, (made,))
    survivor.advance_epoch(1)  # switched: k1 to its new owner
    survivor.cut_at_epoch(2, 4, (later,))  # not yet: k3 switches at epoch 4's end
    for d in range(2):
        survivor.on_message(Addr(1, d, S), Reverse(()))
    new = builder.standby_segment(dead.addr)
    assert _owner(new, "k1") == made.source  # built with the job's start map
    survivor.on_avail(Avail(dead.addr, 9, 1, "standby0", "node0"), "mover-standby")
    write_log(survivor)
    new.expect_state(CatchUp(1, "mover-node0"))
    (state,) = survivor.sm_ready()
    new.state_received(state.data)
    assert _owner(new, "k1") == made.dest and _owner(new, "k3") == later.source
    assert new.out.move_cuts == survivor.out.move_cuts
    survivor.state_sent()
    survivor.advance_epoch(5)
    relay_log(survivor, new)
    new.cut_item()  # it follows the epoch's start past the cut: switched as its twin
    assert _owner(new, "k3") == later.dest == _owner(survivor, "k3")


def test_a_cut_told_while_a_dead_leaders_entries_are_still_followed_comes_after_them():
    """The twin of a dead leader heard a cut (with moves) it has not followed yet when
    the coordinator tells it a later one: the later one waits behind the entries, else
    the earlier one, stamped after it, would look told already and its moves be lost."""
    leader, follower = pair()
    move = _move_of(leader, "k1")
    leader.accept(("k1", 1))
    leader.cut_item()
    leader.cut_at_epoch(1, 1, (move,))
    (log,) = leader.flush(*TWIN)
    follower.on_message(leader.addr, log.msg)  # heard: the item and the cut, not followed
    write_log(follower)
    follower.on_fail({leader.addr})
    follower.cut_at_epoch(2, 2)  # the coordinator, after the take-over
    follower.accept(("k1", 1))
    follower.cut_item()  # the item it heard, then cut 1 and its moves, then cut 2
    assert follower.out.cut[0] == 2 and follower.out.move_cuts[0][2] == (move,)
    follower.advance_epoch(2)
    assert _owner(follower, "k1") == move.dest
