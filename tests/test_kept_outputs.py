"""The outputs a job keeps: every output back, in order and as it was kept, whatever is
read while the egress appends; and no container per output for the collector to walk."""
import gc
import threading

import pytest

from flux.runtime.kept_outputs import KeptOutputs

pytestmark = pytest.mark.timeout(60)


def outputs(n, start=0):
    return [((i, 0), [f"k{i % 7}", i, float(i), {"x": [i]}]) for i in range(start, start + n)]


def test_every_output_comes_back_in_order_and_as_it_was_kept():
    kept, want = KeptOutputs(chunk=100), outputs(1050)
    for i in range(0, 1050, 70):
        kept.extend(want[i:i + 70])
    assert len(kept) == 1050
    assert list(kept) == want and kept == want and want == list(kept)
    assert kept[0] == want[0] and kept[99] == want[99] and kept[100] == want[100]
    assert kept[-1] == want[-1] and kept[1049] == want[1049]
    assert kept[95:205:3] == want[95:205:3]
    assert kept[-3:] == want[-3:]
    assert isinstance(kept[5][0], tuple) and isinstance(kept[5][1], list)
    assert kept != want[:-1] and kept != want[:-1] + [((9, 9), [])]


def test_out_of_range_and_bad_index_are_refused():
    kept = KeptOutputs(chunk=2)
    kept.extend(outputs(3))
    with pytest.raises(IndexError):
        kept[3]
    with pytest.raises(IndexError):
        kept[-4]
    with pytest.raises(TypeError, match="int or slice"):
        kept["a"]
    assert KeptOutputs() == [] and not KeptOutputs()


def test_kept_outputs_are_not_containers_the_collector_walks():
    kept = KeptOutputs(chunk=1000)
    before = len(gc.get_objects())
    kept.extend(outputs(50_000))
    gc.collect()
    # 50K outputs as objects would be 200K+ tracked containers; the chunks are bytes
    assert len(gc.get_objects()) - before < 5_000


def test_a_reader_never_sees_an_output_twice_or_out_of_order_while_chunks_are_packed():
    kept, want = KeptOutputs(chunk=64), outputs(20_000)
    done = threading.Event()
    seen_bad = []

    def write():
        for i in range(0, len(want), 37):
            kept.extend(want[i:i + 37])
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not done.is_set():
        got = list(kept)
        if got != want[:len(got)]:
            seen_bad.append(len(got))
        n = len(kept)
        if n and kept[n - 1] != want[n - 1]:
            seen_bad.append(n)
    writer.join()
    assert not seen_bad and list(kept) == want
