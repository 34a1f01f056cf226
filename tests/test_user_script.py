"""A job as users write one: a script run as ``python job.py``, its operator and key
defined in the script itself (``__main__``) and no ``if __name__ == "__main__"`` guard
(slow: Spark). The script's module-level code runs once: nothing the library starts
(executors, the ingress process) imports the user's main module again."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from flux import Dataflow, FluxJob, KeyedOperator, KeyedState, Stage, local_cluster
    from flux.operator import wire_form
    from flux.reference import reference_output

    with open(sys.argv[1], "a") as starts:  # one line per run of this module's code
        starts.write(f"{os.getpid()}\\n")

    class RunningTotal(KeyedOperator):
        """Per user: the running total of amounts, emitted on every record."""
        def __init__(self):
            self.state = KeyedState()

        def process(self, record):
            user, amount = record[0], record[1]
            total = self.state.get(user, 0) + amount
            self.state[user] = total
            return [(user, total)]

    def user_of(record):
        return record[0]

    records = [(f"u{i % 37}", i % 11) for i in range(6000)]
    dataflow = Dataflow([Stage("totals", user_of, (RunningTotal,)),
                         Stage("again", lambda r: r[1] % 5, (RunningTotal,))])
    with local_cluster(executors=3) as spark:
        with FluxJob(spark, dataflow, iter(records), nodes=2, standbys=1) as job:
            output = job.wait(timeout=120)
    expected = reference_output(dataflow, records, 2)
    same = [wire_form(x) for x in output] == [wire_form(x) for x in expected]
    print(json.dumps({"outputs": len(output), "same": same}))
''')


@pytest.mark.timeout(300)
def test_a_script_with_its_operators_in_main_and_no_guard_runs_once_and_exactly(tmp_path):
    script, starts = tmp_path / "job.py", tmp_path / "starts"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script), str(starts)], capture_output=True,
                         text=True, timeout=280, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == '{"outputs": 6000, "same": true}'
    assert len(starts.read_text().split()) == 1  # the module ran once, in the driver
