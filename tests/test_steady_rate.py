"""experiments.steady_rate's bisection (its probes need Spark: run by hand)."""
from __future__ import annotations

import pytest

from experiments.steady_rate import Bisection, parse_args

pytestmark = pytest.mark.timeout(30)


def test_the_bisection_closes_in_on_the_highest_steady_rate():
    search, limit = Bisection(1000, 9000), 6200
    for _ in range(8):
        rate = search.next_rate()
        search.took(rate, {"steady": rate <= limit})
    assert search.best is not None and 5900 <= search.best <= limit and not search.done


def test_a_search_whose_lowest_rate_is_unsteady_stops():
    search = Bisection(1000, 9000)
    search.took(search.next_rate(), {"steady": False})
    assert search.done and search.best is None


def test_delays_must_be_positive():
    assert parse_args(["--item-delays", "0.005,0.02"]).delays == [0.005, 0.02]
    with pytest.raises(SystemExit):
        parse_args(["--item-delays", "0,0.02"])
