"""What the executors of an embedded cluster wrote, for a failed test's report.

A node's Python worker writes its warnings (and, with ``faulthandler``, the traceback
of a hard crash) to its executor's stderr, which a ``local-cluster`` keeps in Spark's
work folder, ``<SPARK_HOME>/work/<application id>/<executor>/stderr``. A Spark test that
fails once in many runs is only understood from these lines, so the tests' report
carries them.
"""
from __future__ import annotations

import os
from collections import deque
from typing import List


def spark_home() -> str:
    """Where a local cluster's Worker keeps its work folder."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    import pyspark

    return os.path.dirname(pyspark.__file__)


#: what every executor writes, whatever happened
_CHATTER = (" INFO ", "Spark Executor Command:", "=====", "Using Spark's default log4j",
            "NativeCodeLoader", "Using incubator modules")


def _chatter(line: str) -> bool:
    return not line.strip() or any(c in line for c in _CHATTER)


def executor_log_tails(application_id: str, lines: int = 60) -> str:
    """The last ``lines`` lines of each executor's stderr of ``application_id`` that are
    not Spark's chatter, each executor's under its folder's name ("" if none)."""
    folder = os.path.join(spark_home(), "work", application_id)
    if not os.path.isdir(folder):
        return ""
    parts: List[str] = []
    for executor in sorted(os.listdir(folder), key=lambda n: (len(n), n)):
        path = os.path.join(folder, executor, "stderr")
        if not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            tail = deque((line.rstrip("\n") for line in f if not _chatter(line)), lines)
        parts.append(f"--- executor {executor} ({path})\n" + "\n".join(tail))
    return "\n".join(parts)
