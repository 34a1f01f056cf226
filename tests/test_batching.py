import pytest

from exchange.batching import BatchPolicy


def test_a_full_batch_is_due_at_once():
    policy = BatchPolicy(max_items=3, max_delay=1.0)
    assert not policy.due(2, oldest_at=10.0, now=10.0)
    assert policy.due(3, oldest_at=10.0, now=10.0)


def test_a_partial_batch_is_due_after_the_delay():
    policy = BatchPolicy(max_items=100, max_delay=0.5)
    assert not policy.due(1, oldest_at=10.0, now=10.49)
    assert policy.due(1, oldest_at=10.0, now=10.5)
    assert policy.deadline(10.0) == 10.5


def test_nothing_pending_is_never_due():
    policy = BatchPolicy(max_items=1, max_delay=0.0)
    assert not policy.due(0, oldest_at=None, now=99.0)
    assert policy.deadline(None) is None


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_items=0), "max_items must be a positive int"),
    (dict(max_items=2.5), "max_items must be a positive int"),
    (dict(max_delay=-1), "max_delay must be >= 0"),
    (dict(max_delay=float("nan")), "max_delay must be >= 0"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchPolicy(**kwargs)
