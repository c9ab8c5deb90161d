"""What a decode worker runs (inline, in a thread or in a process), and how its samples come back.

A worker process leaves a task's decoded samples in one file of the run's spill folder (in
/dev/shm where there is one) and sends back only the path and offsets: the main process then
reads them back instead of unpickling them through a pipe while holding the GIL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchscribe.audio.decode import AudioDecodeError, decode_audio
from batchscribe.audio.ram_dir import RAM_DIR
from batchscribe.audio.sources import SourceItem
from batchscribe.process_context import alive

# A decoder takes encoded bytes or a path and returns float32 mono 16 kHz samples. It must be a
# module-level function so worker processes can unpickle it.
Decoder = Callable[[bytes | str], np.ndarray]
SPILL_PREFIX = "batchscribe-decoded-"  # then the owning process id


@dataclass(frozen=True)
class Spilled:
    """Decoded audio a worker process left in a file of the run's spill folder: only the path
    crosses the pipe, not the samples."""

    path: str
    n_samples: int
    offset: int = 0  # samples of earlier items in the file: a task's items share one file

    @property
    def nbytes(self) -> int:
        return 4 * self.n_samples


# (audio [n_samples] float32 or where a worker spilled it, None) or (None, reason)
Result = tuple[np.ndarray | Spilled | None, str | None]


def new_spill_dir() -> str:
    """This run's spill folder, made after removing the folders of runs that were killed."""
    _sweep_spills(RAM_DIR or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=RAM_DIR)


def _sweep_spills(parent: str) -> None:
    """Remove spill folders whose run was killed (SIGKILL, the OOM killer) before it could: in
    /dev/shm they would hold their decoded audio in memory until the machine restarts."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(SPILL_PREFIX):
            continue
        pid = name[len(SPILL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def decode_one(item: SourceItem, decoder: Decoder | None) -> Result:
    """(audio [n_samples] float32, None) or (None, reason)."""
    if decoder is None:
        decoder = decode_audio
    data: bytes | str | None = item.audio_bytes if item.audio_bytes is not None else item.path
    if data is None:
        return None, "no audio: the audio cell is empty (no bytes and no path); fix or drop the row"
    try:
        audio = decoder(data)
    except Exception as exc:  # a bad item must never stop the stream, whatever the decoder raises
        return None, _reason(exc)
    return np.ascontiguousarray(audio, dtype=np.float32), None


def _reason(exc: Exception) -> str:
    # AudioDecodeError's message already names the problem and the fix; anything else is
    # unexpected, so keep its type for the bug report.
    return str(exc) if isinstance(exc, AudioDecodeError) else f"{type(exc).__name__}: {exc}"


def decode_many(items: list[SourceItem], decoder: Decoder | None, spill: str | None = None) -> list[Result]:
    """Runs in a worker: each item's result, in order. With `spill` (a folder), the chunk's samples
    are written to one file there and each audio is returned as its place in it (Spilled)."""
    results = [decode_one(item, decoder) for item in items]
    if spill is None or all(audio is None for audio, _ in results):
        return results
    path = None
    try:
        fd, path = tempfile.mkstemp(suffix=".f32", dir=spill)
        spilled: list[Result] = []
        offset = 0
        with os.fdopen(fd, "wb") as handle:
            for audio, reason in results:
                if audio is None:
                    spilled.append((None, reason))
                    continue
                handle.write(memoryview(audio).cast("B"))
                spilled.append((Spilled(path, audio.size, offset), None))
                offset += audio.size
        return spilled
    except OSError:  # the spill storage is full or gone: send the samples through the pipe
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return results


def read_back(results: list[Result]) -> list[tuple[np.ndarray | None, str | None]]:
    """In the main process: a task's results with spilled samples read back. Its spill files are
    removed before the caller hands any item on, so an early close leaves none behind."""
    done = [_read_one(audio, reason) for audio, reason in results]
    for path in {audio.path for audio, _ in results if isinstance(audio, Spilled)}:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return done


def _read_one(audio: np.ndarray | Spilled | None, reason: str | None) -> tuple[np.ndarray | None, str | None]:
    try:
        return unspill(audio), reason
    except OSError as exc:  # e.g. something emptied /dev/shm under the run
        return None, (f"the decoded audio could not be read back from the decoder process "
                      f"({exc}); run again to retry this item")  # fmt: skip


def unspill(audio: np.ndarray | Spilled | None) -> np.ndarray | None:
    """A spilled result's samples, read back from its place in the file; other results as they are."""
    if not isinstance(audio, Spilled):
        return audio
    samples = np.fromfile(audio.path, dtype=np.float32, count=audio.n_samples, offset=4 * audio.offset)
    if samples.size != audio.n_samples:
        raise OSError(f"{audio.path}: read {samples.size} samples back, the worker wrote {audio.n_samples}")
    return samples
