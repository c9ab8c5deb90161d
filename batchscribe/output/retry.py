"""--retry-errors: take a writer's error records back out of its committed shards, so the run
transcribes those items again and each id still ends in exactly one record.

Each shard holding errors is rewritten under a new name without them, then the manifest is
replaced in one atomic rename (the commit point), then the old shard is removed. A crash before
the manifest rename leaves an unlisted copy of listed ids, and one after it an unlisted old shard
holding some: `inspect_output` moves such a copy aside (`.superseded`), so no id is listed twice,
and the next run redoes whatever is not listed. (An old shard of errors only is adopted back.)
The records taken out are returned: the sink puts back those whose items the run never reaches
(--limit, a stop), so no id is left without its record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchscribe.output.formats import encode_shard, read_shard
from batchscribe.output.resume import OutputState, ShardEntry
from batchscribe.output.writers import fsync_dir, shard_name, write_atomic


def retry_errors(state: OutputState) -> list[dict[str, Any]]:
    """Uncommit every error record of `state`'s writer; returns them (their ids are to be redone)."""
    entries: list[ShardEntry] = []
    replaced: list[Path] = []
    redo: list[dict[str, Any]] = []
    for entry in state.entries:
        if entry.errors == 0:
            entries.append(entry)
            continue
        path = state.directory / entry.shard
        records = read_shard(path)
        keep = [r for r in records if r.get("error") is None]
        redo.extend(r for r in records if r.get("error") is not None)
        replaced.append(path)
        if keep:
            name = shard_name(state.prefix, state.next_index, state.fmt)
            state.next_index += 1
            write_atomic(state.directory / name, encode_shard(keep, state.fmt, {}))
            entries.append(ShardEntry.from_records(name, keep))
    if not replaced:
        return []
    state.entries = entries
    state.rewrite_manifest()
    for path in replaced:
        path.unlink(missing_ok=True)
    fsync_dir(state.directory)
    return redo
