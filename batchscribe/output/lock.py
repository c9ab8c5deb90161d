"""One owner per writer: the locks a run holds on its output folder for its whole life.

A writer is one `--shard-index` of a run (the whole run when it is not split). It holds two
`fcntl.flock` locks, taken before anything in the folder is read or changed:

- `.batchscribe-<prefix>.lock`, exclusive: one process at a time writes a prefix's shards,
  manifest, summary and run_config. A second run for the same prefix is refused at once.
- `.batchscribe.lock`, shared by every writer of the folder; `--overwrite` takes it exclusively
  for the moment it deletes records, so it never deletes another live writer's files.

A third, `.batchscribe-claims.lock`, is held exclusively only for moments: while a writer takes
its own lock and drops its old claim, and while it compares its settings with the live writers'
claims and leaves its own (output/claims.py).

flock locks belong to the open file: the OS drops them when the process dies however it dies
(SIGKILL, OOM), so a stale lock file never blocks a rerun. The lock files hold the owner's pid,
host and start time only to name it in the refusal; they are never removed (removing a lock file
another process is about to lock would let two owners in).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from batchscribe.output.resume import OutputDirError

FOLDER_LOCK = ".batchscribe.lock"
CLAIMS_LOCK = ".batchscribe-claims.lock"
CLAIM = ".batchscribe-{prefix}.claim.json"  # a live writer's settings (output/claims.py)


class OutputInUseError(OutputDirError):
    """Another live run owns this output folder (or this shard index of it)."""


def writer_lock_name(prefix: str) -> str:
    return f".batchscribe-{prefix}.lock"


def claim_name(prefix: str) -> str:
    return CLAIM.format(prefix=prefix)


@contextlib.contextmanager
def claims_locked(directory: Path) -> Iterator[None]:
    """The folder's claims lock, exclusively, for the block (it waits for another writer's few reads)."""
    fd = os.open(Path(directory) / CLAIMS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def writer_alive(directory: Path, prefix: str) -> bool:
    """Whether a live process holds `prefix`'s writer lock. Only under `claims_locked`: a writer
    takes its lock under it too, so this probe's moment of holding the lock refuses nobody."""
    try:
        fd = os.open(Path(directory) / writer_lock_name(prefix), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@dataclass
class OutputLock:
    """The two locks of one writer; `release()` (or process exit) frees them."""

    directory: Path
    prefix: str
    _fds: list[int] = field(default_factory=list)

    def exclusive_folder(self) -> None:
        """For --overwrite: the folder lock exclusively (no other writer alive), until `share_folder`."""
        _relock(self._fds[0], fcntl.LOCK_EX, self.directory, "another batchscribe run is writing into "
                f"{self.directory} (another --shard-index, or the same run); --overwrite would delete its records. "
                "Wait for it to finish, or use another --output")  # fmt: skip

    def share_folder(self) -> None:
        fcntl.flock(self._fds[0], fcntl.LOCK_SH)

    def release(self) -> None:
        for fd in reversed(self._fds):
            os.close(fd)  # closing the descriptor releases its flock
        self._fds.clear()

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def live_writers(directory: Path) -> list[str]:
    """Who is writing into `directory` now (" (pid P on H, started T)" per live writer), for the
    readers (export, eval) to say their view is partial. [] where the folder cannot hold the claims
    lock (read-only): without it the probe could refuse a writer starting at that moment."""
    directory = Path(directory)
    names = sorted(p.name for p in directory.glob(".batchscribe-*.lock") if p.name != CLAIMS_LOCK)
    if not names:  # not a run's folder: nothing to probe, and no lock file made in it
        return []
    try:
        with claims_locked(directory):
            return [_owner(directory / n) for n in names
                    if writer_alive(directory, n.removeprefix(".batchscribe-").removesuffix(".lock"))]
    except OSError:
        return []


def lock_output(directory: Path, prefix: str) -> OutputLock:
    """Create `directory` if needed and take the writer's locks, or raise OutputInUseError naming
    the owner and the fix. Nothing else in the folder is read or written."""
    directory = Path(directory)
    lock = OutputLock(directory, prefix)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock._fds.append(os.open(directory / FOLDER_LOCK, os.O_RDWR | os.O_CREAT, 0o644))
        _relock(lock._fds[0], fcntl.LOCK_SH, directory, f"a batchscribe run is deleting the records in "
                f"{directory} (--overwrite); wait for it, or use another --output")  # fmt: skip
        path = directory / writer_lock_name(prefix)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        lock._fds.append(fd)
        with claims_locked(directory):  # the lock taken and the old claim dropped in one step
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputInUseError(_in_use_message(directory, prefix, _owner(path))) from None
            with contextlib.suppress(FileNotFoundError):
                (directory / claim_name(prefix)).unlink()
        _write_owner(fd)
    except OutputInUseError:
        lock.release()
        raise
    except OSError as exc:
        lock.release()
        raise OutputDirError(
            f"output directory {directory} is not writable ({exc.strerror or exc}); "
            "choose another --output or fix its permissions / free space"
        ) from exc
    return lock


def _relock(fd: int, mode: int, directory: Path, message: str) -> None:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputInUseError(message) from None


def _in_use_message(directory: Path, prefix: str, owner: str) -> str:
    part = "" if prefix == "records" else f" (shard {prefix.removeprefix('records-')})"
    return (f"another batchscribe run{owner} is writing into {directory}{part}; nothing was changed. "
            "Wait for it to finish (rerun then to resume), or choose another --output"
            + ("" if prefix == "records" else " or another --shard-index"))


def _owner(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f" (pid {info['pid']} on {info['host']}, started {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""  # the owner has not written its name yet


def _write_owner(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
