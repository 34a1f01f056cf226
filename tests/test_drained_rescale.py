"""A drained rescale's driver side (DESIGN 13, docs/design/rescaling.md): the source read
up to what the sinks hold and no further, one cut after the last input read, cut again at
the same place when its checkpoint does not complete, given up after a few tries, and no
restart back past the rescale's checkpoint. The Spark test of the whole is in
test_rescale_spark.py."""
import pytest

from flux.connector_api import BY_POSITION
from flux.errors import CheckpointMismatch
from flux.runtime.ingress_feed import IngressFeed
from flux.runtime.ingress_process import ACCEPTED, CUT, RECORDS
from flux.runtime.metrics import Metrics
from flux.spark.driver_checkpoints import DriverCheckpoints
from flux.spark.job_rescale import RECUT_AFTER, RECUTS, drained_cut
from flux.spark.options import Checkpointing
from flux.testing.dataflows import regrouping_dataflow
from test_ingress_feed import Pipe, Placed

pytestmark = pytest.mark.timeout(60)


def fed(feed: IngressFeed, pipe: Pipe, steps: int, cuts=None) -> None:
    """``steps`` steps of the source's thread, the ingress accepting all it was handed."""
    for _ in range(steps):
        feed.step(0)
        pipe.inbox.append((ACCEPTED, feed.handed))
        if cuts is not None:
            cuts.maybe_cut(feed)


def cut_points(pipe: Pipe) -> list:
    """(checkpoint, inputs handed before its cut) for every cut sent, in order."""
    out, handed = [], 0
    for msg in pipe.sent:
        if msg[0] == RECORDS:
            handed += sum(len(run) for run in msg[1])
        elif msg[0] == CUT:
            out.append((msg[1], handed))
    return out


def test_a_held_feed_reads_up_to_its_input_and_no_further():
    pipe = Pipe()
    feed = IngressFeed(pipe, Placed(range(100)), Metrics(), window=10)
    feed.hold_from = 25
    fed(feed, pipe, 20)
    assert pipe.records() == list(range(30))  # read in tens: the first read past 25
    assert feed.drained()
    feed.hold_from = None
    fed(feed, pipe, 2)
    assert pipe.records() == list(range(50)) and not feed.drained()
    fed(feed, pipe, 10)
    assert pipe.records() == list(range(100)) and feed.drained()  # the source ended


def driver_checkpoints(tmp_path) -> DriverCheckpoints:
    """Of a job of 4 pairs with a sink each, its source opened (no cut for an hour)."""
    checkpoints = DriverCheckpoints(Checkpointing(location=str(tmp_path), interval=3600.0),
                                    regrouping_dataflow(2), 4, Placed(range(100)),
                                    BY_POSITION, [], sinks=4)
    checkpoints.open_source([])
    return checkpoints


def test_a_drain_cuts_once_past_what_the_sinks_hold_and_again_at_the_same_place(tmp_path):
    checkpoints = driver_checkpoints(tmp_path)
    pipe = Pipe()
    feed = IngressFeed(pipe, checkpoints.source, Metrics(), window=10)
    fed(feed, pipe, 2, checkpoints)  # running: 20 handed over, no cut
    assert cut_points(pipe) == []
    checkpoints.drain(holds=35)  # a sink holds an output of input 35 (a restart's replay)
    fed(feed, pipe, 10, checkpoints)
    assert cut_points(pipe) == [(1, 40)] and checkpoints.wanted_cut == 1
    assert pipe.records() == list(range(40))  # held: nothing past the cut
    checkpoints.cut_now()  # its checkpoint did not complete: the same place again
    fed(feed, pipe, 10, checkpoints)
    assert cut_points(pipe) == [(1, 40), (2, 40)] and checkpoints.wanted_cut == 2
    checkpoints.end_drain()  # given up: read on, cut as before
    fed(feed, pipe, 10, checkpoints)
    assert pipe.records() == list(range(100))


def test_a_drain_behind_the_feed_stops_it_where_it_is(tmp_path):
    checkpoints = driver_checkpoints(tmp_path)
    pipe = Pipe()
    feed = IngressFeed(pipe, checkpoints.source, Metrics(), window=10)
    fed(feed, pipe, 5, checkpoints)
    checkpoints.drain(holds=12)  # the sinks lag the feed, as they do while it runs
    fed(feed, pipe, 5, checkpoints)  # (the source's thread reads once more before it
    assert cut_points(pipe) == [(1, 60)] and pipe.records() == list(range(60))  # hears)


def test_no_restart_after_a_drained_rescale_goes_back_past_its_checkpoint(tmp_path):
    checkpoints = driver_checkpoints(tmp_path)
    checkpoints.drained_restart(5)  # the store has no checkpoint 5 (it did not verify)
    with pytest.raises(CheckpointMismatch, match="checkpoint 5 of .*, the one a drained "
                       "rescale restarted from, does not verify"):
        checkpoints.restart(None)


def test_a_driver_run_again_keeps_the_floor_of_the_one_that_died(tmp_path):
    """The floor is kept in the store: a driver run again after the first died (the
    sinks hold what they held) refuses an older checkpoint too, at once."""
    driver_checkpoints(tmp_path).drained_restart(5)
    with pytest.raises(CheckpointMismatch, match="checkpoint 5 of .*, the one a drained "
                       "rescale restarted from, does not verify"):
        driver_checkpoints(tmp_path)


def test_a_damaged_floor_is_not_taken_for_none(tmp_path):
    """Which checkpoints are safe to restore is not known: the start stops, naming it."""
    from flux.errors import CheckpointCorrupt
    from flux.runtime.checkpoint_store import FLOOR, CheckpointStore

    store = CheckpointStore(str(tmp_path))
    store.raise_floor(7, "why")
    assert store.floor() == (7, "why")
    data = (tmp_path / FLOOR).read_bytes()
    (tmp_path / FLOOR).write_bytes(data.replace(b"7", b"3"))
    with pytest.raises(CheckpointCorrupt, match="FLOOR.json"):
        driver_checkpoints(tmp_path)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Checkpoints:
    """``DriverCheckpoints`` as ``drained_cut`` sees it: a cut taken at the first ask,
    complete once ``completes_at`` cuts were asked (never: 0)."""

    def __init__(self, completes_at: int):
        self.completes_at, self.asked, self.drained_to, self.ended = completes_at, 0, None, 0
        self.wanted_cut = None

    def drain(self, holds):
        self.drained_to = holds
        self.cut_now()

    def cut_now(self):
        self.asked += 1
        self.wanted_cut = 10 + self.asked

    def wanted_complete(self):
        return self.wanted_cut if self.asked == self.completes_at else None

    def end_drain(self):
        self.ended += 1


def test_a_drained_cut_is_cut_again_then_given_up():
    clock = Clock()
    assert drained_cut(Checkpoints(completes_at=1), 7, 600, clock, clock.sleep) == 11
    clock = Clock()
    stuck = Checkpoints(completes_at=3)  # the first two never complete
    assert drained_cut(stuck, 7, 600, clock, clock.sleep) == 13
    assert stuck.drained_to == 7 and stuck.ended == 0  # held until the restart
    assert 2 * RECUT_AFTER < clock.now < 2 * RECUT_AFTER + 1
    clock = Clock()
    never = Checkpoints(completes_at=0)
    with pytest.raises(TimeoutError, match=f"{RECUTS + 1} cuts.*goes on at its count"):
        drained_cut(never, 7, 600, clock, clock.sleep)
    assert never.asked == RECUTS + 1 and never.ended == 1  # the source is read on



def test_a_split_job_drains_at_an_epoch_past_the_sinks_and_holds_every_pair_there(tmp_path):
    """With splits read on the executors the drain's cut is an epoch's end at or past
    the SN a sink holds; every node hears ``HoldInputs`` for that epoch first (and again
    while it drains), a cut again is at a later epoch, and a drain given up releases
    the hold."""
    from flux.connectors.split_sources import ListSplits
    from flux.control_messages import CutAtEpoch, HoldInputs
    from flux.sequence import epoch_first
    from flux.spark.split_checkpoints import SplitCheckpoints, epoch_to_cut

    checkpoints = SplitCheckpoints(Checkpointing(location=str(tmp_path), interval=3600.0),
                                   regrouping_dataflow(2), 4, ListSplits([[1, 2], [3]]), 2,
                                   0.1, [], sinks=4, key_groups=256)
    told = []
    checkpoints.maybe_cut_at_epoch(10, told.append, done=False)  # the first cut
    checkpoints.maybe_cut_at_epoch(10, told.append, done=False)
    assert told == [CutAtEpoch(1, epoch_to_cut(10, 0.1))]  # the next an hour on
    told.clear()
    ahead = epoch_to_cut(10, 0.1)
    checkpoints.drain(holds=epoch_first(ahead + 3, 1, 2) + 5)  # a sink holds epoch ahead+3
    checkpoints.maybe_cut_at_epoch(10, told.append, done=False)
    assert told == [HoldInputs(ahead + 3), CutAtEpoch(2, ahead + 3)]
    assert checkpoints.wanted_cut == 2
    checkpoints.maybe_cut_at_epoch(11, told.append, done=False)
    assert told[2:] == []  # held, cut: nothing more until the hold is told again
    checkpoints.cut_now()  # its checkpoint did not complete: again, later
    checkpoints.maybe_cut_at_epoch(40, told.append, done=False)
    assert told[2:] == [CutAtEpoch(3, epoch_to_cut(40, 0.1))]
    checkpoints.end_drain()
    checkpoints.maybe_cut_at_epoch(41, told.append, done=False)
    assert told[-1] == HoldInputs(None)


def test_a_drained_rescales_cut_carries_no_move_of_the_last_stage(tmp_path):
    """The drain's restart regroups every stage at the new count; a move of the last
    stage at its cut would hold its partitions' outputs past it, where a drain reads no
    input (modelled: ``tests/test_sim_moves.py``). It waits for a later cut."""
    from flux.spark.live_moves import MoveAsked

    checkpoints = driver_checkpoints(tmp_path)
    checkpoints.moves.ask(MoveAsked(2, 0, 9, 3))
    prepares, _ = checkpoints.moves_cut(1, 10)
    assert [m.prepare for m in prepares] == [True]  # the bulk first
    checkpoints.moves.staged(1)
    checkpoints.drain(holds=35)
    assert checkpoints.moves_cut(2, 40)[0] == []
    checkpoints.end_drain()
    moves, _ = checkpoints.moves_cut(3, 50)
    assert [(m.stage, m.first, m.last, m.dest, m.prepare) for m in moves] == \
        [(2, 0, 9, 3, False)]
