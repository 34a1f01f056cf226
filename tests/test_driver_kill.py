"""The driver dies (SIGKILL) and the same program is run again with the same checkpoint
location: it resumes from the last complete checkpoint, and the sink's committed content
is the failure-free output, no gap, no duplicate (issue 14; slow: Spark in a process of
its own, one at a time)."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from restart_inputs import write_inputs

from experiments.resumable_job import read_sink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent


class Program:
    """``experiments.resumable_job`` in a process group of its own (its JVMs included),
    its JSON lines read by a thread."""

    def __init__(self, args, log: Path):
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.resumable_job", *args], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        self.lines: "queue.Queue[dict]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def next_line(self, timeout: float) -> dict:
        return self.lines.get(timeout=timeout)

    def wait_for(self, predicate, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(max(0.1, deadline - time.monotonic()))
            if predicate(line):
                return line

    def kill(self) -> None:
        """SIGKILL the driver, then everything it started (its process group)."""
        for how in (lambda: os.kill(self.proc.pid, signal.SIGKILL),
                    lambda: os.killpg(self.proc.pid, signal.SIGKILL)):
            try:
                how()
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.mark.parametrize("fmt", ["jsonl", "delta"])
def test_a_killed_driver_run_again_resumes_from_its_checkpoint(tmp_path, fmt):
    expected = write_inputs(tmp_path / "in", 30_000)
    args = ["--input", str(tmp_path / "in"), "--sink", str(tmp_path / "out"),
            "--sink-format", fmt, "--checkpoint", str(tmp_path / "ckpt"), "--interval", "1",
            "--rate", "3000"]
    first = Program(args, tmp_path / "first.log")
    try:
        started = first.wait_for(lambda x: x["kind"] == "started", 180)
        assert started["checkpoint"] is None  # a new location: from the first input
        first.wait_for(lambda x: x["kind"] == "progress" and (x["checkpoint"] or 0) >= 3, 120)
    finally:
        first.kill()
    partial = read_sink(fmt, str(tmp_path / "out"))
    assert 0 < len(partial) < len(expected) and partial == expected[:len(partial)]

    second = Program(args, tmp_path / "second.log")
    try:
        started = second.wait_for(lambda x: x["kind"] == "started", 180)
        done = second.wait_for(lambda x: x["kind"] == "done", 300)
    finally:
        second.kill()
    assert started["checkpoint"] is not None and started["checkpoint"] >= 3
    assert started["cut"] > 0
    assert done["restarts"] == 0
    assert read_sink(fmt, str(tmp_path / "out")) == expected
