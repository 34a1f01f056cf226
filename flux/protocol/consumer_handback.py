"""The hand-back (docs/design/handback.md): after a catch-up, a consumer that had reversed
to the active goes on taking its data until the new replica on its own side has caught
up, then returns to it.

In the paper (5.3.2) the active stops forwarding to a reversed consumer at its psync,
and the consumer waits for the new replica's psync and then for its data: the new
replica must first receive and install the state and then work off everything its
sources sent it meanwhile. Measured at full rate, that wait was most of the output's
longest gap after a kill, and an ordered egress waits with it. Instead:

1. The active's psync says it ``forwards``: the consumer keeps taking its data.
2. At the new replica's psync the consumer *listens*: the new replica's batches hold
   nothing it lacks (its output restarts at the state's point, the active is ahead),
   so they are dropped and credited, until one reaches what the consumer holds, or
   its progress bound says nothing it still sends is held already.
3. That batch's new items are the first taken from our side again: data from our side,
   acks to the active (DESIGN 4.6's end state), and a ``Restore`` to the active, which
   answers ``Restored`` after its last data to us. Until then the active's data may
   still come, maybe ahead of our side's: of every batch of either replica only the
   items above what we hold are taken (the active counts what it forwarded as
   delivered: dropping it would lose it if our side then died).
4. The fold-in is reported once that data came and our side has sent all we hold (so
   its marks for us are exact again), so no catch-up starts while a hand-back runs.

Both replicas' streams are the one sequence (DESIGN 4.1), each without a gap from
where we stood, so taking the new items of both by SN loses and repeats nothing. A
death in between: the new replica's before the switch leaves the active sending, told
``Stay`` (its take-over waits for our reverse, and this is it; the controller tries
again); the active's makes our side the source at once, dropping what we hold; the new
replica's after the switch reverses to the active, whose stream then may repeat what
its last data gave us (``behind``: dropped until it passes).

A part of ``flux.protocol.flux_consumer.FluxConsumer`` (its attributes are the
consumer's).
"""
from __future__ import annotations

from typing import List, Optional, Set, Tuple

from flux.addresses import Addr, other
from flux.data_messages import Batch, Credit, Restore, Restored, Stay
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.sequence import bound_key


class HandBack:
    """The hand-back events of a consumer; mixed into ``FluxConsumer``."""

    def _begin_handback(self, j: int, standby: int, fold) -> bool:
        """Both psyncs of a rebuilt producer partition came: listen to the new replica if
        the active still feeds us (step 2). False: nothing to hand back."""
        feed = self.feeds[j]
        if feed.forwarded is None or standby != self.addr.replica:
            return False
        feed.listen, feed.fold = standby, fold
        return True

    def _handback_batch(self, j: int, src: Addr, msg: Batch) -> Tuple[Optional[Batch], List]:
        """A batch of a feed in hand-back: what of it to take (None: nothing). Whichever
        replica it comes from, only items above what we hold are new: both streams are
        the one sequence, each without a gap from where we stood, so taking the new
        items of both by SN loses and repeats nothing (the active's last data, sent
        while our Restore was on its way, may be ahead of our side's)."""
        feed = self.feeds[j]
        x = next((y for y, s in enumerate(feed.replicas) if s.addr == src), None)
        effects: List = []
        if x is not None and x == feed.listen:
            self._note_reach(feed, msg)
            if not self._reached(j):  # all of it taken from the active already
                return None, self._credit_dropped(j, src, msg)
            effects = self._switch(j)
        elif x is None or x not in (feed.data_from, feed.drain):
            raise RemoteProtocolError(f"{self.addr}: data from {src}, which is not a data source")
        elif feed.behind and x == feed.data_from and x != feed.drain:
            self._note_reach(feed, msg)
        held = self.merge.last[j]
        newer = tuple(item for item in msg.items if item[0] > held)
        if len(newer) < len(msg.items):
            effects += self._credit_dropped(j, src, msg)
        return Batch(newer, msg.bound, msg.cut), effects + self._settle(j)

    @staticmethod
    def _note_reach(feed, msg: Batch) -> None:
        """How far our side has sent: up to its last item, and past its bound."""
        if msg.items:
            feed.reached = max(feed.reached, msg.items[-1][0])
        feed.reached = max(feed.reached, bound_key(msg.bound))

    def _reached(self, j: int) -> bool:
        """Has our side sent everything we hold of feed ``j``?"""
        return self.feeds[j].reached >= self.merge.last[j]

    def _settle(self, j: int) -> List:
        """Once the active can send no more and our side has sent all we hold, nothing of
        it repeats what we hold: the hand-back is over."""
        feed = self.feeds[j]
        if feed.behind and feed.drain is None and self._reached(j):
            feed.behind = False
        return self._folded(j)

    def _credit_dropped(self, j: int, src: Addr, msg: Batch) -> List[Send]:
        """Items we had already free the sender's window at once (what we take later is
        credited as it leaves the merge)."""
        if not msg.items:
            return []
        return [Send(self.addr, src, Credit(self.feeds[j].taken, self.moves_crossed))]

    def _switch(self, j: int) -> List:
        """Step 3: our side reached what we hold; it feeds us from here."""
        feed = self.feeds[j]
        ours, active = feed.listen, other(feed.listen)
        feed.listen = feed.forwarded = None
        if feed.data_from != active:  # the active died meanwhile: our side is all there is
            feed.data_from = ours
            return []
        feed.data_from, feed.ack_to, feed.drain, feed.behind = ours, active, active, True
        return [Send(self.addr, feed.replicas[active].addr, Restore(feed.fold.version))]

    def on_restored(self, src: Addr, msg: Restored) -> List:
        """Step 4: the active's last data to us came; the fold-in once our side has
        sent all we hold (``_settle``)."""
        j = self._partition_of.get(src)
        if j is None:
            raise RemoteProtocolError(f"{self.addr}: restored from {src}, not a producer of ours")
        feed = self.feeds[j]
        if feed.drain is None or feed.replicas[feed.drain].addr != src:
            return []  # a hand-back a failure ended (we reversed to it again)
        feed.drain = None
        return self._settle(j)

    def _folded(self, j: int) -> List:
        """The fold-in report, once the hand-back is over: the active's last data came and
        our side sent (or bounded past) all we hold, so that what it counts as sent to us
        is what we hold again (a catch-up of ours, which the report lets start, hands
        its new replica our merge and the producers' marks for us)."""
        feed = self.feeds[j]
        if feed.fold is None or feed.in_handback():
            return []
        fold, feed.fold = feed.fold, None
        return [fold]

    def _handback_fail(self, j: int, newly: Set[int]) -> List:
        """A replica of feed ``j`` died during its hand-back (see the module's docstring);
        ``on_fail``'s rule runs after this."""
        feed, effects = self.feeds[j], []
        source_died = feed.data_from in newly
        if feed.forwarded is not None:
            active = feed.data_from
            if active in newly:  # the active: our side feeds us, from past what we hold
                feed.forwarded = None
                if feed.listen is not None:
                    feed.data_from = feed.listen
            elif other(active) in newly:  # the new replica: the active goes on, and hears
                # that we stay with it (the reverse its take-over waits for, 5.2)
                effects.append(Send(self.addr, feed.replicas[active].addr, Stay(feed.forwarded)))
                feed.forwarded = feed.listen = feed.fold = None
        if feed.drain is not None:
            if feed.drain in newly:  # the active, its last data no longer awaited
                feed.drain = None
            elif feed.data_from in newly:  # our side: on_fail reverses to the active, whose
                feed.fold = None  # data up to its Restored may repeat what we hold
        if source_died:  # the reverse says where to start, but the other's last data
            feed.behind = True  # may have taken us past it
            if feed.data_from != feed.listen:  # another replica: nothing of it seen yet
                feed.reached = ()
        return effects + self._settle(j)

    def _listen_credits(self, j: int, credit: Credit) -> List[Send]:
        """The credit of a feed's data source goes to the replica we listen to as well."""
        feed = self.feeds[j]
        if feed.listen is None or feed.listen == feed.data_from:
            return []
        return [Send(self.addr, feed.replicas[feed.listen].addr, credit)]
