"""The autoscaling policy (``controller.autoscale``): how many pairs the input rate
needs, when it grows and when it shrinks; what a job refuses. The whole path runs on
Spark in ``test_autoscale_spark.py``."""
from __future__ import annotations

import pytest

from controller.autoscale import Autoscale, AutoscaleDecision, AutoscalePolicy
from flux.connectors.sources import Paced
from flux.spark.job_growth import check_dormant
from flux.spark.options import JobOptions

pytestmark = pytest.mark.timeout(30)


def _policy(**kw) -> AutoscalePolicy:
    settings = Autoscale(**dict(dict(rate_per_pair=1000, every=10, down_looks=2), **kw))
    return AutoscalePolicy(settings, *settings.bounds(2, 6))


def test_it_grows_at_once_to_the_pairs_the_rate_needs_within_max_nodes():
    policy = _policy()
    assert policy.observe(0, 0, 2) is None  # the first look only starts the window
    assert policy.observe(5, 20_000, 2) is None  # not ``every`` seconds yet
    assert policy.observe(10, 35_000, 2) == AutoscaleDecision(2, 4, 3500.0)
    policy.restart_look()
    assert policy.observe(20, 35_000, 4) is None
    assert policy.observe(30, 135_000, 4) == AutoscaleDecision(4, 6, 10_000.0)  # max_nodes


def test_it_shrinks_only_after_down_looks_in_a_row_to_the_most_they_wanted():
    policy = _policy(down_looks=3)
    policy.observe(0, 0, 6)
    assert policy.observe(10, 25_000, 6) is None  # wants 3
    assert policy.observe(20, 30_000, 6) is None  # wants 2 (the least: min_pairs)
    assert policy.observe(30, 70_000, 6) == AutoscaleDecision(6, 4, 4000.0)  # wants 4
    steady = _policy()
    steady.observe(0, 0, 4)
    assert steady.observe(10, 25_000, 4) is None  # wants 3
    assert steady.observe(20, 65_000, 4) is None  # wants 4: the run of fewer ends
    assert steady.observe(30, 90_000, 4) is None  # wants 3: one look only


def test_a_restarted_counter_starts_the_window_again():
    policy = _policy()
    policy.observe(0, 50_000, 2)
    assert policy.observe(10, 100, 2) is None  # the job restarted: its counter too
    assert policy.observe(20, 40_100, 2) == AutoscaleDecision(2, 4, 4000.0)


@pytest.mark.parametrize("kw, why", [
    (dict(rate_per_pair=0), "rate_per_pair must be > 0"),
    (dict(rate_per_pair=10, min_pairs=0), "min_pairs must be an int >= 1"),
    (dict(rate_per_pair=10, every=0), "every must be > 0"),
    (dict(rate_per_pair=10, down_looks=0), "down_looks must be an int >= 1"),
])
def test_settings_out_of_range_are_refused_naming_them(kw, why):
    with pytest.raises(ValueError, match=why):
        Autoscale(**kw)


def test_a_job_without_room_to_start_pairs_refuses_autoscale():
    options = JobOptions.from_kwargs(nodes=4, standbys=2, checkpoint="/tmp/x",
                                     autoscale=Autoscale(rate_per_pair=10))
    with pytest.raises(ValueError, match="autoscale needs max_nodes above nodes=4"):
        check_dormant(options, 0)
    with pytest.raises(ValueError, match="min_pairs=7 above max_nodes=6"):
        check_dormant(JobOptions.from_kwargs(
            nodes=4, max_nodes=6, standbys=2, checkpoint="/tmp/x",
            autoscale=Autoscale(rate_per_pair=10, min_pairs=7)), 0)
    check_dormant(JobOptions.from_kwargs(nodes=4, max_nodes=6, standbys=2, checkpoint="/tmp/x",
                                         autoscale=Autoscale(rate_per_pair=10)), 0)
    with pytest.raises(TypeError, match="autoscale must be a flux.Autoscale"):
        JobOptions.from_kwargs(nodes=4, autoscale=10)


def test_a_paced_feed_changes_its_rate_at_the_records_it_is_told():
    now = [0.0]
    feed = Paced(list(range(10)), 10, clock=lambda: now[0], then=((4, 2.0),))
    got = []
    while len(got) < 6:
        record = next(feed)
        if isinstance(record, int):
            got.append((record, round(now[0], 2)))
        else:
            now[0] += feed.due_in()
    assert got == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.9)]
    with pytest.raises(ValueError, match="increasing records"):
        Paced([1], 10, then=((5, 1.0), (2, 1.0)))
