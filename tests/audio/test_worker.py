"""Decode worker processes: they end with the run that started them, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from batchscribe.process_context import alive

# A run's decode pool, stopped mid-stream: decode workers (forkserver children) busy or idle.
_RUN = textwrap.dedent("""
    import multiprocessing, sys, time
    from batchscribe.audio.pool import decode_stream
    from batchscribe.audio.sources import SourceItem

    data = open(sys.argv[1], "rb").read()
    stream = decode_stream((SourceItem(f"u{k}", data, None, None) for k in range(10_000)), workers=2, prefetch=4)
    next(stream)
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver workers: Linux")
def test_decode_workers_and_their_server_end_when_the_run_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer, `kill -9`) gives the run no chance to shut its pool down. A
    forkserver worker is the server's child, not the run's, and it holds the pipe whose closing
    tells the server the run is gone: before the fix, server and workers outlived the run for good."""
    clip = Path(__file__).resolve().parents[2] / "batchscribe" / "demo" / "sense_and_sensibility_01_austen_64kb-0870.flac"
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(clip)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        servers = {_parent(p) for p in workers}  # the forkserver
        assert proc.pid not in servers
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in [*workers, *servers]):
        time.sleep(0.2)
    assert not [p for p in [*workers, *servers] if alive(p)]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
