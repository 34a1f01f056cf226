"""Temporary folders that go even when their maker was killed (flux.runtime.temp_folders)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from flux.runtime import temp_folders

MAKER = "\n".join([
    "import sys, time",
    f"sys.path[:0] = {sys.path!r}",
    "from flux.runtime import temp_folders",
    "print(temp_folders.make('flux-t-', sys.argv[1]), flush=True)",
    "time.sleep(60)"])


def maker(parent) -> tuple:
    proc = subprocess.Popen([sys.executable, "-c", MAKER, str(parent)], stdout=subprocess.PIPE,
                            text=True)
    return proc, proc.stdout.readline().strip()


def test_a_folder_goes_with_remove_and_a_live_makers_folder_stays(tmp_path):
    mine = temp_folders.make("flux-t-", str(tmp_path))
    assert os.listdir(mine) == [temp_folders.OWNER]
    proc, theirs = maker(tmp_path)
    try:
        assert temp_folders.sweep("flux-t-", str(tmp_path)) == []  # both makers live
        assert os.path.isdir(mine) and os.path.isdir(theirs)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    temp_folders.remove(mine)
    temp_folders.remove(mine)  # again: nothing
    assert os.listdir(tmp_path) == [os.path.basename(theirs)]


def test_the_folder_of_a_killed_maker_goes_at_the_next_make(tmp_path):
    proc, theirs = maker(tmp_path)
    open(os.path.join(theirs, "feed"), "w").close()
    os.kill(proc.pid, signal.SIGKILL)  # no finally, no atexit
    proc.wait(10)
    proc.stdout.close()
    other = tmp_path / "flux-t-not-one-of-ours"  # no .owner: left alone
    other.mkdir()
    mine = temp_folders.make("flux-t-", str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(mine), other.name])
    temp_folders.remove(mine)
