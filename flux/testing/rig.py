"""A Spark standalone cluster of several "hosts" on one machine (DESIGN 6).

Each host is a Linux network namespace of its own with one address on a
bridge the rig creates, and runs a standalone Worker, so its executors and
their Python workers see only that host's network: a node binds and
advertises that address, its pair partner lives behind another one, and a
host can be cut off silently (its link set down: no FIN, no RST, its
processes stay alive) or killed whole. The master and the driver run in the
machine's own namespace, on the bridge's address. Everything the rig starts
is stopped by process id, and every namespace and link it made is removed, on
exit, when its body raised, or when the interpreter exits. Needs root and
iproute2 (``RigUnavailable`` says which is missing).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional

from flux.runtime import temp_folders
from flux.spark.session import (
    JVM_OPTIONS,
    cluster_session,
    driver_python_path,
    remove_at_jvm_exit,
)

log = logging.getLogger(__name__)


class RigUnavailable(RuntimeError):
    """This machine cannot build a rig (not root, no iproute2, no Java)."""


@dataclass
class RigHost:
    name: str
    namespace: str
    address: str
    link: str  # the bridge's end of the host's cable (set down to cut it)
    worker: Optional[subprocess.Popen] = None
    cut: bool = False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_rig_possible() -> None:
    if os.geteuid() != 0:
        raise RigUnavailable("the rig needs root (network namespaces)")
    if shutil.which("ip") is None:
        raise RigUnavailable("the rig needs iproute2's `ip`")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RigUnavailable("the rig needs Java for Spark")
    spark_class()


def spark_class() -> str:
    """Spark's ``spark-class`` launcher: on PATH, else the one pip's pyspark ships (a
    plain ``pip install pyspark`` puts none on PATH)."""
    found = shutil.which("spark-class")
    if found:
        return found
    import pyspark

    shipped = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    if os.access(shipped, os.X_OK):
        return shipped
    raise RigUnavailable(f"the rig needs Spark's spark-class launcher: none on PATH, and "
                         f"pyspark ships none at {shipped}")


class Rig:
    """``with Rig(hosts=5) as rig: spark = rig.session("app")``; faults: ``kill_host``,
    ``cut``, ``heal``, ``restart_worker``."""

    def __init__(self, hosts: int, cores: int = 1, memory_mb: int = 768,
                 ready_timeout: float = 120.0):
        if hosts < 1:
            raise ValueError(f"a rig needs at least one host, got {hosts}")
        self.count, self.cores, self.memory_mb = hosts, cores, memory_mb
        self.ready_timeout = ready_timeout
        self.id = ""  # chosen with the bridge: names no other rig on this machine uses
        self.hosts: List[RigHost] = []
        self.bridge = ""
        self.address = ""
        self.master: Optional[subprocess.Popen] = None
        self.master_url = ""
        self.webui = 0
        self.tmp = ""
        self.spark = None
        self._made_bridge = False
        self._namespaces: List[str] = []

    # -- life cycle ----------------------------------------------------------------
    def __enter__(self) -> "Rig":
        check_rig_possible()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _subnet(self) -> str:
        used = _ip("-4", "route").stdout + _ip("-4", "addr").stdout
        for third in random.sample(range(1, 255), 254):
            prefix = f"10.213.{third}."
            if prefix not in used:
                return prefix
        raise RigUnavailable("no free 10.213.x.0/24 subnet for the rig's bridge")

    def _claim_bridge(self) -> None:
        """Make a bridge under a name nothing on this machine has: another rig may
        run beside this one, and a killed one may have left its links behind."""
        for _ in range(50):
            rig_id = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
            taken = _ip("link").stdout + _ip("netns", "list").stdout
            if f"flx{rig_id}" in taken or f"flxbr{rig_id}" in taken:
                continue
            made = _ip("link", "add", f"flxbr{rig_id}", "type", "bridge", check=False)
            if made.returncode == 0:
                self.id, self.bridge, self._made_bridge = rig_id, f"flxbr{rig_id}", True
                return
            if "File exists" not in made.stderr:
                raise subprocess.CalledProcessError(made.returncode, made.args,
                                                    made.stdout, made.stderr)
        raise RigUnavailable("no free name for the rig's bridge after 50 tries")

    def _build(self) -> None:
        started = time.monotonic()
        temp_folders.sweep("flux-rig-")  # those of killed rigs
        prefix = self._subnet()
        self.address = prefix + "1"
        self._claim_bridge()
        self.tmp = temp_folders.make(f"flux-rig-{self.id}-")
        _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            ns, link = f"flx{self.id}h{i}", f"flx{self.id}v{i}"
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
            host = RigHost(f"host{i}", ns, f"{prefix}{10 + i}", link)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.address)
            self.hosts.append(host)
        port, self.webui = _free_port(), _free_port()
        self.master_url = f"spark://{self.address}:{port}"
        self.master = self._spark_class(
            "master", ["org.apache.spark.deploy.master.Master", "--host", self.address,
                       "--port", str(port), "--webui-port", str(self.webui)])
        self._wait(lambda: self._master_state() is not None, "the master")
        for i in range(self.count):
            self.restart_worker(i, wait=False)
        self._wait(lambda: self.alive_workers() >= self.count, f"{self.count} workers")
        log.info("rig up: %d hosts on %s in %.1fs", self.count, self.bridge,
                 time.monotonic() - started)

    def _env(self, **extra: str) -> Dict[str, str]:
        env = dict(os.environ)
        # the master binds (its web UI too) on the bridge, whatever this process was given
        # (local_cluster sets SPARK_LOCAL_IP=127.0.0.1 in the environment); a worker, on
        # its host's address
        env.update(SPARK_DAEMON_JAVA_OPTS=JVM_OPTIONS, SPARK_DAEMON_MEMORY="256m",
                   PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=self.tmp,
                   SPARK_LOCAL_DIRS=self.tmp, PYTHONHASHSEED="0",
                   SPARK_LOCAL_IP=self.address)
        env.update(extra)
        return env

    def _spark_class(self, what: str, args: List[str], namespace: str = "",
                     **env: str) -> subprocess.Popen:
        cmd = [spark_class(), *args]
        if namespace:
            cmd = ["ip", "netns", "exec", namespace, *cmd]
        out = open(os.path.join(self.tmp, f"{what}.log"), "ab")
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=self._env(**env), start_new_session=True)

    def restart_worker(self, i: int, wait: bool = True) -> None:
        """Start host ``i``'s Worker (again, after ``kill_host``: the machine rebooted)."""
        host = self.hosts[i]
        work = os.path.join(self.tmp, host.name)
        os.makedirs(work, exist_ok=True)
        before = self.alive_workers() if wait else 0
        host.worker = self._spark_class(
            f"worker-{host.name}",
            ["org.apache.spark.deploy.worker.Worker", "--host", host.address,
             "--cores", str(self.cores), "--memory", f"{self.memory_mb}m",
             "--work-dir", work, self.master_url],
            namespace=host.namespace, SPARK_LOCAL_IP=host.address, SPARK_WORKER_DIR=work)
        if wait:
            self._wait(lambda: self.alive_workers() > before, f"{host.name}'s worker")

    def _master_state(self) -> Optional[dict]:
        try:
            with urllib.request.urlopen(f"http://{self.address}:{self.webui}/json/",
                                        timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self._master_state() or {}
        return sum(w.get("state") == "ALIVE" for w in state.get("workers", []))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not ready():
            if self.master is not None and self.master.poll() is not None:
                raise RigUnavailable(f"the Spark master exited; see {self.tmp}/master.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not come up within {self.ready_timeout:.0f}s "
                                   f"(logs in {self.tmp})")
            time.sleep(0.2)

    def session(self, app_name: str = "flux-rig", **conf: str):
        """A SparkSession on the rig, one executor per host, set up for Flux nodes; it
        returns once every host's executor has registered."""
        os.environ["PYSPARK_PYTHON"] = sys.executable
        jvm = f"{JVM_OPTIONS} -Djava.io.tmpdir={self.tmp}"
        settings = {"spark.driver.host": self.address, "spark.driver.bindAddress": self.address,
                    "spark.executor.cores": str(self.cores),
                    "spark.executor.memory": f"{self.memory_mb - 256}m",
                    "spark.cores.max": str(self.cores * self.count),
                    "spark.executor.extraJavaOptions": jvm,
                    "spark.driver.extraJavaOptions": jvm,
                    "spark.executorEnv.PYTHONPATH": driver_python_path(),
                    "spark.local.dir": self.tmp, "spark.ui.enabled": "false", **conf}
        self.spark = cluster_session(self.master_url, app_name, settings)
        remove_at_jvm_exit(self.spark, self.tmp)  # the JVM makes it again after close()
        sc = self.spark.sparkContext
        self._wait(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() - 1 >= self.count,
                   f"{self.count} executors")
        n = self.count * self.cores
        sc.parallelize(range(n), n).map(lambda x: x).collect()  # warm the Python daemons
        return self.spark

    # -- faults --------------------------------------------------------------------
    def pids(self, i: int) -> List[int]:
        out = _ip("netns", "pids", self.hosts[i].namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, i: int) -> None:
        """Every process of host ``i`` dies at once (a crashed machine whose kernel closes
        its connections)."""
        log.warning("rig: killing every process of %s", self.hosts[i].name)
        for pid in self.pids(i):
            _signal(pid, signal.SIGKILL)

    def cut(self, i: int) -> None:
        """Host ``i``'s cable is cut: nothing in or out, no FIN, its processes run on."""
        log.warning("rig: cutting %s off", self.hosts[i].name)
        _ip("link", "set", self.hosts[i].link, "down")
        self.hosts[i].cut = True

    def heal(self, i: int) -> None:
        log.warning("rig: %s is back on the network", self.hosts[i].name)
        _ip("link", "set", self.hosts[i].link, "up")
        self.hosts[i].cut = False

    def host_of_address(self, address: str) -> Optional[RigHost]:
        host = address.split("://", 1)[-1].rsplit(":", 1)[0]
        return next((h for h in self.hosts if h.address == host), None)

    # -- teardown ------------------------------------------------------------------
    def close(self) -> None:
        """Stop the session and every process, remove namespaces, links and files."""
        if self.spark is not None:
            try:
                self.spark.stop()
            except Exception:  # noqa: BLE001 - the rest must go whatever happened
                log.exception("rig: stopping the session failed")
            self.spark = None
        procs = [h.worker for h in self.hosts if h.worker is not None] + \
            ([self.master] if self.master is not None else [])
        for p in procs:
            _signal(p.pid, signal.SIGTERM)
        for i in range(len(self.hosts)):
            for pid in self.pids(i):
                _signal(pid, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        deadline = time.monotonic() + 10  # executors forked late: none may outlive the rig
        while time.monotonic() < deadline:
            left = [pid for i in range(len(self.hosts)) for pid in self.pids(i)]
            if not left:
                break
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.1)
        self.master = None
        for h in self.hosts:
            h.worker = None
        for ns in self._namespaces:
            _ip("netns", "del", ns, check=False)
        self._namespaces = []
        deadline = time.monotonic() + 10  # a namespace's links go once its last process has
        while any(h.link in _ip("link").stdout for h in self.hosts) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        for h in self.hosts:
            _ip("link", "del", h.link, check=False)
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._made_bridge = False
        if self.tmp:
            temp_folders.remove(self.tmp)
            self.tmp = ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
