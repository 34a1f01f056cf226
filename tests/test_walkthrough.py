"""docs/operations.md's walkthrough, run as a user would: the package and the program from
the page's blocks written to files, the package zipped, ``spark-submit`` with the page's
settings to a standalone master (the rig: 5 hosts in network namespaces), a node killed
mid-stream by the program; the sink then holds the failure-free output (slow: Spark, root).
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import zipfile

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces)")]

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def page_blocks(kind: str) -> list:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)


def walkthrough() -> tuple:
    """The package's block, the program's block and the spark-submit command's confs."""
    package = next(b for b in page_blocks("python") if "class WordCount" in b)
    program = next(b for b in page_blocks("python") if "getOrCreate()" in b)
    command = next(b for b in page_blocks("bash") if "spark.executor.memory" in b)
    confs = re.findall(r"--conf (\S+)", command)
    return package, program, confs


def spark_submit() -> str:
    import pyspark

    return shutil.which("spark-submit") or os.path.join(
        os.path.dirname(pyspark.__file__), "bin", "spark-submit")


def test_the_walkthrough_runs_on_a_standalone_cluster_exact_through_a_kill(tmp_path):
    from flux import Dataflow, Stage, read_file_sink, reference_output
    from flux.operator import wire_form
    from flux.testing.rig import Rig

    package, program, confs = walkthrough()
    (tmp_path / "my_ops").mkdir()
    (tmp_path / "my_ops" / "__init__.py").write_text(package)
    (tmp_path / "job.py").write_text(program)
    with zipfile.ZipFile(tmp_path / "my_ops.zip", "w") as z:
        z.write(tmp_path / "my_ops" / "__init__.py", "my_ops/__init__.py")
    shutil.rmtree(tmp_path / "my_ops")  # the program finds it in the zip only
    out = tmp_path / "word-counts"
    with Rig(hosts=5) as rig:
        # the page's settings, with the rig's own master and driver address
        confs = [c.replace("10.213.0.1", rig.address) for c in confs]
        command = [spark_submit(), "--master", rig.master_url, "--py-files",
                   str(tmp_path / "my_ops.zip")]
        for conf in confs:
            command += ["--conf", conf]
        command += [str(tmp_path / "job.py"), str(out)]
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP=rig.address)
        env.pop("PYTHONPATH", None)  # as a user's shell: flux is installed, my_ops shipped
        with open(tmp_path / "submit.log", "wb") as log:
            submitted = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = submitted.wait(timeout=420)
            finally:
                if submitted.poll() is None:
                    os.killpg(submitted.pid, signal.SIGKILL)
                    submitted.wait()
    text = (tmp_path / "submit.log").read_text(errors="replace")
    assert code == 0, text[-4000:]
    # where each node runs (printed), and the kill (logged)
    assert re.search(rf"^node1 {re.escape(rig.address.rsplit('.', 1)[0])}\.\d+ \[", text, re.M)
    assert "killing node1" in text
    sys.path.insert(0, str(tmp_path / "my_ops.zip"))
    try:
        from my_ops import WordCount, word_of
    finally:
        sys.path.remove(str(tmp_path / "my_ops.zip"))
    records = [[f"w{i % 100}", i] for i in range(20_000)]
    expected = reference_output(Dataflow([Stage("counts", word_of, (WordCount,))]),
                                records, 4)
    assert read_file_sink(str(out)) == [(sn, wire_form(r)) for sn, r in expected]
