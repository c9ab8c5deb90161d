"""The context every process pool of batchscribe starts its workers from, and the pool itself:
workers deaf to the stop signals the run handles, and gone once the run is."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor


def process_context(preload: list[str]) -> multiprocessing.context.BaseContext:
    """forkserver on Linux (started now, deaf to Ctrl-C), spawn elsewhere.

    Never fork: the parent may hold CUDA state or threads (torch, datasets) that a forked child
    would inherit half-locked; forkserver and spawn start clean interpreters. Ctrl-C reaches the
    whole process group, and the server ignores SIGINT only after its imports, so a Ctrl-C during
    them printed its KeyboardInterrupt traceback beside the run's clean stop. A child inherits the
    signal mask of the thread that starts it: SIGINT blocked here never reaches the server (nor the
    workers it forks, which ignore it anyway), and this process receives it once unblocked."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    # SIGHUP (a closed terminal) reaches the group too, and neither helper handles it: blocked when
    # they start, it never reaches them (a killed resource tracker printed tracebacks as the run
    # stopped). The tracker's start unblocks SIGINT on its way out, whatever the mask was: first.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        multiprocessing.resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return context


def process_pool(workers: int, preload: list[str]) -> ProcessPoolExecutor:
    """A pool of `workers` processes started from `process_context(preload)`, each running
    `quiet_worker` for this process: none outlives it, however it ends."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=process_context(preload), initializer=quiet_worker,
                               initargs=(os.getpid(),))


def quiet_worker(run_pid: int | None = None) -> None:
    """A pool worker's initializer. Ctrl-C, SIGTERM and SIGHUP reach the whole process group; the
    run handles them (commits, writes the summary, shuts its pools down), so a worker ignores them:
    no KeyboardInterrupt traceback, and no worker death the pool would take for a crashing task.
    It exits by itself once the run (`run_pid`) or its parent is gone (a run killed outright),
    instead of waiting forever for work. Both: a forkserver's worker is the server's child, and
    holds the pipe whose end tells the server that the run died, so the server outlives the run
    as long as its workers do (seen: both left running after a SIGKILL of the run)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent and (run_pid is None or alive(run_pid)):
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="batchscribe-parent-watch", daemon=True).start()


def alive(pid: int) -> bool:
    """Is `pid` running (not gone, not a zombie waiting for its parent to reap it)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # e.g. another user's process: alive
            pass
        return True
