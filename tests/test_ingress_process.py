"""The ingress in a process of its own: started, heard, stopped by its PID, never outliving
the driver that started it, and never leaving its feed's folder behind."""
import gc
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import zmq
from pyspark import cloudpickle

from exchange.group_map import GroupMove
from flux.testing.dataflows import counting_dataflow
from flux.errors import IngressLost
from flux.runtime import ingress_process
from flux.runtime.ingress_process import CUT, END, RECORDS, IngressProcess, FeedSource

pytestmark = pytest.mark.timeout(60)


def spec(dataflow=None) -> dict:
    return dict(dataflow=cloudpickle.dumps(dataflow or counting_dataflow(2)), partitions=2,
                capacity=64, batch_size=8, replication="flux", window=64, batch_rows=16, inc=-1,
                host="127.0.0.1", keys=None, ports=None, flush_delay=0.002,
                item_delay=0.005, pause_room=8, key_groups=256)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped
    except FileNotFoundError:
        return True


@pytest.fixture
def folders(monkeypatch):
    """A temporary directory of this test's own (short: an ipc path has at most 107
    bytes), where every ``IngressProcess`` of the test makes its feed's folder; the
    test asserts that none is left."""
    top = tempfile.mkdtemp(prefix="fit-")
    monkeypatch.setattr(tempfile, "tempdir", top)
    monkeypatch.setenv("TMPDIR", top)  # a driver the test starts as a process
    yield lambda: sorted(os.listdir(top))
    monkeypatch.undo()
    left = os.listdir(top)
    shutil.rmtree(top)
    assert not left, f"left behind: {left}"


def test_the_process_says_where_it_listens_and_stop_ends_it(folders):
    process = IngressProcess(spec())
    try:
        address = process.wait_hello(timeout=30)
        assert address.startswith("tcp://127.0.0.1:")
        assert not gone(process.pid)
        assert folders() == [os.path.basename(process._dir)]
    finally:
        process.stop()
    assert process.exit_code() == 0 and gone(process.pid)
    assert folders() == []


def test_a_start_that_fails_leaves_no_folder(folders, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the process exits at once
    with pytest.raises(IngressLost, match="exited with code 1"):
        IngressProcess(spec())
    assert folders() == []

    def no_process(*args, **kwargs):
        raise OSError("no such program")

    monkeypatch.setattr(ingress_process.subprocess, "Popen", no_process)
    with pytest.raises(OSError, match="no such program"):
        IngressProcess(spec())
    assert folders() == []


def test_a_handle_never_stopped_takes_its_process_and_folder_when_collected(folders):
    process = IngressProcess(spec())
    process.wait_hello(timeout=30)
    pid = process.pid
    del process
    gc.collect()
    assert gone(pid) and folders() == []


def test_a_driver_that_exits_without_stop_leaves_no_process_and_no_folder(folders):
    script = "\n".join([
        "import pickle, sys",
        f"sys.path[:0] = {sys.path!r}",
        "from flux.runtime.ingress_process import IngressProcess",
        f"process = IngressProcess(pickle.loads({pickle.dumps(spec())!r}))",
        "process.wait_hello(30)",
        "print(process.pid, flush=True)"])
    out = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         timeout=60, check=True).stdout
    assert gone(int(out)) and folders() == []


def test_a_killed_process_is_reported_by_the_next_send_which_never_blocks(folders):
    process = IngressProcess(spec())
    try:
        process.wait_hello(timeout=30)
        os.kill(process.pid, signal.SIGKILL)
        process.proc.wait(10)
        with pytest.raises(IngressLost, match=f"pid {process.pid}\\) exited with code -9"):
            for _ in range(10_000):  # a PAIR socket without its peer would block here
                process.send(RECORDS, [list(range(100))])
    finally:
        process.stop()
    assert folders() == []


def test_a_dataflow_the_process_cannot_load_fails_with_its_reason(folders):
    bad = spec()
    bad["dataflow"] = b"not a pickle"
    process = IngressProcess(bad)
    try:
        with pytest.raises(RuntimeError, match="ingress process could not start.*pickle"):
            process.wait_hello(timeout=30)
    finally:
        process.stop()
    assert gone(process.pid) and folders() == []


@pytest.mark.parametrize("child_killed_too", [False, True])
def test_the_process_ends_when_its_driver_is_killed_and_the_folder_goes(folders,
                                                                        child_killed_too):
    """Nothing of the driver runs after a SIGKILL: the process it leaves removes the
    folder of their feed as it ends; if that process was killed too, the next
    ``IngressProcess`` removes it (``flux.runtime.temp_folders``)."""
    script = "\n".join([
        "import pickle, sys, time",
        f"sys.path[:0] = {sys.path!r}",
        "from flux.runtime.ingress_process import IngressProcess",
        f"process = IngressProcess(pickle.loads({pickle.dumps(spec())!r}))",
        "process.wait_hello(30)",
        "print(process.pid, flush=True)",
        "time.sleep(120)"])
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(driver.stdout.readline())
        assert not gone(child)
        if child_killed_too:
            os.kill(child, signal.SIGKILL)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 10
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child), "the ingress process outlived its driver"
        if child_killed_too:
            assert len(folders()) == 1
            IngressProcess(spec()).stop()
        assert folders() == []
    finally:
        driver.stdout.close()
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)


@pytest.fixture
def pipe(zmq_ctx):
    """The driver's end and the ingress process's end of a feed, in this process."""
    ctx = zmq_ctx
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://feed")
    b.connect("inproc://feed")
    yield a, b
    a.close(0)
    b.close(0)


def test_a_cut_is_chosen_when_every_input_before_it_was_taken(pipe):
    a, b = pipe
    source, cuts, taken = FeedSource(b), [], []
    source.on_cut = lambda n, moves: cuts.append((n, list(taken), moves))
    assert source.take(10) == [] and not source.finished  # nothing yet: not the end
    for msg in [(RECORDS, [[1, 2]]), (CUT, 5, [[1, 0, 63, 0, 2]]), (RECORDS, [[3]]), (END,)]:
        a.send(pickle.dumps(msg))
    while run := source.take(10):
        taken += run
    assert taken == [1, 2, 3] and cuts == [(5, [1, 2], (GroupMove(1, 0, 63, 0, 2),))]
    a.send(pickle.dumps((CUT, 6)))  # after the last input: at once
    source.pump()
    assert cuts[1:] == [(6, [1, 2, 3], ())]


def test_runs_taken_stop_before_a_cut_which_waits_for_what_was_put_back(pipe):
    a, b = pipe
    source, cuts = FeedSource(b), []
    source.on_cut = lambda n, moves: cuts.append(n)
    for msg in [(RECORDS, [[1, 2, 3]]), (CUT, 5), (RECORDS, [[4]]), (END,)]:
        a.send(pickle.dumps(msg))
    time.sleep(0.05)
    assert source.take(2) == [1, 2]
    assert source.take(10) == [3] and cuts == []  # a run ends before the cut
    source.put_back([3])  # back-pressure held input 3: the cut waits for it
    assert source.take(10) == [3] and cuts == []
    assert source.take(10) == [4] and cuts == [5]
    assert source.take(10) == [] and source.finished


def test_a_columnar_sources_batches_are_runs_of_their_own(pipe):
    """The driver hands a columnar source's batches over as they are: the ingress takes
    each as one run (at most ``limit`` rows of it at a time), between the records."""
    import pyarrow as pa

    a, b = pipe
    batch = pa.RecordBatch.from_pydict({"x": list(range(10, 17))})
    source = FeedSource(b)
    source.on_cut = lambda n, moves: None
    for msg in [(RECORDS, [[1, 2], batch, [3]]), (END,)]:
        a.send(pickle.dumps(msg))
    time.sleep(0.05)
    assert source.take(5) == [1, 2]
    run = source.take(5)
    assert run.to_pydict() == {"x": [10, 11, 12, 13, 14]}
    source.put_back(run[3:])  # the ingress took three rows
    assert source.take(10).to_pydict() == {"x": [13, 14]}  # what was put back, first
    assert source.take(10).to_pydict() == {"x": [15, 16]}
    assert source.take(10) == [3]
    assert source.take(10) == [] and source.finished
