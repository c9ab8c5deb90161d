"""SIGINT / SIGTERM as one graceful stop, held back inside deferred() blocks (batchscribe.stops)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from batchscribe.stops import Terminated, deferred, stop_signals

# Every test here raises or sends SIGINT/SIGHUP and expects them handled, as in a terminal.
pytestmark = pytest.mark.usefixtures("stops_not_ignored")


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated),
                                                (signal.SIGHUP, Terminated)])  # fmt: skip
def test_a_stop_outside_deferred_raises_at_once(signum: int, raised: type[BaseException]) -> None:
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    after, before = [], [signal.getsignal(s) for s in handled]
    with pytest.raises(raised) as caught, stop_signals():
        signal.raise_signal(signum)
        after.append("ran on")
    assert after == [] and (caught.type is Terminated) == (signum != signal.SIGINT)
    if caught.type is Terminated:
        assert caught.value.signum == signum  # the CLI exits 128 + signum
    assert [signal.getsignal(s) for s in handled] == before  # restored


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under `nohup` SIGHUP is ignored, and a run must outlive the terminal it was started from."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals():
            signal.raise_signal(signal.SIGHUP)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_stop_inside_deferred_is_raised_when_the_outermost_block_ends() -> None:
    steps = []
    with pytest.raises(Terminated), stop_signals():
        with deferred():
            with deferred():
                signal.raise_signal(signal.SIGTERM)
                steps.append("inner block finished")
            steps.append("outer block finished")
        steps.append("after the blocks")
    assert steps == ["inner block finished", "outer block finished"]


def test_a_block_without_a_stop_runs_through() -> None:
    with stop_signals():
        with deferred():
            value = 1
        value += 1
    assert value == 2


def test_a_host_applications_sigint_handler_is_left_alone() -> None:
    seen: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with stop_signals():
            signal.raise_signal(signal.SIGINT)
            assert seen == [signal.SIGINT]
            with pytest.raises(Terminated):
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_deferred_without_stop_signals_changes_nothing() -> None:
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            signal.raise_signal(signal.SIGINT)  # Python's own handler: at once
            pytest.fail("not raised inside the block")


def _child(body: str) -> subprocess.CompletedProcess[str]:
    code = "import signal\nfrom batchscribe.stops import deferred, stop_signals\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_second_stop_kills_as_an_unhandled_signal_would() -> None:
    proc = _child("""
        with stop_signals(), deferred():
            signal.raise_signal(signal.SIGINT)
            print("held", flush=True)
            signal.raise_signal(signal.SIGTERM)
            print("not reached", flush=True)
    """)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "held\n"


def test_sigint_while_torch_imports_in_deferred_ends_as_a_keyboard_interrupt_after_it() -> None:
    # The stop that aborted a CI run (-6) came while torch's and Triton's pybind11 modules were
    # importing: held, it is raised only once the import is over.
    proc = _child("""
        import importlib.util, os, threading
        with stop_signals():
            try:
                with deferred():
                    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
                    import torch
                    if importlib.util.find_spec("triton"):
                        import triton
                    print("imported", flush=True)
            except KeyboardInterrupt:
                print("interrupted after", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == ["imported", "interrupted after"]


def test_a_deferred_block_of_another_thread_neither_holds_nor_takes_the_main_threads_stop() -> None:
    """run() decodes during the model load: the decode pool's submit runs in deferred() on the
    read-ahead thread. A stop that comes while that block is open is still raised in the main
    thread when the main thread's own block ends (it was held to the other thread's block's end,
    and then raised on that thread)."""
    import threading

    inside, release = threading.Event(), threading.Event()
    raised_there: list[BaseException] = []

    def other() -> None:
        try:
            with deferred():
                inside.set()
                release.wait(10)
        except BaseException as exc:  # noqa: BLE001  (what must not happen)
            raised_there.append(exc)

    with stop_signals():
        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(10)
        with pytest.raises(KeyboardInterrupt):
            with deferred():
                signal.raise_signal(signal.SIGINT)
        release.set()
        thread.join(10)
    assert raised_there == []
