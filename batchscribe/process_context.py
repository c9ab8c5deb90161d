"""The context every process pool of batchscribe starts its workers from."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import signal
import sys


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
