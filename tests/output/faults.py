"""A full disk where record shards are committed, for the tests of what a run keeps then."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest


def full_disk_for_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record shard's commit fails with ENOSPC; the other files (summary, manifest) are written."""
    import batchscribe.output.writers as writers

    real = writers.write_atomic

    def full_disk(path: Path, data: bytes, sync_dir: bool = True) -> None:
        if path.name.startswith("records-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data, sync_dir)

    monkeypatch.setattr(writers, "write_atomic", full_disk)
