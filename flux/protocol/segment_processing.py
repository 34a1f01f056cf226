"""A segment's local work (paper 3.1.1, Figure 3 action 1; DESIGN 4.1): inputs released
by the merge through the operators, outputs numbered (the k-th of input ``s`` is
``s + (k,)``), routed and buffered; batches and credits out.

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's).
"""
from __future__ import annotations

from typing import List

from flux.errors import LocalProtocolError, OperatorError
from flux.operator import OperatorRaised, describe
from flux.protocol.segment_mode import DRAINING, PROCESSING, STREAMING, Event


class ProcessingSide:
    """The local work of a segment; mixed into ``Segment``."""

    def can_process(self) -> bool:
        """Figure 3 action 1's guard: running, room in the buffers, an input to release,
        and no checkpoint cut crossed but not yet snapshotted."""
        return (self.mode in (PROCESSING, STREAMING, DRAINING) and not self.fprod.out.full()
                and self.fcons.can_release() and not self.snapshot_due())


    def process(self) -> int:
        """Run the next input through the operators; returns how many outputs it made."""
        self._next(Event.PROCESS)
        if not self.fcons.can_release():
            raise LocalProtocolError(f"{self.addr}: process with no input to release")
        sn, record = self.fcons.release()
        try:
            outputs = self.chain.process(record)
        except Exception as exc:
            raise self._operator_error(sn, exc) from getattr(exc, "error", exc)
        n = self._put(sn, outputs if type(outputs) is list else list(outputs))
        self.taken += 1
        self.emitted += n
        return n

    def process_ready(self, limit: int) -> int:
        """Local work: what ``process`` would do called while ``can_process`` holds, up to
        ``limit`` inputs, in one step: the merge releases the inputs by runs and
        a chain with a ``process_batch`` operator takes them as one batch. Returns how many
        inputs it took. Equal to the loop of ``process`` calls, to the SN: inputs leave
        the merge in the same order, the same buffer-full guard stops them (an input the
        guard would have held goes back to the merge), and with a checkpoint cut pending
        it runs input by input (the cut's guard depends on each input taken)."""
        self._next(Event.PROCESS)
        if self.cuts.pending or self.mode not in (PROCESSING, STREAMING, DRAINING):
            n = 0
            while n < limit and self.can_process():
                self.process()
                n += 1
            return n
        fprod = self.fprod.out
        room = fprod.input_room()
        pairs = self.fcons.release_run(min(limit, room))
        if not pairs:
            return 0
        if self.chain.batched():  # room for one output per buffer and
            return self._process_batch(pairs)  # input: never overfills by more than a batch
        ops = self.chain.operators
        process = ops[0].process if len(ops) == 1 else self.chain.process  # one call less
        put, last = self._put, len(pairs)
        taken = emitted = 0
        for _, (sn, record) in pairs:
            try:
                outputs = process(record)
            except Exception as exc:
                raise self._operator_error(sn, exc) from getattr(exc, "error", exc)
            emitted += put(sn, outputs if type(outputs) is list else list(outputs))
            taken += 1
            # the buffer-full guard of the next input: no buffer can be full before
            # ``room`` tuples went in; an input it holds goes back, as if never released
            if emitted >= room and taken < last and fprod.full():
                break
        self.taken += taken
        self.emitted += emitted
        self.fcons.took(pairs[:taken] if taken < last else pairs)
        if taken < last:
            self.fcons.put_back(pairs[taken:])
        return taken

    def _process_batch(self, pairs: list) -> int:
        first, last = pairs[0][1][0], pairs[-1][1][0]
        try:
            outputs = self.chain.process_many([record for _, (_, record) in pairs])
        except OperatorRaised as raised:
            raise OperatorError(f"operator {type(raised.op).__name__} (in a batch of {len(pairs)} "
                                f"inputs up to SN {last})", self.addr.stage, self.addr.partition,
                                first, describe(raised.error)) from raised.error
        self.fcons.took(pairs)
        self.taken += len(pairs)
        for (_, (sn, _)), outs in zip(pairs, outputs):
            self.emitted += self._put(sn, outs)
        return len(pairs)

    def _operator_error(self, sn, exc: Exception) -> OperatorError:
        """What user code raised on the input ``sn``, naming the operator: OperatorChain
        says which (``OperatorRaised``); a lone operator called straight is that one."""
        if isinstance(exc, OperatorRaised):
            return OperatorError(f"operator {type(exc.op).__name__}", self.addr.stage,
                                 self.addr.partition, sn, describe(exc.error))
        ops = self.chain.operators
        what = f"operator {type(ops[0]).__name__}" if len(ops) == 1 else "the operator chain"
        return OperatorError(what, self.addr.stage, self.addr.partition, sn, describe(exc))

    def _put(self, sn, outputs: list) -> int:
        """Number, route and buffer one input's outputs (DESIGN 4.1: the k-th is sn + (k,));
        returns how many there were."""
        try:
            routes = [self.route(out) for out in outputs]
        except Exception as exc:
            raise OperatorError("the partition key of the next stage", self.addr.stage,
                                self.addr.partition, sn, describe(exc)) from exc
        self.fprod.out.put_outputs(sn, outputs, routes)
        return len(outputs)

    def flushable(self):
        if self.mode not in (PROCESSING, STREAMING, DRAINING):
            return []
        return self.fprod.out.flushable(self.fcons.frontier())

    def flush(self, i: int, d: int) -> List:
        self._next(Event.FLUSH)
        send = self.fprod.out.flush(i, d, self.fcons.frontier())
        return [send] if send else []

    def credits_due(self) -> bool:
        """Back-pressure: we took inputs our data sources may now replace."""
        return self.mode in (PROCESSING, STREAMING, DRAINING) and self.fcons.credits_due()

    def send_credits(self) -> List:
        self._next(Event.FLUSH)
        return self.fcons.credits()
