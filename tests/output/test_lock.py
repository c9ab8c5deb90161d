"""The writer locks: one owner per prefix, writers of other prefixes side by side, --overwrite only
when no other writer is live, and no stale lock after the owner dies (even by SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscribe.output.lock import OutputInUseError, lock_output
from batchscribe.output.resume import OutputDirError


def test_a_second_owner_of_a_prefix_is_refused_naming_the_first(tmp_path: Path) -> None:
    with lock_output(tmp_path / "out", "records"):
        with pytest.raises(OutputInUseError) as err:
            lock_output(tmp_path / "out", "records")
        msg = str(err.value)
        assert f"pid {os.getpid()} on " in msg and f"is writing into {tmp_path / 'out'}" in msg
        assert "nothing was changed" in msg and "choose another --output" in msg
    lock_output(tmp_path / "out", "records").release()  # released: free again


def test_shard_indices_own_their_prefixes_side_by_side(tmp_path: Path) -> None:
    first = lock_output(tmp_path, "records-part00000of00002")
    second = lock_output(tmp_path, "records-part00001of00002")
    with pytest.raises(OutputInUseError, match="shard part00001of00002.*another --shard-index"):
        lock_output(tmp_path, "records-part00001of00002")
    with pytest.raises(OutputInUseError, match="--overwrite would delete its records"):
        first.exclusive_folder()  # another writer is live
    second.release()
    first.exclusive_folder()  # alone now
    with pytest.raises(OutputInUseError, match=r"deleting the records.*\(--overwrite\)"):
        lock_output(tmp_path, "records-part00001of00002")
    first.share_folder()
    lock_output(tmp_path, "records-part00001of00002").release()
    first.release()


def test_a_killed_owner_leaves_no_stale_lock(tmp_path: Path) -> None:
    script = ("import sys, time\nfrom batchscribe.output.lock import lock_output\n"
              f"lock_output({str(tmp_path)!r}, 'records')\nprint('locked', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    with pytest.raises(OutputInUseError, match=f"pid {proc.pid}"):
        lock_output(tmp_path, "records")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while True:  # the OS frees a dead process's flock at once; allow for a slow reaper anyway
        try:
            lock = lock_output(tmp_path, "records")
            break
        except OutputInUseError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert json.loads((tmp_path / ".batchscribe-records.lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_an_unwritable_folder_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputDirError, match=f"{blocker / 'out'} is not writable.*choose another --output"):
        lock_output(blocker / "out", "records")


def test_live_writers_names_the_live_ones_only(tmp_path: Path) -> None:
    from batchscribe.output.lock import live_writers

    assert live_writers(tmp_path) == [] and not any(tmp_path.iterdir())  # no run's folder: nothing made
    with lock_output(tmp_path, "records-part00000of00002"):
        lock_output(tmp_path, "records-part00001of00002").release()  # was here, is gone
        assert [f"pid {os.getpid()} on" in w for w in live_writers(tmp_path)] == [True]
    assert live_writers(tmp_path) == []
