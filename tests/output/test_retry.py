"""--retry-errors: error records leave the committed set, ok records stay, each id ends up in one
shard, and a crash at any step of the swap leaves no id listed twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchscribe.output.resume import open_output
from batchscribe.output.retry import retry_errors
from tests.output.test_resume import commit, committed_ids, rec


def _records(directory: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(directory.glob("records-*.jsonl")) for line in p.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_error_records_are_taken_back_and_ok_records_kept(tmp_path: Path, fmt: str) -> None:
    commit(tmp_path, [rec(0), rec(1, ok=False), rec(2, ok=False), rec(3, ok=False), rec(4)], fmt)
    state = open_output(tmp_path, fmt)
    assert sorted(r["id"] for r in retry_errors(state)) == ["u1", "u2", "u3"]  # returned, to put back if not redone
    assert state.completed == {"u0", "u4"} == committed_ids(tmp_path)
    assert state.totals()["errors"] == 0 and state.next_index == 4  # past every name used so far
    reopened = open_output(tmp_path, fmt)
    assert reopened.completed == {"u0", "u4"} and not list(tmp_path.glob("*.superseded"))


def test_a_crash_mid_swap_never_lists_an_id_twice(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1, ok=False)])
    old = (tmp_path / "records-00000.jsonl").read_bytes()
    state = open_output(tmp_path, "jsonl")
    retry_errors(state)  # records-00001.jsonl holds u0 only
    (tmp_path / "records-00000.jsonl").write_bytes(old)  # as if killed before the old shard's unlink
    reopened = open_output(tmp_path, "jsonl")
    assert reopened.completed == {"u0"} and [r["id"] for r in _records(tmp_path)] == ["u0"]
    assert (tmp_path / "records-00000.jsonl.superseded").read_bytes() == old
