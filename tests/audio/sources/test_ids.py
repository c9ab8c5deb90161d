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


def test_duplicate_ids_get_numbered_suffix(tmp_path: Path) -> None:
    rows = [("a", "1.wav"), ("b", "2.wav"), ("a", "3.wav"), ("a", "4.wav"), ("a#2", "5.wav")]
    manifest = tmp_path / "dups.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "path": p}) + "\n" for i, p in rows))
    whole = list(iter_source([str(manifest)], SourceOptions()))
    # k-th occurrence -> "<id>#k"; a genuine id that is already taken gets the rule too.
    assert [(i.id, Path(i.path or "").name) for i in whole] == [
        ("a", "1.wav"), ("b", "2.wav"), ("a#2", "3.wav"), ("a#3", "4.wav"), ("a#2#2", "5.wav"),
    ]
    # The rule runs before sharding, so shards agree with the whole run.
    shards = [list(iter_source([str(manifest)], SourceOptions(num_shards=2, shard_index=k))) for k in range(2)]
    assert sorted((i.id, i.path) for s in shards for i in s) == sorted((i.id, i.path) for i in whole)
