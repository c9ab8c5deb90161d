"""Damaged bookkeeping is not trusted: each kind of bad shard is moved aside with a warning naming
the file, its ids are redone, and the manifest afterwards lists only shards that hold its ids."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from batchscribe.output.formats import encode_shard
from batchscribe.output.resume import open_output
from tests.output.test_resume import commit, rec


def _listed(directory: Path) -> dict[str, list[str]]:
    lines = (directory / "_manifest.ndjson").read_text().splitlines()
    return {json.loads(x)["shard"]: json.loads(x)["ids"] for x in lines}


@pytest.mark.parametrize(("damage", "why"), [
    (lambda p: p.write_bytes(b"\x00garbage\xff\n"), "does not parse"),
    (lambda p: p.write_text('{"text": " no id"}\n'), "record 1 has no id"),
    (lambda p: p.write_bytes(p.read_bytes()[:30]), "truncated"),
    (lambda p: p.write_bytes(encode_shard([rec(7), rec(8)], "jsonl")), "ids differ from the 2 its manifest line lists"),
    (lambda p: p.write_bytes(encode_shard([rec(2)], "jsonl")), "first difference: the file has 1 records, the manifest 2"),
])  # fmt: skip
def test_a_bad_listed_shard_is_moved_aside_and_redone(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      damage: object, why: str) -> None:  # fmt: skip
    commit(tmp_path, [rec(0), rec(1), rec(2), rec(3)])
    shard = tmp_path / "records-00001.jsonl"
    damage(shard)  # type: ignore[operator]
    damaged = shard.read_bytes()
    with caplog.at_level(logging.WARNING):
        state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u0", "u1"}  # u2, u3 are transcribed again
    assert f"{shard}: " in caplog.text and why in caplog.text and "moved aside to records-00001.jsonl.bad" in caplog.text
    assert (tmp_path / "records-00001.jsonl.bad").read_bytes() == damaged  # kept, not deleted
    assert _listed(tmp_path) == {"records-00000.jsonl": ["u0", "u1"]}
    assert state.next_index == 2  # the bad name is never reused


def test_a_bad_parquet_shard_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    commit(tmp_path, [rec(0), rec(1), rec(2)], "parquet")
    shard = tmp_path / "records-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:-20])  # the footer cut off
    with caplog.at_level(logging.WARNING):
        state = open_output(tmp_path, "parquet")
    assert state.completed == {"u0", "u1"} and "records-00001.parquet: does not parse" in caplog.text


def test_an_unlisted_garbage_shard_is_not_adopted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    commit(tmp_path, [rec(0), rec(1)])
    (tmp_path / "records-00001.jsonl").write_bytes(b"not json\n")
    with caplog.at_level(logging.WARNING):
        state = open_output(tmp_path, "jsonl")
    assert state.completed == {"u0", "u1"} and "records-00001.jsonl: does not parse" in caplog.text
    assert (tmp_path / "records-00001.jsonl.bad").exists()
