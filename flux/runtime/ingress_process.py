"""The ingress in a process of its own (DESIGN 4.7): off the driver's GIL.

The driver's one GIL was shared by the controller, the ingress and the egress,
and the ingress (routing, numbering, packing batches for both replicas of a
pair, taking their acks) held most of it: the controller's liveness and the
data competed, and one driver process capped the job's input rate. Here the
ingress machine runs in a ``HostLoop`` of a fresh interpreter, as the
driver's thread ran it, with sockets and a GIL of its own. The driver keeps
what belongs to the user or the job: the source (perhaps a generator, which
cannot move), the input log, the checkpoint cuts and the metrics
(``flux.runtime.ingress_feed``). It hands the records over in order on a
local pipe (a ZeroMQ PAIR on an ``ipc://`` path in a directory only this
user may enter), at most a window ahead of what the ingress accepted.

Started as ``python -m flux.runtime.ingress_process``, never with
``multiprocessing``: its ``spawn`` imports the user's main module again,
and a script without a ``__main__`` guard would start its job twice.
"""
from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import sys
import time
import traceback
import weakref
from collections import deque
from typing import Any, Deque, List, Optional, Tuple

import zmq

from exchange.group_map import GroupMove
from flux.errors import IngressLost, OperatorError
from flux.runtime import temp_folders

log = logging.getLogger(__name__)

# driver -> ingress process
SPEC, BEGIN, RECORDS, CUT, END, STOP = "spec", "begin", "records", "cut", "end", "stop"
# ingress process -> driver
HELLO, ACCEPTED, STATS, FAILED = "hello", "accepted", "stats", "failed"

#: the feed's folder, in the temporary directory, one per ``IngressProcess``
FOLDER_PREFIX = "flux-ingress-"

#: how often the ingress process reports its counters (and checks that the driver lives)
STATS_EVERY = 0.1


def _pack(*msg) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


class IngressProcess:
    """The driver's handle on the ingress process: start it, talk to it, stop it."""

    def __init__(self, spec: dict):
        """``spec``: what the process builds its ingress and its sockets from (the
        dataflow as cloudpickle bytes, the builder's sizes, incarnation, host, keys, ports,
        flush delay)."""
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.PAIR)
        self._dir = temp_folders.make(FOLDER_PREFIX)  # mode 0700
        started: List[subprocess.Popen] = []  # the process, once there is one
        # whatever happens to this handle (stop, a failed start, never stopped and
        # collected, or the interpreter's exit), the process and the folder go with it
        self._release = weakref.finalize(self, _release, self._dir, self.ctx, self.socket,
                                         started)
        self.closed = False
        try:
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.bind(f"ipc://{self._dir}/feed")
            # what the driver can import, the process can: the dataflow's classes by reference
            path = os.pathsep.join(p for p in sys.path if p)
            env = dict(os.environ, PYTHONPATH=path)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flux.runtime.ingress_process",
                 f"ipc://{self._dir}/feed", str(os.getpid())], env=env,
                stdin=subprocess.DEVNULL)
            started.append(self.proc)
            self.pid = self.proc.pid
            self.send(SPEC, spec)
        except BaseException:
            self.closed = True
            self._release()
            raise

    def send(self, *msg) -> None:
        """Never blocks on a dead process: a PAIR socket whose peer is gone would wait
        for it for ever. While the process lives, a full pipe is back-pressure."""
        data = _pack(*msg)
        while True:
            try:
                self.socket.send(data, zmq.NOBLOCK)
                return
            except zmq.Again:
                self.check_alive()
                time.sleep(0.001)

    def check_alive(self) -> None:
        """Raise ``IngressLost`` if the process has exited."""
        code = self.proc.poll()
        if code is not None:
            raise IngressLost(f"the ingress process (pid {self.pid}) exited with code {code}")

    def receive(self, timeout_ms: int) -> List[tuple]:
        """What the process said, waiting up to ``timeout_ms`` for the first message."""
        out = []
        if not self.socket.poll(timeout_ms):
            return out
        while True:
            try:
                out.append(pickle.loads(self.socket.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return out

    def exit_code(self) -> Optional[int]:
        return self.proc.poll()

    def wait_hello(self, timeout: float) -> str:
        """The address of the process's data socket, once it built its ingress."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self.receive(50):
                if msg[0] == HELLO:
                    return msg[1]
                if msg[0] == FAILED:
                    raise RuntimeError(f"the ingress process could not start: {msg[1]}")
            code = self.exit_code()
            if code is not None:
                raise RuntimeError(f"the ingress process (pid {self.pid}) exited with code "
                                   f"{code} before it started")
        raise TimeoutError(f"the ingress process (pid {self.pid}) did not start in {timeout}s")

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the process to end, then SIGKILL it if it has not within ``timeout``; the
        socket and the folder go in any case."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.proc.poll() is None:
                try:
                    self.send(STOP)
                except (zmq.ZMQError, IngressLost):
                    pass
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("the ingress process (pid %d) did not stop: SIGKILL", self.pid)
        finally:
            self._release()


def _release(folder: str, ctx: zmq.Context, socket: zmq.Socket,
             started: List[subprocess.Popen]) -> None:
    """Kill the process if it still runs, close the feed, remove its folder (once)."""
    try:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    finally:
        socket.close(linger=0)
        ctx.term()
        temp_folders.remove(folder)


def _remove_orphaned_folder(address: str) -> None:
    """The driver died without a word: remove the folder of its feed, which it cannot.
    Only a folder the driver made (its name says so) is touched."""
    folder = os.path.dirname(address[len("ipc://"):])
    if address.startswith("ipc://") and os.path.basename(folder).startswith(FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


class _Cut:
    """Checkpoint ``number``'s cut, and the live moves of key groups it carries (DESIGN
    13; ``[stage, first, last, source, dest]`` each)."""

    __slots__ = ("number", "moves")

    def __init__(self, number: int, moves=()):
        self.number, self.moves = number, tuple(GroupMove.from_wire(m) for m in moves)


class FeedSource:
    """The records the driver handed over, in order, as the ``HostLoop``'s source, taken
    a run at a time (``take``); a checkpoint's cut is chosen once every input before it
    was accepted. A columnar source's batches (inputs as Arrow columns) stay batches:
    a run is a list of records or a batch."""

    def __init__(self, feed: zmq.Socket):
        self.feed = feed
        #: runs of inputs (lists of records, or batches of them as columns) and cuts, in
        #: the order the driver sent them; ``queued`` inputs in all
        self.waiting: Deque[Any] = deque()
        self.queued = 0
        self.ended = False  # the driver's source has no more
        self.finished = False  # ... and the loop took the last record
        self.stopped = False  # the driver said stop
        self.on_cut = None  # (number, moves) -> None: the loop's ``choose_cut``

    def take(self, limit: int) -> Any:
        """Up to ``limit`` inputs in order, one run (a list of records, or a batch of them
        as columns) for the loop's ``accept_many``, stopping before a cut; a cut at the
        head is chosen first (every input before it was accepted: what back-pressure held
        came back with ``put_back``). Empty: none is here yet, or none will come
        (``finished``)."""
        waiting = self.waiting
        if self.queued < limit and not self.ended:
            self.pump()
        while waiting and type(waiting[0]) is _Cut:
            cut = waiting.popleft()
            self.on_cut(cut.number, cut.moves)
        if not waiting:
            if self.ended:
                self.finished = True
            return []
        run = waiting.popleft()
        if len(run) > limit:
            waiting.appendleft(run[limit:])
            run = run[:limit]
        self.queued -= len(run)
        return run

    def put_back(self, run: Any) -> None:
        """The rest of a run ``take`` gave, that the ingress could not accept: first again."""
        self.waiting.appendleft(run)
        self.queued += len(run)

    def pump(self) -> bool:
        """Take what the driver sent; True if records, a cut or the end came."""
        got, feed = False, self.feed
        # asked first: a zmq.Again raised at every empty look cost the ingress ~4% of its
        # CPU at full rate (the exception's construction)
        while not self.stopped and feed.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                kind, *rest = pickle.loads(feed.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            if kind == RECORDS:  # runs: lists of records, batches of inputs as columns
                self._queue(rest[0])
            elif kind == CUT and self.finished:  # the loop asks for no more: every input
                cut = _Cut(*rest)                # was accepted
                self.on_cut(cut.number, cut.moves)
            elif kind == CUT:
                self.waiting.append(_Cut(*rest))
            elif kind == END:
                self.ended = True
            elif kind == STOP:
                self.stopped = True
            got = True
        return got


    def _queue(self, runs: List[Any]) -> None:
        """A hand-over's runs: lists of records, and batches of inputs as columns."""
        for run in runs:
            if len(run):
                self.waiting.append(run)
                self.queued += len(run)


def _wait_for(feed: zmq.Socket, kind: str, parent: int) -> Optional[tuple]:
    """The next message, which must be ``kind`` (None: the driver said stop, or died)."""
    while True:
        if feed.poll(200):
            msg = pickle.loads(feed.recv())
            if msg[0] == kind:
                return msg
            if msg[0] == STOP:
                return None
            raise RuntimeError(f"expected {kind!r} from the driver, got {msg[0]!r}")
        if os.getppid() != parent:
            return None


def run(feed: zmq.Socket, ctx: zmq.Context, parent: int) -> None:
    """Build the ingress, say where it listens, then run it until the driver says stop."""
    from pyspark import cloudpickle

    from flux.protocol.builder import MachineBuilder
    from flux.control_messages import JOB_STOPPED
    from flux.protocol.host import Host
    from flux.runtime.loop import HostLoop
    from flux.runtime.transport import Transport
    from exchange.group_map import maps_from_config
    from controller.topology import INGRESS_PROCESS

    msg = _wait_for(feed, SPEC, parent)
    if msg is None:
        return
    spec = msg[1]
    builder = MachineBuilder(cloudpickle.loads(spec["dataflow"]), spec["partitions"],
                             spec["capacity"], spec["batch_size"],
                             replication=spec["replication"], window=spec["window"],
                             batch_rows=spec["batch_rows"], pause_room=spec["pause_room"],
                             key_groups=spec["key_groups"])
    builder.groups = maps_from_config(spec.get("groups", ()), spec["partitions"])
    builder.dormant = frozenset(spec.get("dormant", ()))
    transport = Transport(ctx, INGRESS_PROCESS, spec["inc"], host=spec["host"],
                          keys=spec["keys"], ports=spec["ports"])
    try:
        feed.send(_pack(HELLO, transport.address, os.getpid()))
        msg = _wait_for(feed, BEGIN, parent)
        if msg is None:
            return
        begin = msg[1]
        ingress = builder.ingress()
        ingress.resume_after(begin["accepted"])
        host = Host(INGRESS_PROCESS, {ingress.addr: ingress}, spec["inc"],
                    peer_incs=begin["peer_incs"])
        source = FeedSource(feed)
        loop = HostLoop(host, transport, begin["where"], begin["addresses"], source=source,
                        incarnations=begin["incarnations"], flush_delay=spec["flush_delay"],
                        item_delay=spec["item_delay"])
        source.on_cut = loop.choose_cut
        transport.also_wake_on(feed)
        told, stats_at = ingress.accepted, 0.0
        while not source.stopped:
            loop.turn(5)
            if loop.stopped not in (None, JOB_STOPPED):  # the driver's end has no twin
                feed.send(_pack(FAILED, f"{INGRESS_PROCESS}: {loop.stopped}"))
                return
            if ingress.accepted != told:
                told = ingress.accepted
                feed.send(_pack(ACCEPTED, told))
            now = time.monotonic()
            if now - stats_at >= STATS_EVERY:
                stats_at = now
                feed.send(_pack(STATS, ingress.stats(), loop.view_applied))
                if os.getppid() != parent:
                    log.warning("the driver (pid %d) is gone: the ingress process ends", parent)
                    return
            source.pump()
    finally:
        transport.close()


def _reason(exc: BaseException) -> Any:
    """What the driver is told: the user's own error as itself (an ``OperatorError`` names
    the input a key raised on, and the job stops with it as with an operator's), anything
    else as its text."""
    if isinstance(exc, OperatorError):
        return exc
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:2000]


def main(argv: List[str]) -> int:
    address, parent = argv[1], int(argv[2])
    logging.basicConfig(level=logging.WARNING,
                        format="flux ingress process: %(levelname)s %(name)s: %(message)s")
    from flux.runtime.gc_tuning import data_path_gc

    ctx = zmq.Context()
    feed = ctx.socket(zmq.PAIR)
    feed.setsockopt(zmq.LINGER, 1000)  # a last word (FAILED) reaches the driver
    feed.connect(address)
    code = 0
    try:
        with data_path_gc():
            run(feed, ctx, parent)
    except BaseException as exc:
        log.error("the ingress process failed: %s", exc)
        feed.send(_pack(FAILED, _reason(exc)))
        code = 1
    finally:
        feed.close()
        ctx.term()
        if os.getppid() != parent:
            _remove_orphaned_folder(address)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))


__all__: Tuple[str, ...] = ("IngressProcess", "FeedSource", "run", "main")
