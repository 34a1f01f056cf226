"""``python -m flux.sim --jobs J``: the schedules run in J processes and what is printed is
what one process prints (violations, counts, fingerprint), in the seeds' order."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import main

pytestmark = pytest.mark.timeout(120)


def printed(capsys, argv):
    status = main(argv)
    out = capsys.readouterr()
    counts = [line for line in out.err.splitlines() if line.startswith("# pair_lost")]
    return status, out.out, counts


@pytest.mark.parametrize("argv", [
    ["--schedules", "8", "--seed", "3", "--fingerprint"],
    # a broken variant: the violations, each with its seed, in the seeds' order
    ["--schedules", "8", "--seed", "1", "--variant", "no-dup-filter", "--standbys", "1",
     "--crashes", "3", "--fingerprint"],
    # violations whose traces hold a state transfer's chunks (memory views)
    ["--schedules", "3", "--seed", "1", "--variant", "early-evict", "--standbys", "1",
     "--fingerprint", "-v"],
])
@pytest.mark.sim  # a long simulator run: CI, not the quick suite
def test_the_same_schedules_in_two_processes_print_the_same(capsys, argv):
    alone = printed(capsys, argv)
    apart = printed(capsys, argv + ["--jobs", "2"])
    assert apart == alone
    assert "fingerprint=" in alone[1]


def test_a_broken_variant_is_caught_in_two_processes(capsys):
    status, out, _ = printed(capsys, ["--schedules", "30", "--seed", "1", "--variant",
                                      "no-dup-filter", "--standbys", "1", "--crashes", "3",
                                      "--jobs", "2"])
    assert status == 1 and "violation seed=" in out


def test_jobs_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_the_command_line_runs_on_every_cpu_unless_told():
    """``python -m flux.sim`` uses every CPU it may (its rate line says how many
    processes); ``--jobs 1`` one, as ``main(argv)`` from code does by default."""
    import os
    import subprocess
    import sys

    cpus = len(os.sched_getaffinity(0))
    run = subprocess.run([sys.executable, "-m", "flux.sim", "--schedules", "4", "--seed", "1"],
                         capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    rate = run.stderr.strip().splitlines()[-1]
    assert (f"{cpus} processes" in rate) if cpus > 1 else ("processes" not in rate), rate
    one = subprocess.run([sys.executable, "-m", "flux.sim", "--schedules", "4", "--seed", "1",
                          "--jobs", "1"], capture_output=True, text=True, timeout=100)
    assert "processes" not in one.stderr.strip().splitlines()[-1]
    assert one.stdout == run.stdout  # the same schedules, the same lines
