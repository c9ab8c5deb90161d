"""Report outputs: report.json (every figure and setting), report.md (tables), plain rows for a
terminal table (the CLI draws them with rich), and `write_report` which also writes report.html."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchscribe.eval import wer
from batchscribe.eval.compare import Comparison
from batchscribe.eval.report import GroupRow, Item, Report, counts_dict, finite_or_none

Rows = list[list[str]]


def pct(x: float | None, digits: int = 2) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.{digits}f}%"


def ci_text(ci: tuple[float, float] | None) -> str:
    return f"[{pct(ci[0])}, {pct(ci[1])}]" if ci else "n/a"


def _group_dict(row: GroupRow) -> dict[str, Any]:
    return {"key": row.key, "items": row.items, "wer": finite_or_none(row.wer), "cer": finite_or_none(row.chars.rate),
            "words": counts_dict(row.words), "chars": counts_dict(row.chars)}


def _item_dict(item: Item, with_alignment: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item.id, "status": item.status, "wer": finite_or_none(item.wer), "cer": finite_or_none(item.chars.rate),
        "words": counts_dict(item.words), "chars": counts_dict(item.chars), "duration": item.duration,
        "groups": item.groups, "reference": item.reference, "hypothesis": item.hypothesis,
        "ref_norm": item.ref_norm, "hyp_norm": item.hyp_norm,
    }
    if item.error is not None:
        out["error"] = item.error
    if with_alignment:
        ref, hyp, ops = wer.aligned_lines(item.alignment)
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
    d["wins_a"], d["wins_b"] = len(c.wins_a), len(c.wins_b)
    d["wins_a_items"], d["wins_b_items"] = [asdict(x) for x in c.wins_a], [asdict(x) for x in c.wins_b]
    for key in ("wer_a", "wer_b", "diff"):
        d[key] = finite_or_none(d[key])
    return d


# ----------------------------------------------------------------------------- plain table rows


def summary_rows(report: Report) -> list[tuple[str, str]]:
    """(label, value) pairs for the terminal summary table."""
    s, w = report.settings, report.words
    status = [i.status for i in report.items]
    rows = [
        ("Items", f"{len(report.items)} ({status.count('ok')} ok, {status.count('error')} error records, "
                  f"{status.count('missing')} missing)"),
        ("WER", f"{pct(report.wer)}  95% CI {ci_text(report.ci)}"),
        ("CER", pct(report.cer)),
        ("Reference words", str(w.n_ref)),
        ("Substitutions / deletions / insertions", f"{w.substitutions} / {w.deletions} / {w.insertions}"),
        ("Normalizer", s.normalizer),
    ]
    if report.model is not None:
        # run's summary.json holds {"name": ..., "info": ...}; show the name
        model = report.model.get("name", report.model) if isinstance(report.model, dict) else report.model
        rows.append(("Model", str(model)))
    if report.unmatched_predictions:
        rows.append(("Predictions without reference", str(len(report.unmatched_predictions))))
    if report.no_reference_text:
        rows.append(("References without text", str(len(report.no_reference_text))))
    return rows


GROUP_HEADER = ["group", "items", "words", "WER", "S", "D", "I", "CER"]


def group_rows(rows: tuple[GroupRow, ...]) -> Rows:
    return [[r.key, str(r.items), str(r.words.n_ref), pct(r.wer), str(r.words.substitutions),
             str(r.words.deletions), str(r.words.insertions), pct(r.chars.rate)] for r in rows]


def comparison_rows(c: Comparison) -> list[tuple[str, str]]:
    return [
        ("Items compared", str(c.n_items)),
        (f"WER {c.name_a}", pct(c.wer_a)),
        (f"WER {c.name_b}", pct(c.wer_b)),
        (f"WER {c.name_a} - {c.name_b}", f"{pct(c.diff)}  95% CI {ci_text(c.ci)} (paired bootstrap)"),
        (f"Items {c.name_a} better / {c.name_b} better / tied", f"{len(c.wins_a)} / {len(c.wins_b)} / {c.ties}"),
    ]


# ----------------------------------------------------------------------------- markdown


def _md_table(header: list[str], rows: Rows) -> str:
    esc = [[cell.replace("|", "\\|").replace("\n", " ") for cell in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc])


def _id_list(title: str, ids: list[str] | tuple[str, ...], limit: int = 200) -> str:
    if not ids:
        return ""
    shown = ", ".join(f"`{i}`" for i in ids[:limit])
    more = f" and {len(ids) - limit} more (see report.json)" if len(ids) > limit else ""
    return f"\n## {title} ({len(ids)})\n\n{shown}{more}\n"


def markdown(report: Report, comparison: Comparison | None = None) -> str:
    parts = ["# WER report\n", _md_table(["", ""], [list(r) for r in summary_rows(report)])]
    parts.append(f"\nPredictions: {', '.join(report.settings.predictions)}  \n"
                 f"References: {', '.join(report.settings.references) or '(the records’ reference field)'}\n")
    if comparison is not None:
        parts += ["\n## Comparison\n", _md_table(["", ""], [list(r) for r in comparison_rows(comparison)])]
    parts += ["\n## By duration\n", _md_table(GROUP_HEADER, group_rows(report.durations))]
    for col, rows in report.groups.items():
        parts += [f"\n## By {col}\n", _md_table(GROUP_HEADER, group_rows(rows))]
    worst = report.worst()
    if worst:
        parts.append(f"\n## Worst {len(worst)} items\n")
        for item in worst:
            ref, hyp, ops = wer.aligned_lines(item.alignment)
            parts.append(f"\n**{item.id}**: WER {pct(item.wer)} ({item.words.errors} errors, {item.status})\n\n"
                         f"```\nREF: {ref}\nHYP: {hyp}\n     {ops}\n```\n")
    parts.append(_id_list("Missing predictions (scored as all deletions)", report.missing))
    if report.errors:
        parts.append(f"\n## Error records (scored as all deletions) ({len(report.errors)})\n\n"
                     + _md_table(["id", "error"], [[i.id, i.error or ""] for i in report.errors]) + "\n")
    parts.append(_id_list("Predictions without a reference (not scored)", report.unmatched_predictions))
    parts.append(_id_list("References without text (not scored)", report.no_reference_text))
    parts.append(_id_list("Duplicate prediction ids (first record used)", report.duplicate_predictions))
    return "\n".join(p for p in parts if p) + "\n"


# ----------------------------------------------------------------------------- files


def _finite_json(value: Any) -> Any:
    """NaN/inf (e.g. from a run summary) -> null, so report.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v) for v in value]
    return value


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a report
    return path


def write_report(report: Report, out_dir: Path | str, comparison: Comparison | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into `out_dir`; returns name -> path."""
    from batchscribe.eval.html import html_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = json.dumps(_finite_json(report_dict(report, comparison)), indent=1, ensure_ascii=False, allow_nan=False, default=str)
    return {
        "json": _write(out / "report.json", data + "\n"),
        "md": _write(out / "report.md", markdown(report, comparison)),
        "html": _write(out / "report.html", html_report(report, comparison)),
    }
