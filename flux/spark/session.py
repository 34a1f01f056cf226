"""SparkSessions set up for Flux nodes: an embedded local-cluster (SPARK_NOTES), or
a cluster of your own (``cluster_session``: standalone, YARN, Kubernetes).

Each executor is a separate JVM (a "machine" that can be killed); tasks are
long-running nodes, retried forever (the library, not Spark, decides when a
failure is fatal); one extra executor stays warm so that a killed executor's
task restarts in a fraction of a second. Spark's temporary files go into
``tmp_dir``, which the caller removes (killed JVMs leave files behind).
Executors import from the driver's ``sys.path``: on this one machine, the
modules of the library and of the user's operators are found as on the driver.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Dict, Iterator, Optional

from flux.runtime import temp_folders
from flux.spark.settings import REQUIRED_CONF

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def local_cluster_session(executors: int, tmp_dir: str, memory_mb: int = 1024,
                          app_name: str = "flux", ready_timeout: float = 120.0):
    """Start ``local-cluster[executors,1,memory_mb]`` and wait until every executor ran Python."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the builder option is ignored (SPARK_NOTES)
    address = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    from pyspark.sql import SparkSession

    jvm = f"{JVM_OPTIONS} -Djava.io.tmpdir={tmp_dir}"
    builder = SparkSession.builder.master(f"local-cluster[{executors},1,{memory_mb}]")
    for key, value in {**REQUIRED_CONF, **local_cluster_conf(executors, memory_mb, address)}.items():
        builder = builder.config(key, value)
    spark = (builder.appName(app_name)
             .config("spark.executor.extraJavaOptions", jvm)
             .config("spark.driver.extraJavaOptions", jvm)
             .config("spark.local.dir", tmp_dir)
             .config("spark.executorEnv.PYTHONHASHSEED", "0")
             .config("spark.executorEnv.PYTHONPATH", driver_python_path())
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    sc = spark.sparkContext
    quiet_task_failures(spark)
    deadline = time.monotonic() + ready_timeout
    while executor_count(sc) < executors:
        if time.monotonic() > deadline:
            spark.stop()
            raise TimeoutError(f"only {executor_count(sc)} of {executors} executors registered")
        time.sleep(0.2)
    # Warm every executor's Python daemon so a retried task starts at once.
    sc.parallelize(range(executors * 2), executors * 2).map(lambda x: x).collect()
    return spark


def local_cluster_conf(executors: int, memory_mb: int, address: str) -> Dict[str, str]:
    """What a local cluster sets itself rather than take as a default. PySpark starts its
    JVM once per process with the first session's settings as system properties, which
    every later session reads as defaults: an earlier session on a cluster of its own
    (the rig's driver address on a bridge that is gone, its core cap, its executor size)
    would otherwise break a local cluster started after it in the same process."""
    return {"spark.driver.host": address, "spark.driver.bindAddress": address,
            "spark.executor.cores": "1", "spark.cores.max": str(executors),
            "spark.executor.memory": f"{memory_mb}m"}


def cluster_session(master: str, app_name: str = "flux", conf: Optional[Dict[str, str]] = None):
    """A session on a cluster of your own (``spark://host:7077``, ``yarn``,
    ``k8s://...``) with the settings a Flux job needs (``flux.spark.settings``): task
    retries without end, no exclusion on failure, no dynamic allocation, no speculation.
    ``conf`` adds or overrides settings (executors, cores, memory, where the operators'
    code is: ``spark.submit.pyFiles``). Under ``spark-submit`` the master and most
    settings come from its command line; this only adds what Flux needs."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**REQUIRED_CONF, "spark.executorEnv.PYTHONHASHSEED": "0",
                "spark.ui.showConsoleProgress": "false", **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    quiet_task_failures(spark)
    return spark


@contextlib.contextmanager
def local_cluster(executors: int, memory_mb: int = 1024, app_name: str = "flux") -> Iterator:
    """``local_cluster_session`` with a temporary folder of its own: on exit the session
    stops and the folder (where killed executors leave their files) is removed."""
    tmp_dir = temp_folders.make("flux-spark-")  # and those of killed processes go
    try:
        spark = local_cluster_session(executors, tmp_dir, memory_mb, app_name)
        remove_at_jvm_exit(spark, tmp_dir)
        try:
            yield spark
        finally:
            spark.stop()
    finally:
        temp_folders.remove(tmp_dir)


def remove_at_jvm_exit(spark, folder: str) -> None:
    """Have the driver's JVM remove ``folder`` as it exits. PySpark keeps that JVM for the
    process's later sessions, with the first session's folder as its local directory for
    good: it makes the folder again after the session removed it (measured: a second
    session in one process left the first's folder, empty, after the process ended).
    The JVM's own exit hooks empty it, then this removes it, after a normal exit or the
    Python process's death alike (the JVM ends when its Python parent does)."""
    spark.sparkContext._jvm.java.io.File(folder).deleteOnExit()


#: Spark's loggers that print a Java stack trace for every failed task: a killed node's
#: task fails with an expected EOF, and the library says what happened in its own log
TASK_FAILURE_LOGGERS = ("org.apache.spark.scheduler.TaskSetManager",
                        "org.apache.spark.api.python.PythonRunner")


def quiet_task_failures(spark, level: str = "ERROR") -> None:
    """Raise Spark's task-failure loggers to ``level`` on the driver, so that a node kill
    does not print a Java stack trace per lost task (the controller logs the failure
    through ``logging`` instead: ``flux.runtime.controller_service``). A job that aborts
    still logs at ERROR. ``local_cluster`` calls this; call it on your own session."""
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    for name in TASK_FAILURE_LOGGERS:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level))


def driver_python_path() -> str:
    """The driver's import path, for executors on the same machine."""
    entries = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    return os.pathsep.join(dict.fromkeys(p for p in entries if os.path.isdir(p)))


def executor_count(sc) -> int:
    """How many executors of the session's context are registered now."""
    status = sc._jsc.sc().getExecutorMemoryStatus()
    return status.size() - 1  # the driver is listed too
