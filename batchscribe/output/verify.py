"""Is a committed shard what its manifest line says? Read on every resume, before it is trusted.

A shard counts as committed only when it parses completely, every record has an id, and its ids
are exactly its manifest line's, in order. Anything else (garbage, a file cut short, records
without ids, ids the manifest disagrees with) is reported with the reason, so the caller can move
it aside and redo its items instead of trusting it or failing on it later.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def read_ids(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(records holding at least `id`, `error` and `duration`, None) or ([], why the shard is bad)."""
    try:
        records = _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [], f"does not parse ({type(exc).__name__}: {str(exc)[:200]})"
    if not records:
        return [], "holds no records"
    missing = next((i for i, r in enumerate(records) if not isinstance(r, dict) or r.get("id") is None), None)
    if missing is not None:
        return [], f"record {missing + 1} has no id"
    return records, None


def verify_shard(path: Path, ids: Sequence[str]) -> str | None:
    """None when `path` holds exactly `ids` (in order); else why not."""
    records, why = read_ids(path)
    if why is not None:
        return why
    found = [str(r["id"]) for r in records]
    if found != list(ids):
        return (f"holds {len(found)} records whose ids differ from the {len(ids)} its manifest line lists "
                f"(first difference: {_first_difference(found, list(ids))})")
    return None


def _first_difference(found: list[str], listed: list[str]) -> str:
    for k, (a, b) in enumerate(zip(found, listed)):
        if a != b:
            return f"record {k + 1} is {a!r}, the manifest says {b!r}"
    return f"the file has {len(found)} records, the manifest {len(listed)}"


def _read_jsonl(path: Path) -> list[Any]:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise ValueError("the last line is cut short (no newline): the file was truncated")
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["id", "error", "duration"])
    except pa.ArrowException as exc:  # a cut footer, a missing column, a corrupt page
        raise ValueError(str(exc)) from exc
    return table.to_pylist()
