"""Outputs kept in the driver (``keep_output``) are frozen out of the garbage collector's
way as they pile up: a full collection must not walk millions of them while the
controller's thread, in the same interpreter, waits."""
import gc

import pytest

import flux.spark.output as output
from flux.spark.output import OutputWriter

pytestmark = pytest.mark.timeout(60)


def test_kept_outputs_are_frozen_as_they_pile_up_and_stay_whole(monkeypatch):
    monkeypatch.setattr(output, "FREEZE_EVERY", 1000)
    writer = OutputWriter(None, keep_output=True)
    def made(first, last):  # made as they come: what exists at a freeze is frozen
        return [((i, 0), [f"k{i % 7}", i, {"x": [i]}]) for i in range(first, last)]

    try:
        for i in range(1, 2501, 100):
            writer.deliver(made(i, i + 100))
        tracked = {id(o) for o in gc.get_objects()}
        frozen = [out for out in writer.delivered[:2000] if id(out[1]) not in tracked]
        assert len(frozen) == 2000  # the first two thousand: frozen twice over
        assert any(id(out[1]) in tracked for out in writer.delivered[2000:])
        assert writer.delivered == made(1, 2501)
    finally:
        gc.unfreeze()


def test_outputs_not_kept_freeze_nothing(monkeypatch):
    monkeypatch.setattr(output, "FREEZE_EVERY", 10)
    calls = []
    monkeypatch.setattr(output.gc, "freeze", lambda: calls.append(1))
    writer = OutputWriter(lambda item: None, keep_output=False)
    writer.deliver([((i, 0), i) for i in range(1, 100)])
    assert calls == [] and writer.delivered == []
