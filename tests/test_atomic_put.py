"""Small files written whole or not at all (``flux.atomic_put``): a writer killed in the
middle of a write must not leave a torn file under the name a reader trusts (a restart
after both nodes of a split died found a split log's object empty, and could not tell
it from a damaged one)."""
from __future__ import annotations

import os

import fsspec
import pytest

from flux.connectors.atomic_put import put_atomically

pytestmark = pytest.mark.timeout(30)


def test_a_write_cut_off_before_its_rename_leaves_nothing_under_the_name(tmp_path):
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "000000000286-000000000288.json")

    class Killed(BaseException):
        pass

    def killed_mid_write(*args, **kwargs):
        raise Killed()

    real_mv, fs.mv = fs.mv, killed_mid_write
    with pytest.raises(Killed):
        put_atomically(fs, path, b'{"entries": []}')
    fs.mv = real_mv
    assert os.listdir(tmp_path) == []  # neither the file nor its temporary copy
    put_atomically(fs, path, b'{"entries": [1]}')
    put_atomically(fs, path, b'{"entries": [2]}')  # a second writer of the same places
    assert os.listdir(tmp_path) == [os.path.basename(path)]
    assert fs.cat_file(path) == b'{"entries": [2]}'


def test_a_split_logs_reader_never_sees_a_torn_object(tmp_path, monkeypatch):
    """The writer's data reaches the file system in two halves and the process dies
    between them: under the object's name there is nothing, so the log ends before it
    (its entries were never acked) instead of ending on a damaged object."""
    from flux.runtime.split_log import SplitLog

    fs = fsspec.filesystem("file")
    log = SplitLog(fs, str(tmp_path), 1)
    log.write([(1, ("epoch", 5)), (2, ("item", 3))])
    real_pipe = fs.pipe_file

    def torn(path, data, **kwargs):
        real_pipe(path, data[:len(data) // 2])
        raise SystemExit("killed")

    monkeypatch.setattr(fs, "pipe_file", torn)
    with pytest.raises(SystemExit):
        log.write([(3, ("epoch", 6))])
    monkeypatch.setattr(fs, "pipe_file", real_pipe)
    got = SplitLog(fs, str(tmp_path), 1).read()
    assert got.damaged is None and got.entries == [("epoch", 5), ("item", 3)]
