"""A real Kafka-protocol broker for tests and experiments.

``noida-db`` (PyPI) ships one static binary that speaks the Kafka protocol,
transactions and ``read_committed`` included, and starts in well under a
second: enough to test the Kafka source and sink against the real client
library (``confluent_kafka``) instead of a mock. ``KafkaBroker`` runs it as a
subprocess in a process group of its own, on a free port, with a data folder
of its own; it is stopped by its PID (SIGTERM, then SIGKILL) and its folder
removed. Not for production: one broker, no replication.

Consumers of this broker need ``session.timeout.ms`` >= 6000.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from typing import Dict, Optional

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from flux.runtime import temp_folders

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The broker could not be started (not installed, or it did not come up)."""


class _NotUp(Exception):
    pass


def noida_binary() -> str:
    """The ``noida-db`` binary itself (not its Python wrapper, which would hide the broker's
    PID behind its own): ``$NOIDA_DB`` if set, else the one inside the ``noida_db`` package."""
    path = os.environ.get("NOIDA_DB")
    if not path:
        try:
            from importlib.resources import files

            path = str(files("noida_db").joinpath("noida-db"))
        except ModuleNotFoundError:
            raise BrokerError("KafkaBroker needs noida-db: pip install noida-db "
                              "(or set NOIDA_DB to its binary)") from None
    if not os.path.isfile(path):
        raise BrokerError(f"KafkaBroker: no noida-db binary at {path}")
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)  # wheels do not always keep the mode; the wrapper does this too
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class KafkaBroker:
    """One noida-db Kafka broker: ``with KafkaBroker() as broker: broker.bootstrap``.

    ``start_timeout``: seconds for it to answer a metadata request; ``stop_timeout``: seconds
    between SIGTERM and SIGKILL. ``parent``: the folder to make its own folder in (data and
    log; removed at ``stop``)."""

    def __init__(self, host: str = "127.0.0.1", port: Optional[int] = None,
                 start_timeout: float = 30.0, stop_timeout: float = 10.0,
                 parent: Optional[str] = None):
        self.host, self.port = host, port
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.parent = parent
        self.workdir: Optional[str] = None
        self.process: Optional[subprocess.Popen] = None
        self._log = None
        self._admin = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process is not None else None

    # -- life -------------------------------------------------------------------------------
    def start(self) -> "KafkaBroker":
        if self.process is not None:
            raise BrokerError(f"KafkaBroker at {self.bootstrap} is already started")
        binary = noida_binary()
        if self.port is None:
            self.port = free_port(self.host)
        self.workdir = temp_folders.make("flux-kafka-", self.parent)
        atexit.register(self.stop)  # never leave a broker behind a test run that forgot
        try:  # a start that fails half-way leaves no folder (nor log, nor process) either
            self._log = open(self.log_path, "wb")
            self.process = subprocess.Popen(
                [binary, "start", "--only", "kafka", "--host", self.host,
                 "--kafka-port", str(self.port), "--data-dir",
                 os.path.join(self.workdir, "data")],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                start_new_session=True)  # its own process group: a Ctrl-C of ours is not its
            log.info("KafkaBroker: noida-db pid %d on %s, folder %s", self.pid, self.bootstrap,
                     self.workdir)
            self._wait_until_up()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_up(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": self.bootstrap})

        def answers() -> None:
            if self.process.poll() is not None:
                raise BrokerError(f"KafkaBroker: noida-db exited with code "
                                  f"{self.process.returncode} before answering on "
                                  f"{self.bootstrap}; its log ends:\n{self.log_tail()}")
            try:
                self._admin.list_topics(timeout=1.0)
            except KafkaException as exc:
                raise _NotUp(str(exc)) from None

        try:
            for attempt in Retrying(stop=stop_after_delay(self.start_timeout),
                                    wait=wait_fixed(0.1), retry=retry_if_exception_type(_NotUp),
                                    reraise=True):
                with attempt:
                    answers()
        except _NotUp as exc:
            raise BrokerError(f"KafkaBroker: noida-db (pid {self.pid}) did not answer on "
                              f"{self.bootstrap} within {self.start_timeout} s ({exc}); its "
                              f"log ends:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """SIGTERM to the broker's PID, SIGKILL if it is still there after ``stop_timeout``;
        then its folder goes."""
        atexit.unregister(self.stop)
        process, self.process, self._admin = self.process, None, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("KafkaBroker: noida-db pid %d ignored SIGTERM for %s s: SIGKILL",
                            process.pid, self.stop_timeout)
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.workdir is not None:
            temp_folders.remove(self.workdir)
            self.workdir = None

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- topics -----------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1,
                     config: Optional[Dict[str, str]] = None, timeout: float = 10.0) -> None:
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, partitions, 1, config=config or {})
        self._admin_client().create_topics([topic], request_timeout=timeout)[name].result(timeout)

    def fresh_topic(self, partitions: int = 1, prefix: str = "t") -> str:
        """A topic of a new random name (tests share one broker per module)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.create_topic(name, partitions)
        return name

    def produce(self, topic: str, values, partitions: int, timeout: float = 10.0) -> None:
        """Value i (bytes; None: a tombstone) into partition ``i % partitions``; returns
        once every one is written."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        for i, value in enumerate(values):
            while True:
                try:
                    producer.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:  # the client's queue is full (100K records): wait
                    if time.monotonic() > deadline:
                        raise BrokerError(f"{topic}: not every record was written in "
                                          f"{timeout}s") from None
                    producer.poll(0.05)
        if producer.flush(max(0.0, deadline - time.monotonic())):
            raise BrokerError(f"{topic}: not every record was written in {timeout}s")

    def add_partitions(self, name: str, total: int, timeout: float = 10.0) -> None:
        """Grow topic ``name`` to ``total`` partitions."""
        from confluent_kafka.admin import NewPartitions

        futures = self._admin_client().create_partitions([NewPartitions(name, total)],
                                                         request_timeout=timeout)
        futures[name].result(timeout)

    def partitions(self, name: str, timeout: float = 10.0) -> int:
        """How many partitions topic ``name`` has (0: no such topic). All topics are listed:
        asked about one by name, noida-db creates it."""
        topic = self._admin_client().list_topics(timeout=timeout).topics.get(name)
        return 0 if topic is None else len(topic.partitions)

    def _admin_client(self):
        if self._admin is None:
            raise BrokerError("KafkaBroker is not started")
        return self._admin

    # -- diagnosis ----------------------------------------------------------------------------
    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "noida-db.log")

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
