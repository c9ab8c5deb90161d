"""Shard writer: commits by count and age, atomic commits that survive a full disk and a kill,
summary.json, and JSONL lines encoded as records arrive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from batchscribe.output import writers
from batchscribe.output.formats import read_shard
from batchscribe.output.writers import ShardWriter, write_atomic
from tests.output.sample_records import ok_record


def test_shards_by_count_and_age(tmp_path: Path) -> None:
    now = [0.0]
    seen: list[tuple[str, int]] = []
    w = ShardWriter(tmp_path, "jsonl", shard_size=3, commit_seconds=10.0, clock=lambda: now[0],
                    on_commit=lambda name, recs: seen.append((name, len(recs))))
    for i in range(7):
        w.add(ok_record(i))
    assert seen == [("records-00000.jsonl", 3), ("records-00001.jsonl", 3)]
    assert w.pending == 1
    now[0] = 10.5  # the buffered record is now older than commit_seconds
    w.add(ok_record(7))
    assert seen[-1] == ("records-00002.jsonl", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "records-00000.jsonl", "records-00001.jsonl", "records-00002.jsonl"]


def test_failed_rename_leaves_nothing_and_keeps_records(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    w = ShardWriter(tmp_path, "jsonl")
    w.add(ok_record(0))

    def full_disk(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "replace", full_disk)
    with pytest.raises(OSError):
        w.flush()
    assert list(tmp_path.iterdir()) == []  # neither the shard nor its temp file
    assert w.pending == 1 and w.committed == []
    monkeypatch.undo()
    w.flush()  # the records were kept and commit once the disk has room
    assert read_shard(tmp_path / "records-00000.jsonl") == [ok_record(0)]


def test_kill_between_write_and_rename_leaves_no_readable_shard(tmp_path: Path) -> None:
    # A real crash: the process SIGKILLs itself after the temp file is written and fsynced,
    # just before the rename. Nothing it leaves may match an output name.
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from batchscribe.output import writers
        writers.os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
        w = writers.ShardWriter(Path({str(tmp_path)!r}), "jsonl")
        w.add({{"id": "a", "error": "x", "duration": None}})
        w.flush()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    names = [p.name for p in tmp_path.iterdir()]
    assert names == [".records-00000.jsonl.tmp"]
    assert list(tmp_path.glob("records-*.jsonl")) == [] and list(tmp_path.glob("*.jsonl")) == []
    from batchscribe.output.resume import open_output

    state = open_output(tmp_path, "jsonl")  # the next run removes the leftover
    assert state.completed == set() and list(tmp_path.iterdir()) == []


def test_write_atomic_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "summary.json"
    write_atomic(p, b"old")
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and [x.name for x in tmp_path.iterdir()] == ["summary.json"]


def test_summary_and_versions(tmp_path: Path) -> None:
    versions = writers.package_versions()
    import pyarrow
    import torch

    assert versions["torch"] == torch.__version__.split("+")[0] or versions["torch"] == torch.__version__
    assert versions["pyarrow"] == pyarrow.__version__
    path = writers.write_summary(tmp_path, {"items": 3, "rtfx": float("inf")})
    assert json.loads(path.read_text()) == {"items": 3, "rtfx": None}
    assert os.path.basename(path) == "summary.json"


def test_jsonl_encoded_on_arrival_reads_as_the_json_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are encoded as they are added (off the shard's commit), and the shard's lines read
    back as the json module's; a record that cannot be encoded is refused at add() and leaves the buffer
    as it was; a failed commit keeps records and lines together for the retry."""
    w = ShardWriter(tmp_path, "jsonl", shard_size=3)
    w.add(ok_record(0))
    with pytest.raises(TypeError, match="not JSON serialisable"):
        w.add({**ok_record(1), "extra": object()})
    assert w.pending == 1
    nan = {**ok_record(2), "duration": float("nan")}
    w.add(nan)
    monkeypatch.setattr(writers.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(OSError):
        w.add(ok_record(3))  # the third record commits the shard, which fails
    monkeypatch.undo()
    w.flush()
    expected = [ok_record(0), {**nan, "duration": None}, ok_record(3)]
    text = (tmp_path / "records-00000.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n") and [json.loads(line) for line in text.splitlines()] == expected
