"""Lineage: every output leads back to the input it derives from, read again from a
fresh copy of the source (from the start, from the newest checkpoint before it, in the
input log's order where the source's order is logged)."""
from __future__ import annotations

import json
import random

import pytest

from flux import Lineage, lineage
from flux.connectors.file_source import FileSource
from flux.reference import reference_output
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.input_log import InputLog
from flux.testing.dataflows import counting_dataflow
from flux.testing.workloads import keyed_workload

pytestmark = pytest.mark.timeout(120)


def test_every_output_of_a_sequence_leads_back_to_its_input():
    records = keyed_workload(300, seed=3, keys=20)
    outputs = reference_output(counting_dataflow(2), records, 4)
    assert len(outputs) > 300  # some inputs give several outputs
    for sn, _ in outputs:
        found = lineage(sn, records)
        assert isinstance(found, Lineage) and found.output == tuple(sn)
        assert found.record == records[sn[0] - 1] and found.input == sn[0]
        assert found.position == sn[0] - 1 and found.partition is None


def write_files(folder, records, files=3):
    folder.mkdir()
    per = -(-len(records) // files)
    for i in range(files):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i * per:(i + 1) * per])


def complete(store, number, cut, position):
    store.complete(number, {"fingerprint": "x", "partitions": 1, "stages": 1, "cut": cut,
                            "source": position, "sink": None, "files": [], "chains": [],
                            "digests": {}})


def test_with_a_checkpoint_the_source_is_read_from_the_newest_one_before_the_input(tmp_path):
    records = [[f"k{i % 5}", i] for i in range(300)]
    write_files(tmp_path / "in", records)
    reading = FileSource(str(tmp_path / "in"))
    positions = {}
    for n in range(1, 301):
        next(reading)
        positions[n] = reading.position
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=10)
    for number, cut in ((1, 90), (2, 180)):
        complete(store, number, cut, positions[cut])
    for x in (1, 90, 91, 150, 181, 300):
        found = lineage((x, 2), FileSource(str(tmp_path / "in")), str(tmp_path / "ckpt"))
        assert found.record == records[x - 1]
        again = FileSource(str(tmp_path / "in"))  # the position reads that input next
        again.open(found.position)
        assert next(again) == records[x - 1]
    with pytest.raises(LookupError, match="the source ends after input 300"):
        lineage((301,), FileSource(str(tmp_path / "in")), str(tmp_path / "ckpt"))


class Arrivals:
    """A source of partitions interleaved by arrival (Kafka's way): a read order of its
    own each time, unless ``replay`` hands one."""

    def __init__(self, parts, seed):
        self.parts = parts
        self.rng = random.Random(seed)
        self.next = {p: 0 for p in parts}
        self.order, self._last = None, None

    @property
    def position(self):
        return dict(self.next)

    def open(self, position):
        self.next = {int(p): o for p, o in position.items()}

    @property
    def last(self):
        return self._last

    def replay(self, partitions):
        self.order = list(partitions)

    def __iter__(self):
        return self

    def __next__(self):
        left = [p for p, o in self.next.items() if o < len(self.parts[p])]
        if not left:
            raise StopIteration
        p = self.order.pop(0) if self.order else self.rng.choice(left)
        o = self.next[p]
        self.next[p] = o + 1
        self._last = (p, o)
        return self.parts[p][o]


def test_a_logged_order_is_replayed_and_names_the_partition(tmp_path):
    parts = {p: [(p, i) for i in range(50)] for p in range(3)}
    job_reads = Arrivals(parts, seed=1)  # the job's read: its order goes to the input log
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=10)
    log = InputLog(store)
    taken, order, positions = [], [], {}
    for n in range(1, 151):
        taken.append(next(job_reads))
        order.append(job_reads.last[0])
        positions[n] = job_reads.position
    complete(store, 1, 60, positions[60])
    log.append(61, order[60:])
    for x in (61, 100, 150):
        found = lineage((x, 1, 1), Arrivals(parts, seed=99), str(tmp_path / "ckpt"))
        assert found.record == taken[x - 1] and found.partition == taken[x - 1][0]
    with pytest.raises(LookupError, match="no kept checkpoint .* is before input 12"):
        lineage((12,), Arrivals(parts, seed=99), str(tmp_path / "ckpt"))
    with pytest.raises(LookupError, match="give checkpoint="):
        lineage((70,), Arrivals(parts, seed=99))


def test_a_row_of_a_batch_is_found_in_its_batch(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flux.connectors.parquet_source import ParquetSource

    (tmp_path / "in").mkdir()
    table = pa.table({"k": [f"k{i % 3}" for i in range(100)], "v": list(range(100))})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    found = lineage((37, 1), ParquetSource(str(tmp_path / "in"), batch_rows=16))
    assert found.record == ("k0", 36) and found.input == 37


def test_what_cannot_be_read_again_is_refused():
    with pytest.raises(ValueError, match="read again from a position"):
        lineage((3,), iter([1, 2, 3]))
    with pytest.raises(ValueError, match="not an output's SN"):
        lineage((0,), [1, 2])


def test_a_job_reads_its_own_sequence_again_and_asks_for_a_copy_of_any_other_source(tmp_path):
    from flux.spark.job import FluxJob

    records = keyed_workload(50, seed=4, keys=5)
    job = FluxJob(None, counting_dataflow(2), records, nodes=2)
    assert job.lineage((7, 1, 2)).record == records[6]
    write_files(tmp_path / "in", [list(r) for r in records])
    on_files = FluxJob(None, counting_dataflow(2), FileSource(str(tmp_path / "in")), nodes=2)
    with pytest.raises(ValueError, match="give a fresh copy of the job's source"):
        on_files.lineage((7,))
    assert on_files.lineage((7,), FileSource(str(tmp_path / "in"))).record == list(records[6])
