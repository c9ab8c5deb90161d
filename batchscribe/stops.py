"""SIGINT, SIGTERM and SIGHUP as one graceful stop, held back while native code may be running Python.

A KeyboardInterrupt raised in Python code that a C++ extension called (torch's and Triton's
pybind11 imports, a model load, a CUDA graph capture) escapes as a C++ exception and aborts the
process (`terminate called after throwing pybind11::error_already_set`, exit -6), skipping the
commit and the summary. So a stop that arrives inside `deferred()` is held and raised when the
block ends; anywhere else it is raised at once. A second signal of either kind kills the
process as it would without batchscribe: committed shards stay valid whatever stops it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, Docker, Slurm, Kubernetes) or SIGHUP (a closed terminal or SSH session),
    handled as Ctrl-C is: what is done is committed. `signum`: which (exit status 128 + signum)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = int(signum)


class _Stops:
    def __init__(self) -> None:
        self.depth = 0  # nested deferred() blocks
        self.pending: KeyboardInterrupt | None = None
        self.handled: dict[int, Any] = {}  # signal -> the handler it had before

    def handler(self, signum: int, frame: Any) -> None:
        # The first stop of either kind is the graceful one; the next kills as if unhandled.
        for handled in self.handled:
            signal.signal(handled, signal.SIG_DFL)
        stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        if self.depth:
            self.pending = stop
            return
        raise stop


_active: _Stops | None = None


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Terminated and SIGINT KeyboardInterrupt, each
    held back inside `deferred()`. A SIGINT handler other than Python's default (a host
    application's) is left alone, and so is an ignored SIGHUP (`nohup`); from a thread other than
    the main one this does nothing (signals reach only it)."""
    global _active
    if threading.current_thread() is not threading.main_thread() or _active is not None:
        yield
        return
    stops = _Stops()
    stops.handled[signal.SIGTERM] = signal.signal(signal.SIGTERM, stops.handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        stops.handled[signal.SIGINT] = signal.signal(signal.SIGINT, stops.handler)
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:
        stops.handled[hangup] = signal.signal(hangup, stops.handler)
    _active = stops
    try:
        yield
    finally:
        _active = None
        for signum, handler in stops.handled.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a stop signal until the block ends, then raise it (if the block raised nothing else).
    On a thread other than the main one it does nothing: a stop is raised only in the main thread,
    and a block of another thread (the decode pool's submit on the read-ahead thread) that counted
    would hold the main thread's stop past its own block and raise it on that thread instead."""
    stops = _active
    if stops is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    stops.depth += 1
    try:
        yield
    finally:
        stops.depth -= 1
    if stops.depth == 0 and stops.pending is not None:
        stop, stops.pending = stops.pending, None
        raise stop
