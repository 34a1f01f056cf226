"""The Spark settings a Flux job depends on, checked before any task starts.

Nodes are long-running tasks that are killed on purpose (tests) or by machine
failures, and Spark re-runs a failed task as a fresh standby (DESIGN 6). That
only works if Spark keeps retrying (``spark.task.maxFailures``), does not
exclude the executors and hosts where tasks failed, does not take executors
away (dynamic allocation), does not start a second copy of a node's task
(speculation), and has a task slot for every node and standby. A job on a
cluster set up otherwise would run until its fourth failure and then abort,
or hang waiting for a slot: it is refused at once, naming setting and value.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List

log = logging.getLogger(__name__)

#: node failures a job survives over its life count toward this, across all tasks
MIN_TASK_FAILURES = 100
#: settings every Flux session needs (``local_cluster`` and ``cluster_session`` set them)
REQUIRED_CONF: Dict[str, str] = {
    "spark.task.maxFailures": "1000",
    "spark.excludeOnFailure.enabled": "false",
    "spark.dynamicAllocation.enabled": "false",
    "spark.speculation": "false",
    "spark.deploy.maxExecutorRetries": "-1",
}


class SparkSettingError(ValueError):
    """A Spark setting a Flux job depends on has a value it cannot run with."""


def is_local(master: str) -> bool:
    """One machine by construction: ``local[...]`` or ``local-cluster[...]``."""
    return master.startswith("local")


def setting_problems(conf: Dict[str, str], master: str) -> List[str]:
    """What is wrong with these settings, one sentence each (pure, for tests)."""
    problems = []
    if not master.startswith("local["):  # local[N]: no retries at all (the master says)
        failures = conf.get("spark.task.maxFailures", "4")
        if int(failures) < MIN_TASK_FAILURES:
            problems.append(
                f"spark.task.maxFailures is {failures}: every node failure counts toward it "
                f"and Spark aborts the job when a task slot reaches it; set it to 1000")
    for key in ("spark.excludeOnFailure.enabled", "spark.blacklist.enabled"):
        if conf.get(key, "false").lower() == "true":
            problems.append(f"{key} is true: Spark would stop placing a failed node's retry "
                            f"(the new standby) on the executors and hosts it failed on; "
                            f"set it to false")
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        problems.append("spark.dynamicAllocation.enabled is true: Spark may remove the "
                        "executors of standbys and nodes; set it to false and size the "
                        "cluster (spark.executor.instances)")
    if conf.get("spark.speculation", "false").lower() == "true":
        problems.append("spark.speculation is true: a speculative copy of a node's task would "
                        "join as a second process; set it to false")
    return problems


def task_slots(sc) -> int:
    """Task slots of the executors registered now (all cores of all executors / cpus per
    task: Spark's default parallelism, when the user did not set it)."""
    return sc.defaultParallelism // int(sc.getConf().get("spark.task.cpus", "1"))


def executors_registered(sc) -> int:
    """Executors registered with the driver now (the driver's own entry left out)."""
    return max(0, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)


def check_settings(spark, tasks: int, wait: float = 60.0) -> None:
    """Refuse a session a job of ``tasks`` node tasks cannot run on (see module doc);
    waits up to ``wait`` seconds for executors to register before counting slots."""
    sc = spark.sparkContext
    conf = dict(sc.getConf().getAll())
    problems = setting_problems(conf, sc.master)
    if problems:
        raise SparkSettingError("this Spark session cannot run a Flux job: "
                                + "; ".join(problems))
    if sc.master.startswith("local[") or "spark.default.parallelism" in conf:
        return  # no executors to count (local) or no way to count them
    deadline = time.monotonic() + wait
    while task_slots(sc) < tasks and time.monotonic() < deadline:
        time.sleep(0.5)
    slots = task_slots(sc)
    if executors_registered(sc) == 0:  # defaultParallelism says 2 then: not a count
        raise SparkSettingError(
            f"no executor registered within {wait:.0f}s (FluxJob's executor_wait): the "
            f"cluster gave none for what the session asks (spark.executor.memory "
            f"{conf.get('spark.executor.memory', '1g')}, spark.executor.cores "
            f"{conf.get('spark.executor.cores', 'all of a worker')}); a worker must offer at "
            f"least that much memory and cores (its SPARK_WORKER_MEMORY, "
            f"SPARK_WORKER_CORES), or ask for less")
    if slots < tasks:
        raise SparkSettingError(
            f"the job runs {tasks} long-running tasks (nodes and standbys), but the "
            f"executors registered have {slots} task slots: give the session more "
            f"executors or cores (spark.executor.instances, spark.executor.cores), or run "
            f"fewer standbys")
    if slots == tasks:
        log.warning("the executors have exactly %d task slots for %d node tasks: a failed "
                    "node's task is retried only where its slot frees up again", slots, tasks)
