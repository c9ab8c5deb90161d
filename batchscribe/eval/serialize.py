"""report.json: every figure and setting of a report (and of a comparison), as strict JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from batchscribe.eval.compare import Comparison
from batchscribe.eval.report import GroupRow, Item, Report
from batchscribe.eval.wer import Counts, aligned_lines


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def counts_dict(c: Counts) -> dict[str, Any]:
    # Not asdict(): its deep copy was most of the time of a large report's items.
    return {"hits": c.hits, "substitutions": c.substitutions, "deletions": c.deletions, "insertions": c.insertions,
            "errors": c.errors, "n_ref": c.n_ref, "rate": finite_or_none(c.rate)}


def _group_dict(row: GroupRow) -> dict[str, Any]:
    return {"key": row.key, "items": row.items, "wer": finite_or_none(row.wer), "cer": finite_or_none(row.chars.rate),
            "words": counts_dict(row.words), "chars": counts_dict(row.chars)}


def _item_dict(item: Item, with_alignment: bool = False) -> dict[str, Any]:
    """An item's figures, strict JSON already (report_json does not walk the items again)."""
    out: dict[str, Any] = {
        "id": item.id, "status": item.status, "wer": finite_or_none(item.wer), "cer": finite_or_none(item.chars.rate),
        "words": counts_dict(item.words), "chars": counts_dict(item.chars),
        "duration": finite_or_none(item.duration) if isinstance(item.duration, float) else item.duration,
        "groups": _finite_json(item.groups), "reference": item.reference, "hypothesis": item.hypothesis,
        "ref_norm": item.ref_norm, "hyp_norm": item.hyp_norm,
    }
    if item.error is not None:
        out["error"] = item.error
    if with_alignment:
        ref, hyp, ops = aligned_lines(item.alignment)
        out["aligned"] = {"ref": ref, "hyp": hyp, "ops": ops}
    return out


def report_dict(report: Report, comparison: Comparison | None = None) -> dict[str, Any]:
    """Everything in report.json: settings, model, versions, figures, every item and every list."""
    status = [i.status for i in report.items]
    out: dict[str, Any] = {
        "settings": asdict(report.settings),
        "model": report.model,
        "versions": report.versions,
        "run_summary": report.run_summary,
        "corpus": {
            "items": len(report.items), "ok": status.count("ok"), "errors": status.count("error"),
            "missing": status.count("missing"), "wer": finite_or_none(report.wer),
            "wer_ci95": list(report.ci) if report.ci else None, "cer": finite_or_none(report.cer),
            "words": counts_dict(report.words), "chars": counts_dict(report.chars),
        },
        "by_duration": [_group_dict(r) for r in report.durations],
        "by_group": {col: [_group_dict(r) for r in rows] for col, rows in report.groups.items()},
        "worst": [_item_dict(i, with_alignment=True) for i in report.worst()],
        "missing": list(report.missing),
        "errors": [{"id": i.id, "error": i.error} for i in report.errors],
        "unmatched_predictions": list(report.unmatched_predictions),
        "no_reference_text": list(report.no_reference_text),
        "duplicate_predictions": list(report.duplicate_predictions),
        "items": [_item_dict(i) for i in report.items],
    }
    if comparison is not None:
        out["comparison"] = comparison_dict(comparison)
    return out


def comparison_dict(c: Comparison) -> dict[str, Any]:
    d = asdict(c)
    d["ci"] = list(c.ci) if c.ci else None
    # counts at the top level, where a reader compares them; the items under *_items
    d["wins_a"], d["wins_b"] = len(c.wins_a), len(c.wins_b)
    d["wins_a_items"], d["wins_b_items"] = [asdict(x) for x in c.wins_a], [asdict(x) for x in c.wins_b]
    for key in ("wer_a", "wer_b", "diff"):
        d[key] = finite_or_none(d[key])
    return d


def _finite_json(value: Any) -> Any:
    """NaN/inf (e.g. from a run summary) -> null, so report.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v) for v in value]
    return value


def report_json(report: Report, comparison: Comparison | None = None) -> str:
    """The text of report.json (without its final newline): indented, except that each of
    `items` takes one line. json's indenting encoder is pure Python, and over thousands of items
    it took longer than scoring them; one item a line goes through its C encoder."""
    out = report_dict(report, comparison)
    items = out.pop("items")
    head = json.dumps(_finite_json(out), indent=1, ensure_ascii=False, allow_nan=False, default=str)
    if not items:
        return head[:-2] + ',\n "items": []\n}'
    lines = ",\n  ".join(json.dumps(i, ensure_ascii=False, allow_nan=False, default=str) for i in items)
    return head[:-2] + ',\n "items": [\n  ' + lines + "\n ]\n}"
