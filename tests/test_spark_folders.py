"""A local cluster's temporary folder goes, however many sessions one process opens
(slow: Spark).

PySpark keeps the driver's JVM for the process's later sessions, and that JVM keeps
the first session's folder as its local directory: it made the folder again after
the first session removed it, and the folder outlived the process (one per test
run that opened two sessions)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_two_local_clusters_in_one_process_leave_no_folder():
    top = tempfile.mkdtemp(prefix="fsf-")
    script = "\n".join([
        "import sys",
        f"sys.path[:0] = {sys.path!r}",
        "from flux.spark.session import local_cluster",
        "for _ in range(2):",
        "    with local_cluster(1) as spark:",
        "        assert spark.range(10).count() == 10"])
    try:
        subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TMPDIR=top),
                       timeout=360, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30  # the JVM ends a moment after its Python parent
        while os.listdir(top) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.listdir(top) == []
    finally:
        subprocess.run(["rm", "-rf", top], check=False)
