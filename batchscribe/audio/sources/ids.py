"""Item ids across a whole input: the duplicate rule, sharding by id, and the item limit."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

from batchscribe.audio.sources.items import SourceItem, SourceOptions


def shard_of(item_id: str, num_shards: int) -> int:
    """The shard an id belongs to (stable across processes, machines and Python versions)."""
    digest = hashlib.blake2b(item_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def _renamed(item: SourceItem, seen: set[str]) -> str:
    """A duplicate's id from where it came from, not from how many came before it; `#k` only when
    even that is taken (a real id spelled like it, or one origin listed twice)."""
    base = f"{item.id}#{item.origin or item.id}"
    name, k = base, 2
    while name in seen:
        name, k = f"{base}#{k}", k + 1
    return name


def select(items: Iterable[SourceItem], opts: SourceOptions) -> Iterator[SourceItem]:
    """The items with duplicate ids renamed (`<id>#<origin>`), then those of shard
    `opts.shard_index`, at most `opts.limit` of them (see `iter_source`)."""
    seen: set[str] = set()
    taken = 0
    for item in items:
        item_id = item.id
        if item_id in seen:
            item_id = _renamed(item, seen)
            item = dataclasses.replace(item, id=item_id)
        seen.add(item_id)
        if opts.num_shards > 1 and shard_of(item_id, opts.num_shards) != opts.shard_index:
            continue
        yield item
        taken += 1
        if opts.limit is not None and taken >= opts.limit:
            return
