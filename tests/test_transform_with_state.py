"""A per-key handler with state on Arrow batches, in the style of PySpark 4's
transformWithStateInPandas: the output equals the failure-free reference (one row at a
time) through a kill, whatever the batches; its state catches up in parts and survives
msgpack; a handler that breaks the rules is named."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flux import StatefulProcessor, TransformWithStateInPandas
from flux.dataflow import Dataflow, Stage
from flux.deploy_checks import check_batch_api, check_state_round_trip
from flux.errors import DataflowError
from flux.operator import OperatorChain, wire_form
from flux.reference import reference_output
from thread_runs import assert_exact_and_caught_up_in_parts, run

pytestmark = pytest.mark.timeout(120)

PAYMENTS = pa.schema([("account", pa.int64()), ("amount", pa.int64())])
ALERTS = pa.schema([("account", pa.int64()), ("amount", pa.int64()),
                    ("average", pa.float64()), ("recent", pa.int64())])


class LargePayments(StatefulProcessor):
    """Per account: the count and sum of its payments, its last three amounts and how
    often each amount was seen; a payment over twice the account's average is an alert."""

    def init(self, handle):
        self.totals = handle.getValueState("totals")
        self.recent = handle.getListState("recent")
        self.seen = handle.getMapState("seen")

    def handleInputRows(self, key, rows, timerValues):
        count, total = self.totals.get() or (0, 0)
        alerts = []
        for frame in rows:
            for amount in frame["amount"]:
                if count and amount > 2 * total / count:
                    alerts.append((key[0], amount, total / count, len(list(self.recent.get()))))
                count, total = count + 1, total + amount
                self.recent.put((list(self.recent.get()) + [(amount,)])[-3:])
                times = self.seen.getValue((amount,)) or (0,)
                self.seen.updateValue((amount,), (times[0] + 1,))
        self.totals.update((count, total))
        yield pd.DataFrame(alerts, columns=ALERTS.names)


class RunningCounts(StatefulProcessor):
    """Per key a running count, vectorized over the key's rows: one output per row,
    its index the row's (correct for calls='per key')."""

    def init(self, handle):
        self.count = handle.getValueState("count")

    def handleInputRows(self, key, rows, timerValues):
        (count,) = self.count.get() or (0,)
        for frame in rows:
            counts = count + np.arange(1, len(frame) + 1)
            count = int(counts[-1])
            yield pd.DataFrame({"account": key[0], "count": counts}, index=frame.index)
        self.count.update((count,))


class CountPerCall(RunningCounts):
    """Breaks the rule in calls='per key': one output per call, at its last row."""

    def handleInputRows(self, key, rows, timerValues):
        (count,) = self.count.get() or (0,)
        for frame in rows:
            count += len(frame)
            yield pd.DataFrame({"account": [key[0]], "count": [count]},
                               index=frame.index[-1:])
        self.count.update((count,))


COUNTS = pa.schema([("account", pa.int64()), ("count", pa.int64())])


def payments(n, accounts=40, seed=5):
    rng = np.random.default_rng(seed)
    amounts = rng.integers(1, 100, n)
    amounts[rng.random(n) < 0.05] *= 7
    return [(int(a), int(x)) for a, x in zip(rng.integers(0, accounts, n), amounts)]


def large_payments(calls="per row"):
    return Dataflow([Stage("alerts", "account", (lambda: TransformWithStateInPandas(
        LargePayments, "account", ALERTS, calls=calls),), schema=PAYMENTS)])


def running_counts(processor=RunningCounts, calls="per key"):
    return Dataflow([Stage("counts", "account", (lambda: TransformWithStateInPandas(
        processor, "account", COUNTS, calls=calls),), schema=PAYMENTS)])


def test_one_batch_gives_what_its_rows_give_one_at_a_time():
    op = TransformWithStateInPandas(LargePayments, "account", ALERTS)
    one_by_one = TransformWithStateInPandas(LargePayments, "account", ALERTS)
    records = payments(400, accounts=6)
    rows, out = op.process_arrow(pa.RecordBatch.from_pylist(
        [dict(zip(PAYMENTS.names, r)) for r in records], schema=PAYMENTS))
    singles = []
    for i, r in enumerate(records):
        _, single = one_by_one.process_arrow(pa.RecordBatch.from_pylist(
            [dict(zip(PAYMENTS.names, r))], schema=PAYMENTS))
        singles += [(i, row) for row in single.to_pylist()]
    assert len(singles) > 10  # the workload raises alerts
    assert list(zip(rows.tolist(), out.to_pylist())) == singles
    assert op.get_state() == one_by_one.get_state()


@pytest.mark.slow  # ~20 s: a pandas call per row, in both replicas and the reference
def test_a_handler_keeps_its_output_through_a_kill_and_catches_up_in_parts():
    records = payments(8000, accounts=1500)
    cluster, expected = run(large_payments(), records, partitions=2, kill="node1",
                            batch_rows=128)
    assert len(expected) > 100
    assert_exact_and_caught_up_in_parts(cluster, expected)


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_calls_per_key_give_the_output_of_calls_per_row():
    records = payments(1500, accounts=25)
    per_row = reference_output(running_counts(calls="per row"), records, 3)
    assert [wire_form(x) for x in reference_output(running_counts(), records, 3)] == \
        [wire_form(x) for x in per_row]
    cluster, expected = run(running_counts(), records, partitions=3, batch_rows=300)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in per_row]


def test_the_state_round_trips_and_the_deploy_checks_pass():
    records = payments(300, accounts=7)
    check_state_round_trip(large_payments(), records, 2)
    check_batch_api(large_payments(), records)
    check_batch_api(running_counts(), records)


def test_a_per_key_handler_that_counts_per_call_is_refused_at_deploy():
    with pytest.raises(DataflowError, match=r"stage 'counts' operator 0 .*a batch gives"):
        check_batch_api(running_counts(CountPerCall), payments(300, accounts=7))


def test_a_per_key_output_that_names_no_row_of_its_call_is_refused():
    class LosesTheIndex(RunningCounts):
        def handleInputRows(self, key, rows, timerValues):
            for frame in super().handleInputRows(key, rows, timerValues):
                yield frame.reset_index(drop=True)

    op = TransformWithStateInPandas(LosesTheIndex, "account", COUNTS, calls="per key")
    batch = pa.RecordBatch.from_pylist([{"account": 1, "amount": 2},
                                        {"account": 2, "amount": 3}], schema=PAYMENTS)
    with pytest.raises(ValueError, match=r"index names the input row.*calls='per row'"):
        op.process_arrow(batch)


def test_a_stage_that_routes_by_other_columns_is_refused():
    with pytest.raises(DataflowError, match=r"groups rows by \['account'\], and the stage "
                                            r"routes them by 'amount'"):
        Dataflow([Stage("alerts", "amount", (lambda: TransformWithStateInPandas(
            LargePayments, "account", ALERTS),), schema=PAYMENTS)])


@pytest.mark.parametrize("declare, message", [
    (lambda h: h.getValueState("v", ttlDurationMs=1000), "TTL is not supported yet"),
    (lambda h: h.registerTimer(5), "timers need time_mode=.EventTime."),
    (lambda h: [h.getValueState("v"), h.getListState("v")], "declared twice"),
    (lambda h: None, "declared no state"),
])
def test_what_is_not_built_or_wrong_in_init_is_named(declare, message):
    class Declares(StatefulProcessor):
        def init(self, handle):
            declare(handle)

    with pytest.raises((NotImplementedError, ValueError), match=message):
        TransformWithStateInPandas(Declares, "account", COUNTS)


def test_a_value_that_is_not_a_row_is_named():
    class Scalar(RunningCounts):
        def handleInputRows(self, key, rows, timerValues):
            self.count.update(3)
            return iter(())

    op = TransformWithStateInPandas(Scalar, "account", COUNTS)
    with pytest.raises(TypeError, match=r"ValueState.update takes a row .*got int"):
        op.process_arrow(pa.RecordBatch.from_pylist([{"account": 1, "amount": 2}],
                                                    schema=PAYMENTS))


def test_the_store_is_offered_to_the_catch_up():
    assert OperatorChain([TransformWithStateInPandas(LargePayments, "account", ALERTS)]
                         ).keyed_stores()[0] is not None


# -- event time: the watermark per row, timers ----------------------------------------

CLICKS = pa.schema([("user", pa.int64()), ("ts", pa.int64())])
SESSIONS = pa.schema([("user", pa.int64()), ("clicks", pa.int64()), ("start", pa.int64()),
                      ("end", pa.int64()), ("watermark", pa.int64())])
GAP = 1_000


class Sessions(StatefulProcessor):
    """A user's session ends GAP ms of event time after its last click: a timer,
    moved at every click; when it fires the session is emitted and forgotten."""

    def init(self, handle):
        self.handle = handle
        self.session = handle.getValueState("session")  # (clicks, start, last)

    def handleInputRows(self, key, rows, timerValues):
        for frame in rows:
            for ts in frame["ts"]:
                clicks, start, last = self.session.get() or (0, ts, ts)
                if clicks:
                    self.handle.deleteTimer(last + GAP)
                self.session.update((clicks + 1, start, max(last, ts)))
                self.handle.registerTimer(max(last, ts) + GAP)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        clicks, start, last = self.session.get()
        assert expiredTimerInfo.getExpiryTimeInMs() == last + GAP
        assert list(self.handle.listTimers()) == []
        self.session.clear()
        yield pd.DataFrame([(key[0], clicks, start, last,
                             timerValues.getCurrentWatermarkInMs())], columns=SESSIONS.names)


def sessions_op(delay=200):
    return TransformWithStateInPandas(Sessions, "user", SESSIONS, time_mode="EventTime",
                                      event_time="ts", watermark_delay_ms=delay)


def clicks(n, users=30, seed=2):
    """Clicks in roughly increasing event time, some out of order by up to 300 ms."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.integers(0, 40, n)) + rng.integers(-300, 1, n)
    return [(int(u), int(t)) for u, t in zip(rng.integers(0, users, n), ts)]


def batch_of(records, schema=CLICKS):
    return pa.RecordBatch.from_pylist([dict(zip(schema.names, r)) for r in records],
                                      schema=schema)


def outputs_in_batches(op, records, sizes):
    out, start = [], 0
    for size in sizes:
        part = records[start:start + size]
        if part:
            rows, batch = op.process_arrow(batch_of(part))
            out += [(start + r, row) for r, row in zip(rows.tolist(), batch.to_pylist())]
        start += size
    return out


def test_timers_fire_at_the_same_row_whatever_the_batches():
    records = clicks(3000)
    whole = outputs_in_batches(sessions_op(), records, [len(records)])
    assert len(whole) > 100  # sessions end all along
    rng = np.random.default_rng(7)
    uneven = outputs_in_batches(sessions_op(), records, rng.integers(1, 200, 200).tolist())
    assert uneven == whole
    ends = [row["end"] for _, row in whole]
    assert all(row["watermark"] >= row["end"] + GAP for _, row in whole), ends[:5]


def test_a_state_that_moved_fires_the_timers_its_twin_fires():
    """The timer index is rebuilt from a state installed after msgpack (a catch-up, a
    restore): both replicas go on giving the same outputs."""
    records = clicks(2000)
    twin, moved = sessions_op(), sessions_op()
    first = outputs_in_batches(twin, records[:1000], [1000])
    assert first == outputs_in_batches(sessions_op(), records[:1000], [1000])
    moved.install_state(wire_form(twin.get_state()))
    assert outputs_in_batches(moved, records[1000:], [300, 700]) == \
        outputs_in_batches(twin, records[1000:], [1000])


def test_a_late_row_is_dropped_and_the_watermark_is_handed_over():
    seen = []

    class Watches(Sessions):
        def handleInputRows(self, key, rows, timerValues):
            seen.append((key[0], timerValues.getCurrentWatermarkInMs()))
            return super().handleInputRows(key, rows, timerValues)

    op = TransformWithStateInPandas(Watches, "user", SESSIONS, time_mode="EventTime",
                                    event_time="ts", watermark_delay_ms=100)
    op.process_arrow(batch_of([(1, 1000), (2, 1500), (3, 1300), (4, 1450)]))
    assert seen == [(1, -1), (2, 900), (4, 1400)]  # user 3's click is older than 1400


def test_an_event_time_of_timestamps_is_taken_in_ms():
    class OnTimestamps(Sessions):
        def handleInputRows(self, key, rows, timerValues):
            in_ms = (frame.assign(ts=frame.ts.astype("int64") // 1000) for frame in rows)
            return super().handleInputRows(key, in_ms, timerValues)

    schema = pa.schema([("user", pa.int64()), ("ts", pa.timestamp("us"))])
    op = TransformWithStateInPandas(OnTimestamps, "user", SESSIONS, time_mode="EventTime",
                                    event_time="ts")
    batch = pa.RecordBatch.from_pylist([{"user": 1, "ts": 1_000_000}, {"user": 2, "ts": 3_000_000}],
                                       schema=schema)
    rows, out = op.process_arrow(batch)
    assert out.to_pylist() == [{"user": 1, "clicks": 1, "start": 1000, "end": 1000,
                                "watermark": 3000}]


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_sessions_end_exactly_through_a_kill():
    records = clicks(4000, users=200)
    dataflow = Dataflow([Stage("sessions", "user", (sessions_op,), schema=CLICKS)])
    cluster, expected = run(dataflow, records, partitions=2, kill="node1", batch_rows=64)
    assert not cluster.errors and not cluster.controller.error
    assert len(expected) > 50
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


@pytest.mark.parametrize("make, error, message", [
    (lambda: TransformWithStateInPandas(Sessions, "user", SESSIONS, time_mode="EventTime"),
     ValueError, "needs event_time="),
    (lambda: TransformWithStateInPandas(Sessions, "user", SESSIONS, time_mode="EventTime",
                                        event_time="ts", calls="per key"),
     ValueError, "calls the handler per row"),
    (lambda: TransformWithStateInPandas(Sessions, "user", SESSIONS, time_mode="ProcessingTime"),
     NotImplementedError, "processing time is a clock"),
    (lambda: TransformWithStateInPandas(Sessions, "user", SESSIONS).process_arrow(
        batch_of([(1, 5)])), NotImplementedError, "timers need time_mode='EventTime'"),
])
def test_timers_without_event_time_are_refused_with_the_reason(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_a_stage_without_the_event_time_column_is_refused():
    with pytest.raises(DataflowError, match=r"columns \['ts'\] are not in the stage's schema"):
        Dataflow([Stage("s", "user", (sessions_op,), schema=pa.schema([("user", pa.int64())]))])


@pytest.mark.filterwarnings("error::FutureWarning")  # none escapes to a user's log
def test_rows_with_a_null_key_share_one_state():
    op = TransformWithStateInPandas(RunningCounts, "account", COUNTS)
    batch = pa.RecordBatch.from_pylist([{"account": None, "amount": 1}, {"account": 3, "amount": 1},
                                        {"account": None, "amount": 2}], schema=PAYMENTS)
    rows, out = op.process_arrow(batch)
    assert out.to_pylist() == [{"account": None, "count": 1}, {"account": 3, "count": 1},
                               {"account": None, "count": 2}]
    _, again = op.process_arrow(batch.slice(0, 1))
    assert again.to_pylist() == [{"account": None, "count": 3}]
