"""Plain table rows and cell formats shared by every view of a report: the CLI's terminal table
(drawn with rich there), report.md and report.html."""

from __future__ import annotations

import math

from batchscribe.eval.compare import Comparison
from batchscribe.eval.report import GroupRow, Report

Rows = list[list[str]]
GROUP_HEADER = ["group", "items", "words", "WER", "S", "D", "I", "CER"]


def pct(x: float | None, digits: int = 2) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.{digits}f}%"


def ci_text(ci: tuple[float, float] | None) -> str:
    return f"[{pct(ci[0])}, {pct(ci[1])}]" if ci else "n/a"


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


def group_rows(rows: tuple[GroupRow, ...]) -> Rows:
    """One row per group, in GROUP_HEADER's column order."""
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
