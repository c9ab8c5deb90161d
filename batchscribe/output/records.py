"""What run() and the scale-out paths write beside the transcript: an item's record with its
reference and passthrough columns, error records, plain-JSON values for the summary and run
config, and UTC timestamps."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any

from batchscribe.output.verbose_json import make_error_record


def merge_record(rec: dict[str, Any], text: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(rec["id"])}
    out.update((k, v) for k, v in rec.items() if k != "id")
    if text is not None:
        out["reference"] = text
    out.update(extra)
    return out


def error_record(item_id: str, error: str, text: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    return merge_record(make_error_record(item_id, error), text, extra)


def jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return str(obj)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
