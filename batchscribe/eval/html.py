"""report.html: one self-contained file (inline CSS, inline SVG charts, no scripts, no external
resources), so it can be mailed or attached as is. Charts are drawn here as SVG rather than with
matplotlib, which keeps the package free of a plotting dependency."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from batchscribe.eval.compare import Comparison
from batchscribe.eval.report import GroupRow, Report
from batchscribe.eval.tables import GROUP_HEADER, comparison_rows, group_rows, pct, summary_rows
from batchscribe.eval.wer import aligned_lines

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.9em}.ids{font-family:monospace;font-size:.85em}
.chart{margin:.5em 0 1em 0}
"""
_BAR = "#4e79a7"


def _short(label: str, width: int = 24) -> str:
    # keep the end: for file paths and long ids the distinguishing part is last
    return label if len(label) <= width else "…" + label[-(width - 1):]


def bar_chart(labels: Sequence[str], values: Sequence[float], title: str, y_label: str = "WER",
              annotations: Sequence[str] | None = None, as_percent: bool = True) -> str:
    """A vertical bar chart as an inline <svg>; non-finite values are drawn as empty slots."""
    n = max(len(values), 1)
    width, height, left, bottom, top = max(420, 46 * n + 90), 300, 60, 90, 34
    plot_w, plot_h = width - left - 20, height - top - bottom
    finite = [v for v in values if math.isfinite(v)]
    vmax = max(finite, default=0.0) or 1.0  # all zero or none finite: a unit axis, not a division by zero
    if not as_percent:  # counts: whole-number grid lines
        vmax = float(math.ceil(vmax / 4) * 4)
    slot = plot_w / n
    out = [f'<svg width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" class="chart">',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
           f'{escape(title)}</text>']
    for k in range(5):  # horizontal grid lines with axis labels
        v = vmax * k / 4
        y = top + plot_h - plot_h * k / 4
        label = pct(v, 1) if as_percent else f"{v:g}"
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    for i, (label, v) in enumerate(zip(labels, values)):
        x = left + i * slot
        if math.isfinite(v):
            h = plot_h * v / vmax
            out.append(f'<rect x="{x + slot * 0.15:.1f}" y="{top + plot_h - h:.1f}" width="{slot * 0.7:.1f}" '
                       f'height="{h:.1f}" fill="{_BAR}"><title>{escape(label)}: '
                       f'{pct(v) if as_percent else f"{v:g}"}</title></rect>')
        if annotations:
            bar_top = top + plot_h - (plot_h * v / vmax if math.isfinite(v) else 0)
            out.append(f'<text x="{x + slot / 2:.1f}" y="{bar_top - 4:.1f}" '
                       f'text-anchor="middle" font-size="10" fill="#555">{escape(annotations[i])}</text>')
        cx, cy = x + slot / 2, top + plot_h + 12
        out.append(f'<text x="{cx:.1f}" y="{cy:.1f}" font-size="11" text-anchor="end" '
                   f'transform="rotate(-40 {cx:.1f} {cy:.1f})">{escape(_short(label))}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>')
    out.append(f'<text x="14" y="{top + plot_h / 2:.1f}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{escape(y_label)}</text></svg>')
    return "".join(out)


def histogram(values: Sequence[float], title: str, n_bins: int = 20, cap: float = 1.0) -> str:
    """Per-item WER histogram; values above `cap` (and empty-reference infinities) share the last bin."""
    counts = [0] * n_bins
    for v in values:
        b = n_bins - 1 if not math.isfinite(v) or v >= cap else int(v / cap * n_bins)
        counts[b] += 1
    labels = [f"{100 * cap * b / n_bins:.0f}-{100 * cap * (b + 1) / n_bins:.0f}%" for b in range(n_bins)]
    labels[-1] = f">={100 * cap * (n_bins - 1) / n_bins:.0f}%"
    return bar_chart(labels, [float(c) for c in counts], title, y_label="items",
                     annotations=[str(c) if c else "" for c in counts], as_percent=False)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _group_section(title: str, rows: tuple[GroupRow, ...], max_bars: int = 40) -> str:
    shown = rows if len(rows) <= max_bars else tuple(sorted(rows, key=lambda r: -r.words.n_ref)[:max_bars])
    note = "" if shown is rows else f"<p>Chart: the {max_bars} groups with the most reference words.</p>"
    chart = bar_chart([r.key for r in shown], [r.wer for r in shown], f"WER {title}",
                      annotations=[f"n={r.items}" for r in shown])
    return f"<h2>WER {escape(title)}</h2>{chart}{note}{_table(GROUP_HEADER, group_rows(rows))}"


def _ids(title: str, ids: Sequence[str]) -> str:
    if not ids:
        return ""
    return f'<h2>{escape(title)} ({len(ids)})</h2><p class="ids">{escape(", ".join(ids))}</p>'


def html_report(report: Report, comparison: Comparison | None = None) -> str:
    parts = [f"<h1>WER report</h1>{_table(['', ''], [list(r) for r in summary_rows(report)])}",
             f"<p>Predictions: {escape(', '.join(report.settings.predictions))}<br>References: "
             f"{escape(', '.join(report.settings.references) or '(the records’ reference field)')}</p>"]
    if comparison is not None:
        parts.append(f"<h2>Comparison</h2>{_table(['', ''], [list(r) for r in comparison_rows(comparison)])}")
    parts.append(_group_section("by duration", report.durations))
    for col, rows in report.groups.items():
        parts.append(_group_section(f"by {col}", rows))
    parts.append(f"<h2>Per-item WER</h2>{histogram([i.wer for i in report.items], 'Items by WER')}")
    worst = report.worst()
    if worst:
        parts.append(f"<h2>Worst {len(worst)} items</h2>")
        for item in worst:
            ref, hyp, ops = aligned_lines(item.alignment)
            parts.append(f"<p><b>{escape(item.id)}</b>: WER {pct(item.wer)} ({item.words.errors} errors, "
                         f"{escape(item.status)})</p>"
                         f"<pre>REF: {escape(ref)}\nHYP: {escape(hyp)}\n     {escape(ops)}</pre>")
    parts.append(_ids("Missing predictions (scored as all deletions)", report.missing))
    if report.errors:
        parts.append(f"<h2>Error records (scored as all deletions) ({len(report.errors)})</h2>"
                     + _table(["id", "error"], [[i.id, i.error or ""] for i in report.errors]))
    parts.append(_ids("Predictions without a reference (not scored)", report.unmatched_predictions))
    parts.append(_ids("References without text (not scored)", report.no_reference_text))
    parts.append(_ids("Duplicate prediction ids (first record used)", report.duplicate_predictions))
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items() if v)
    parts.append(f"<p style='color:#777;font-size:.85em'>Normalizer {escape(report.settings.normalizer)}; "
                 f"bootstrap {report.settings.bootstrap} resamples, seed {report.settings.seed}; "
                 f"{escape(versions)}</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>WER report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
