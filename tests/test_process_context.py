"""The process pools' context (a forkserver that a Ctrl-C to the process group cannot interrupt) and `alive`."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscribe.process_context import alive, process_context

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver is Linux's")


def _blocked(pid: int) -> set[int]:
    """The signals `pid` blocks, from the kernel's view of it."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_the_forkserver_never_receives_sigint_and_this_thread_still_does() -> None:
    context = process_context(["batchscribe.audio.worker"])
    assert context.get_start_method() == "forkserver"
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    assert signal.SIGINT in _blocked(pid)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # restored here
    os.kill(pid, signal.SIGINT)  # as a Ctrl-C to the process group would
    time.sleep(0.2)
    os.kill(pid, 0)  # still alive
    with context.Pool(1) as pool:  # and still serving
        assert pool.apply(os.getpid) != os.getpid()


def test_alive_tells_a_running_process_from_a_finished_one() -> None:
    assert alive(os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not alive(done.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while Path(f"/proc/{zombie.pid}/stat").exists() and b") Z" not in Path(f"/proc/{zombie.pid}/stat").read_bytes():
        time.sleep(0.05)
    assert not alive(zombie.pid)  # exited, not yet reaped: gone for a worker's purposes
    zombie.wait()
