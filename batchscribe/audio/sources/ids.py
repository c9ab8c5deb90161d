"""Item ids across a whole input: the duplicate rule, sharding by id, and the item limit."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from batchscribe.audio.sources.items import SourceItem, SourceOptions


def shard_of(item_id: str, num_shards: int) -> int:
    """The shard an id belongs to (stable across processes, machines and Python versions)."""
    digest = hashlib.blake2b(item_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def select(items: Iterable[SourceItem], opts: SourceOptions) -> Iterator[SourceItem]:
    """The items with duplicate ids renamed (`<id>#k`), then those of shard `opts.shard_index`,
    at most `opts.limit` of them (see `iter_source`)."""
    seen: set[str] = set()
    next_suffix: dict[str, int] = {}  # duplicated id -> the k to try next (no O(k^2) rescans)
    taken = 0
    if opts.limit == 0:
        return
    for item in items:
        item_id = item.id
        if item_id in seen:
            k = next_suffix.get(item.id, 2)
            while f"{item.id}#{k}" in seen:
                k += 1
            next_suffix[item.id] = k + 1
            item_id = f"{item.id}#{k}"
            item = SourceItem(item_id, item.audio_bytes, item.path, item.text, item.extra)
        seen.add(item_id)
        if opts.num_shards > 1 and shard_of(item_id, opts.num_shards) != opts.shard_index:
            continue
        yield item
        taken += 1
        if opts.limit is not None and taken >= opts.limit:
            return
