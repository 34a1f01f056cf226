"""A segment's local work (paper 3.1.1, Figure 3 action 1; DESIGN 4.1, 11): an item
released whole by the merge goes through the operators, its outputs numbered per row
(the k-th output of the row with SN ``s`` is ``s + (k,)``), routed, and split into one
sub-item per consumer partition, buffered under the connection SN ``item + (p,)``
(p: this partition); batches and credits out.

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's).
"""
from __future__ import annotations

from typing import Any, List

from exchange.routing import RouteRefused, routed
from exchange.rows import NumberedRows
from flux.errors import DataflowError, LocalProtocolError, OperatorError
from flux.operator import OperatorRaised, describe
from flux.protocol.segment_mode import DRAINING, PROCESSING, STREAMING, Event
from flux.sequence import SN, item_bound


class ProcessingSide:
    """The local work of a segment; mixed into ``Segment``."""

    def can_process(self) -> bool:
        """Figure 3 action 1's guard: running, room in the buffers, an item to release,
        no checkpoint cut crossed but not yet snapshotted, and no key-group range moved
        here at a crossed cut and not installed yet (DESIGN 13)."""
        return (self.mode in (PROCESSING, STREAMING, DRAINING) and not self.fprod.out.full()
                and self.fcons.can_release() and not self.snapshot_due()
                and not self.awaiting_range())

    def process_ready(self, limit: int) -> int:
        """Local work: ``process`` while ``can_process`` holds, at most ``limit`` items;
        returns how many it took."""
        n = 0
        while n < limit and self.can_process():
            self.process()
            n += 1
        return n

    def process(self) -> int:
        """Run the next item through the operators; returns how many outputs it made."""
        self._next(Event.PROCESS)
        if not self.fcons.can_release():
            raise LocalProtocolError(f"{self.addr}: process with no item to release")
        item, rows = self.fcons.release()
        out = self._operators(rows)
        self.taken += len(rows)
        self.emitted += len(out)
        if len(out):
            if self.outputs is not None:
                self.outputs.add(item, out)
            self._put(item, out)
        return len(out)

    def _operators(self, rows: NumberedRows) -> NumberedRows:
        """An item's rows through the operator chain: its output rows, numbered."""
        chain = self.chain
        try:
            if chain.columnar:  # batch operators: the item's columns in one call
                parents, batch = chain.process_arrow(self._columns(rows))
                return rows.outputs(parents, batch)
            rows = rows.as_records()  # record operators, through the batch of records
            return rows.outputs(chain.process_many(rows.records))
        except OperatorRaised as raised:
            raise self._operator_error(rows, raised) from raised.error

    def _columns(self, rows: NumberedRows) -> Any:
        if rows.batch is None:  # the dataflow's checks give such a stage columns
            raise DataflowError(f"stage {self.addr.stage}'s operators take Arrow batches, "
                                f"and its input came as Python records")
        return rows.batch

    def _operator_error(self, rows: NumberedRows, raised: OperatorRaised) -> OperatorError:
        """What user code raised in an item, naming the operator and the record; a
        ``process_batch`` that raised names the item's rows."""
        name = type(raised.op).__name__
        if raised.row is not None:
            return OperatorError(f"operator {name}", self.addr.stage, self.addr.partition,
                                 rows.row_sn(raised.row), describe(raised.error))
        return OperatorError(f"operator {name} (on a batch of {len(rows)} records, "
                             f"{rows.first_sn()} to {rows.last_sn()})", self.addr.stage,
                             self.addr.partition, rows.first_sn(), describe(raised.error))

    def _put(self, item: SN, out: NumberedRows) -> None:
        """Route an item's outputs and buffer one sub-item per consumer partition that
        gets rows (DESIGN 11: an empty one is never sent, the bound covers it)."""
        sn = item + (self.addr.partition,)
        put = self.fprod.out.put
        count = len(self.fprod.out.buffers)
        try:  # the user's key and columns only: a fault of the buffers is not theirs
            # the last stage (everything to the egress), or one partition: no key asked
            out, routes = routed(self.router, out, count, self.routed)
        except RouteRefused as refused:
            raise OperatorError(refused.what, self.addr.stage, self.addr.partition,
                                out.row_sn(refused.row),
                                describe(refused.error)) from refused.error
        if routes is None:
            put(0, sn, out)
            return
        for i, sub in enumerate(out.split(routes, count)):
            if sub is not None:
                put(i, sn, sub)

    def flushable(self):
        if self.mode not in (PROCESSING, STREAMING, DRAINING):
            return []
        return self.fprod.out.flushable(self.output_bound())

    def flush(self, i: int, d: int) -> List:
        self._next(Event.FLUSH)
        send = self.fprod.out.flush(i, d, self.output_bound())
        return [send] if send else []

    def keeps_up(self, i: int, d: int) -> bool:
        return self.fprod.out.keeps_up(i, d)

    def output_bound(self) -> SN:
        """A bound on every connection SN this segment will still send: an item not yet
        processed gets its own SN and this partition (DESIGN 4.3, 11)."""
        return item_bound(self.fcons.frontier())

    def credits_due(self) -> bool:
        """Back-pressure: we took inputs our data sources may now replace."""
        return self.mode in (PROCESSING, STREAMING, DRAINING) and self.fcons.credits_due()

    def send_credits(self) -> List:
        self._next(Event.FLUSH)
        return self.fcons.credits()
