"""Inputs and the failure-free output shared by the restart tests (issue 14)."""
from __future__ import annotations

import json
from pathlib import Path

from flux.examples import counting_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.runtime.file_source import FileSource
from flux.workload import keyed_workload


def write_inputs(folder: Path, n: int, files: int = 4, seed: int = 5) -> list:
    """``n`` keyed records in ``files`` JSON-lines files; returns the failure-free output
    of ``counting_dataflow(2)`` over 4 partitions, as a sink reads it back."""
    folder.mkdir(parents=True, exist_ok=True)
    records = keyed_workload(n, seed=seed, keys=50)
    per = -(-n // files)
    for i in range(files):
        with open(folder / f"part-{i:03d}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i * per:(i + 1) * per])
    as_read = list(FileSource(str(folder)))
    return [(sn, wire_form(r)) for sn, r in reference_output(counting_dataflow(2), as_read, 4)]
