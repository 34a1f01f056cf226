"""Exact transitions of a host (flux/protocol/host.py; DESIGN 4.4: views, holding, fencing)."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.control_messages import TakeoverDone, View
from flux.data_messages import Ack, Batch, Credit, Reverse
from flux.effects import Deliver, Send
from flux.protocol.egress import Egress
from flux.envelope import Envelope
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.host import Host
from items import rows

pytestmark = pytest.mark.timeout(60)

A, B, C = Addr(1, 0, P), Addr(1, 0, S), Addr(2, 0, P)
PEER = Addr(2, 0, S)


class Recorder:
    """A machine that records its calls and returns scripted effects."""

    def ready_for(self, src, msg):
        return True

    def __init__(self, addr, replies=(), on_fail_replies=()):
        self.addr = addr
        self.calls = []
        self.replies = list(replies)
        self.on_fail_replies = list(on_fail_replies)

    def on_message(self, src, msg):
        self.calls.append(("msg", src, msg))
        return list(self.replies)

    def on_fail(self, dead):
        self.calls.append(("fail", frozenset(dead)))
        return list(self.on_fail_replies)


def env(src, dst, view, msg, inc=0):
    return Envelope(src, dst, view, msg, inc)


PEER_INC = 7  # the incarnation of the process hosting PEER


def make_host(a_replies=(), c_replies=(), a_fail=(), c_fail=()):
    return Host("node0", {A: Recorder(A, a_replies, a_fail), C: Recorder(C, c_replies, c_fail)})


def test_initial_state():
    h = make_host()
    assert h.view == 0 and h.dead == set() and h.name == "node0"
    assert set(h.machines) == {A, C}


# --- delivery and wrapping ------------------------------------------------------------

def test_delivers_to_the_destination_machine_and_wraps_sends():
    h = make_host(a_replies=[Send(A, PEER, Ack((1, 0))), TakeoverDone(A), Send(A, B, Reverse(()))])
    msg = Batch((((1, 0), rows(((1,), "x"))),), (1,))
    sends, others = h.on_envelope(env(PEER, A, 0, msg))
    assert sends == [Envelope(A, PEER, 0, Ack((1, 0))), Envelope(A, B, 0, Reverse(()))]
    assert others == [TakeoverDone(A)]
    assert h.machines[A].calls == [("msg", PEER, msg)]
    assert h.machines[C].calls == []


def test_envelopes_are_stamped_with_the_hosts_current_view():
    h = make_host(a_replies=[Send(A, PEER, Ack((1, 0)))])
    h.on_view(View(1, frozenset()))
    h.on_view(View(2, frozenset()))
    sends, _ = h.on_envelope(env(PEER, A, 1, "m"))
    assert sends == [Envelope(A, PEER, 2, Ack((1, 0)))]


def test_unknown_destination_raises():
    h = make_host()
    with pytest.raises(RemoteProtocolError):
        h.on_envelope(env(PEER, B, 0, "m"))


def test_wrap_passes_non_send_effects_through_in_order():
    h = make_host()
    d1, d2 = Deliver((((1,), "a"),)), TakeoverDone(A)
    assert h.run_local([d1, Send(A, C, "x"), d2]) == ([Envelope(A, C, 0, "x")], [d1, d2])


# --- views ---------------------------------------------------------------------------

def test_a_message_from_a_later_view_is_held():
    h = make_host()
    later = env(PEER, A, 1, "m")
    assert not h.accepts(later)
    assert h.accepts(env(PEER, A, 0, "m"))
    with pytest.raises(LocalProtocolError):
        h.on_envelope(later)
    assert h.machines[A].calls == []
    h.on_view(View(1, frozenset()))
    assert h.accepts(later)
    assert h.accepts(env(PEER, A, 0, "m"))  # earlier views are fine
    assert not h.accepts(env(PEER, A, 2, "m"))
    h.on_envelope(later)
    assert h.machines[A].calls == [("msg", PEER, "m")]  # a view with no failure calls no fail()


def test_views_are_applied_only_in_order():
    h = make_host()
    with pytest.raises(RemoteProtocolError):
        h.on_view(View(2, frozenset({B})))
    assert h.view == 0 and h.dead == set()
    assert h.machines[A].calls == []
    h.on_view(View(1, frozenset()))
    with pytest.raises(RemoteProtocolError):
        h.on_view(View(1, frozenset()))  # a repeated view
    with pytest.raises(RemoteProtocolError):
        h.on_view(View(3, frozenset()))
    h.on_view(View(2, frozenset()))
    assert h.view == 2


def test_a_view_calls_fail_on_every_live_machine_and_wraps_its_effects():
    h = make_host(a_fail=[Send(A, PEER, Reverse((3,)))], c_fail=[TakeoverDone(C)])
    sends, others = h.on_view(View(1, frozenset({B})))
    assert sends == [Envelope(A, PEER, 1, Reverse((3,)))]
    assert others == [TakeoverDone(C)]
    assert h.machines[A].calls == [("fail", frozenset({B}))]
    assert h.machines[C].calls == [("fail", frozenset({B}))]
    assert h.view == 1 and h.dead == {B}


def test_a_machine_declared_dead_alone_is_discarded_not_told():
    # A view that kills one address of a live process (an aborted catch-up) removes it.
    h = make_host()
    c = h.machines[C]
    h.on_view(View(1, frozenset({C, B})))
    assert c.calls == []
    assert C not in h.machines
    assert h.machines[A].calls == [("fail", frozenset({B, C}))]


def test_dead_set_accumulates_over_views():
    h = make_host()
    h.on_view(View(1, frozenset({B})))
    h.on_view(View(2, frozenset({PEER})))
    assert h.dead == {B, PEER}


# --- fencing -------------------------------------------------------------------------

def test_messages_from_a_dead_incarnation_are_dropped_without_calling_the_machine():
    h = make_host(a_replies=[Send(A, PEER, Ack((1, 0)))])
    h.on_view(View(1, frozenset({PEER}), frozenset({PEER_INC})))
    calls_before = list(h.machines[A].calls)
    # Sent before the failure (view 0) or stamped later: both are dropped.
    old = env(PEER, A, 0, Batch((((1, 0), rows(((1,), "x"))),), (1,)), PEER_INC)
    assert h.fenced(old)
    assert h.accepts(old)  # taken off its connection, to be dropped
    assert h.on_envelope(old) == ([], [])
    assert h.on_envelope(env(PEER, A, 1, "m", PEER_INC)) == ([], [])
    assert h.machines[A].calls == calls_before
    # A live sender still gets through.
    assert h.on_envelope(env(B, A, 1, "m")) == ([Envelope(A, PEER, 1, Ack((1, 0)))], [])
    assert h.machines[A].calls == calls_before + [("msg", B, "m")]


def test_unknown_is_not_fenced():
    h = make_host()
    stranger = Addr(5, 3, S)
    assert not h.fenced(env(stranger, A, 0, "m", 99))
    h.on_envelope(env(stranger, A, 0, "m", 99))
    assert h.machines[A].calls == [("msg", stranger, "m")]


def test_a_new_incarnation_at_a_dead_address_is_not_fenced():
    # A rebuilt replica takes the dead one's address (DESIGN 4.6): fencing is by incarnation.
    h = make_host()
    h.on_view(View(1, frozenset({PEER}), frozenset({PEER_INC})))
    assert h.fenced(env(PEER, A, 1, "old", PEER_INC))
    assert not h.fenced(env(PEER, A, 1, "new", PEER_INC + 1))
    h.on_envelope(env(PEER, A, 1, "new", PEER_INC + 1))
    assert h.machines[A].calls[-1] == ("msg", PEER, "new")


# --- with a real machine ------------------------------------------------------------------

def test_hosting_the_egress():
    eg = Egress(1, 1)  # one partition: replicas L0P, L0S
    L0P, L0S = Addr(1, 0, P), Addr(1, 0, S)
    h = Host("egress", {eg.addr: eg})
    # item 2 (inputs 1 and 2), partition 0's part: (2, 0)
    first = Batch((((2, 0), rows(((1, 1), "a"), ((2, 1), "b"))),), (2,))
    sends, others = h.on_envelope(env(L0P, eg.addr, 0, first))
    # acked to the dual, credited to the data source (back-pressure), by connection SN
    assert sends == [Envelope(eg.addr, L0S, 0, Ack((2, 0), None)),
                     Envelope(eg.addr, L0P, 0, Credit((2, 0), None))]
    assert others == [Deliver((((1, 1), "a"), ((2, 1), "b")))]
    # The view that kills L0P makes the egress reverse, stamped with that view.
    assert h.on_view(View(1, frozenset({L0P}), frozenset({PEER_INC}))) == (
        [Envelope(eg.addr, L0S, 1, Reverse((2, 0)))],
        [],
    )
    # A late batch from the dead replica is fenced (it would raise in the machine).
    late = env(L0P, eg.addr, 0, Batch((((3, 0), rows(((3, 1), "c"))),), (3,)), PEER_INC)
    assert h.on_envelope(late) == ([], [])
    assert h.on_envelope(env(L0S, eg.addr, 1, Batch((((3, 0), rows(((3, 1), "c"))),), (3,)))) == (
        [Envelope(eg.addr, L0S, 1, Credit((3, 0), None))],  # the survivor is the data source now
        [Deliver((((3, 1), "c"),))],
    )
    assert eg.delivered == 3 and eg.settled() == 3
