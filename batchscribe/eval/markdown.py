"""report.md: the report's tables and worst items as GitHub-flavoured Markdown."""

from __future__ import annotations

from batchscribe.eval.compare import Comparison
from batchscribe.eval.report import Report
from batchscribe.eval.tables import GROUP_HEADER, Rows, comparison_rows, group_rows, pct, summary_rows
from batchscribe.eval.wer import aligned_lines


def _md_table(header: list[str], rows: Rows) -> str:
    # a "|" or a newline in an id or an error message would otherwise end the cell or the row
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
            ref, hyp, ops = aligned_lines(item.alignment)
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
