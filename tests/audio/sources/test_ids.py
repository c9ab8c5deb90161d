"""Ids: shards disjoint and complete in input order, the limit per shard, the duplicate-id rule."""

from __future__ import annotations

import json
from pathlib import Path

from batchscribe.audio.sources import SourceOptions, iter_source, shard_of


def test_sharding_disjoint_and_complete(parquet_path: Path) -> None:
    whole = [i.id for i in iter_source([str(parquet_path)], SourceOptions())]
    shards = [
        [i.id for i in iter_source([str(parquet_path)], SourceOptions(num_shards=3, shard_index=k))]
        for k in range(3)
    ]
    assert sum(len(s) for s in shards) == len(whole) == 100
    assert sorted(sum(shards, [])) == sorted(whole)
    assert all(len(s) > 10 for s in shards)  # a real split, not everything in one shard
    for k, shard in enumerate(shards):
        assert shard == [i for i in whole if shard_of(i, 3) == k]  # input order kept
    limited = [i.id for i in iter_source([str(parquet_path)], SourceOptions(num_shards=3, shard_index=1, limit=5))]
    assert limited == shards[1][:5]  # limit counts items of the shard


def _ids(manifest: Path, rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    manifest.write_text("".join(json.dumps({"id": i, "path": p}) + "\n" for i, p in rows))
    return [(i.id, Path(i.path or "").name) for i in iter_source([str(manifest)], SourceOptions())]


def test_duplicate_ids_are_named_by_their_own_path(tmp_path: Path) -> None:
    rows = [("a", "1.wav"), ("b", "2.wav"), ("a", "3.wav"), ("a", "4.wav"), ("a#2", "5.wav"),
            ("a#3.wav", "6.wav")]  # fmt: skip
    manifest = tmp_path / "dups.jsonl"
    # A later duplicate -> "<id>#<its path as written>"; a real id spelled like one keeps its own
    # id when free, and a real id that is already taken gets the rule too: no two items share one.
    assert _ids(manifest, rows) == [
        ("a", "1.wav"), ("b", "2.wav"), ("a#3.wav", "3.wav"), ("a#4.wav", "4.wav"), ("a#2", "5.wav"),
        ("a#3.wav#6.wav", "6.wav"),
    ]
    # Not numbered: a duplicate added between them shifts no other item's id (with "#k" it did).
    shifted = _ids(manifest, [rows[0], ("a", "0.wav"), *rows[1:4]])
    assert shifted == [("a", "1.wav"), ("a#0.wav", "0.wav"), ("b", "2.wav"), ("a#3.wav", "3.wav"), ("a#4.wav", "4.wav")]
    whole = list(iter_source([str(manifest)], SourceOptions()))
    # The rule runs before sharding, so shards agree with the whole run.
    shards = [list(iter_source([str(manifest)], SourceOptions(num_shards=2, shard_index=k))) for k in range(2)]
    assert sorted((i.id, i.path) for s in shards for i in s) == sorted((i.id, i.path) for i in whole)


def test_a_limit_of_zero_is_refused() -> None:
    """limit=0 would transcribe nothing, and a run then said every item was already committed."""
    import pytest

    from batchscribe.config import ConfigError

    with pytest.raises(ConfigError, match=r"limit=0 would transcribe nothing; give a count >= 1"):
        SourceOptions(limit=0)
    assert SourceOptions(limit=1).limit == 1
