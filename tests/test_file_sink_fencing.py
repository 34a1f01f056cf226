"""A FileSink opened again fences the writer before it (a zombie: a node declared dead
that still runs): whatever order their steps take, the zombie's commit after the open
does not count and raises, nothing the folder's newest manifest names is lost, and no
output is in it twice. A sink opened only to read fences nothing."""
import os

import pytest

from flux.checksums import seal
from flux.connector_api import SinkPerPartition
from flux.connectors.file_sink import FileSink, read_file_sink
from flux.connectors.file_sink_epochs import Epochs
from flux.errors import SinkFenced

pytestmark = pytest.mark.timeout(60)

OUT = [((i, 0), {"n": i}) for i in range(1, 31)]


def began_before_the_open(zombie, monkeypatch) -> list:
    """The zombie's next commit began before the successor's open: its first look for a
    newer fence finds none; its look after its manifest is real. The epochs it looked at."""
    real, looks = zombie.epochs.fenced, []

    def first_look_before_the_fence(epoch, token):
        looks.append(epoch)
        return len(looks) > 1 and real(epoch, token)

    monkeypatch.setattr(zombie.epochs, "fenced", first_look_before_the_fence)
    return looks


def test_a_zombies_commit_after_the_next_writer_opened_raises_and_is_not_read(tmp_path):
    zombie = FileSink(str(tmp_path))
    zombie.write(OUT[:5])
    zombie.commit((5, 0))
    zombie.write(OUT[5:10])
    successor = FileSink(str(tmp_path))
    assert successor.committed() == (5, 0)
    with pytest.raises(SinkFenced, match="newer writer"):
        zombie.commit((10, 0))
    successor.write(OUT[5:12])
    successor.commit((12, 0))
    assert read_file_sink(str(tmp_path)) == OUT[:12]


def test_a_zombie_committing_between_the_opens_fence_and_its_read_is_carried_on(tmp_path,
                                                                              monkeypatch):
    """The zombie's manifest lands after the opener fenced and before it read: the opener
    carries the commit on (so the zombie's raising acknowledges nothing that is lost)."""
    zombie = FileSink(str(tmp_path))
    zombie.write(OUT[:8])
    looks = began_before_the_open(zombie, monkeypatch)
    newest = Epochs.newest

    def zombie_commits_first(self):
        monkeypatch.setattr(Epochs, "newest", newest)
        with pytest.raises(SinkFenced):
            zombie.commit((8, 0))
        return newest(self)

    monkeypatch.setattr(Epochs, "newest", zombie_commits_first)
    successor = FileSink(str(tmp_path))
    assert successor.committed() == (8, 0)
    successor.write(OUT[:20])  # the replay: what it holds is dropped
    successor.commit((20, 0))
    assert read_file_sink(str(tmp_path)) == OUT[:20]


def test_a_zombie_committing_after_the_opens_read_raises_and_its_outputs_come_once(
        tmp_path, monkeypatch):
    """The zombie's manifest lands after the opener read the folder: the opener never
    knew it, the zombie sees the fence and raises (its outputs were acknowledged to no
    one), and the folder ends with each output once."""
    zombie = FileSink(str(tmp_path))
    zombie.write(OUT[:4])
    zombie.commit((4, 0))
    zombie.write(OUT[4:9])
    looks = began_before_the_open(zombie, monkeypatch)
    newest = Epochs.newest

    def zombie_commits_after_the_read(self):
        monkeypatch.setattr(Epochs, "newest", newest)
        manifest = newest(self)
        with pytest.raises(SinkFenced):
            zombie.commit((9, 0))
        return manifest

    monkeypatch.setattr(Epochs, "newest", zombie_commits_after_the_read)
    successor = FileSink(str(tmp_path))
    assert successor.committed() == (4, 0)
    assert read_file_sink(str(tmp_path)) == OUT[:4]
    successor.write(OUT[4:15])
    successor.commit((15, 0))
    assert read_file_sink(str(tmp_path)) == OUT[:15]
    again = FileSink(str(tmp_path))  # the zombie's part is no manifest's: removed
    assert again.committed() == (15, 0)
    assert sum(name.startswith("part-") for name in os.listdir(tmp_path)) == 2
    assert looks == [1, 1]  # the zombie's commit did look twice, the second time fenced


def test_a_sink_opened_only_to_read_fences_nothing_and_removes_nothing(tmp_path):
    writer = FileSink(str(tmp_path / "p0"))
    writer.write(OUT[:3])
    writer.commit((3, 0))
    (tmp_path / "p0" / ".part-00000001-00000001.jsonl.tmp").write_text("being written")
    sinks = SinkPerPartition(lambda p: FileSink(str(tmp_path / f"p{p}")))
    reader, = sinks.open_many([0], to_read=True)
    assert reader.committed() == (3, 0)
    assert (tmp_path / "p0" / ".part-00000001-00000001.jsonl.tmp").exists()
    writer.write(OUT[3:6])
    writer.commit((6, 0))  # not fenced
    assert read_file_sink(str(tmp_path / "p0")) == OUT[:6]
    with pytest.raises(RuntimeError, match="only to read"):
        reader.commit((7, 0))


def test_a_folder_written_before_epochs_is_read_and_carried_on(tmp_path):
    (tmp_path / "part-00000000.jsonl").write_text(
        "".join(f'{{"sn": [{i}, 0], "record": {{"n": {i}}}}}\n' for i in range(1, 4)))
    (tmp_path / "_flux_sink.json").write_bytes(seal(
        {"format": "jsonl", "sn": [3, 0], "parts": ["part-00000000.jsonl"], "digests": {}}))
    assert read_file_sink(str(tmp_path)) == OUT[:3]
    sink = FileSink(str(tmp_path))
    assert sink.committed() == (3, 0)
    sink.write(OUT[:7])
    sink.commit((7, 0))
    assert read_file_sink(str(tmp_path)) == OUT[:7]


def test_old_epochs_files_are_forgotten(tmp_path):
    for k in range(6):
        sink = FileSink(str(tmp_path))
        sink.write(OUT[k * 3:k * 3 + 3])
        sink.commit((k * 3 + 3, 0))
    assert sorted(os.listdir(tmp_path / "_flux_epochs"))[-2:] == [
        "manifest-00000005.json", "manifest-00000006.json"]
    assert len(os.listdir(tmp_path / "_flux_epochs")) == 4  # two manifests, two fences
    assert read_file_sink(str(tmp_path)) == OUT[:18]
