"""The --ray driver's writer (ray/commit.py) fed rows as the actors send them, without Ray."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscribe.audio.sources.fingerprint import inputs_listing
from batchscribe.output.formats import jsonl_line
from batchscribe.output.lock import lock_output
from batchscribe.output.records import now_iso
from batchscribe.ray.commit import Drive
from batchscribe.run import run_config
from batchscribe.run_folder import Folder, checked_state
from batchscribe.run_options import RunOptions

DESCRIBED = {"model": {"name": "fake"}, "engine": {"device": "cpu"}, "identity": {"dtype": "fake"}}


def _drive(tmp_path: Path, opts: RunOptions) -> Drive:
    inputs = [str(tmp_path / "in.parquet")]
    pq.write_table(pa.table({"id": ["a", "b"], "audio": [b"", b""]}), inputs[0])
    listing = inputs_listing(inputs, ())
    config = run_config(inputs, opts, listing)
    lock = lock_output(tmp_path / "out", "records")
    state = checked_state(tmp_path / "out", "records", config, opts, lock, listing)
    return Drive(inputs, opts, {"address": "local", "workers": 1}, Folder(state, lock, config, listing),
                 (time.monotonic(), now_iso()), None, 2, 0)  # fmt: skip


def _rows(ids: list[str]) -> list[dict]:
    return [{"id": i, "describe": json.dumps(DESCRIBED),
             "record": jsonl_line({"id": i, "text": " x", "language": "english", "duration": 1.0, "segments": []})}
            for i in ids]  # fmt: skip


def test_a_full_disk_at_the_last_commit_still_writes_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a plain run: the last shard is committed after the rows end, and when that commit
    fails the summary still says what happened."""
    from batchscribe.output.writers import ShardWriteError
    from tests.output.faults import full_disk_for_shards

    drive = _drive(tmp_path, RunOptions(shard_size=1000))
    full_disk_for_shards(monkeypatch)
    with pytest.raises(ShardWriteError):
        drive.drive(iter(_rows(["a", "b"])))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["status"], summary["items"], summary["this_run"]["items"]) == ("interrupted", 0, 2)


def test_rows_are_committed_once_and_summarised(tmp_path: Path) -> None:
    """A row sent twice (a task Ray redid) is dropped; the summary counts each id once."""
    result = _drive(tmp_path, RunOptions(shard_size=1000)).drive(iter(_rows(["a", "b", "a"])))
    assert (result.summary["status"], result.summary["items"], result.summary["ray"]["rows_sent_twice"]) == ("complete", 2, 1)
