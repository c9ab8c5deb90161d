"""`write_report`: report.json, report.md and report.html of one evaluation, each replaced whole."""

from __future__ import annotations

import os
from pathlib import Path

from batchscribe.eval.compare import Comparison
from batchscribe.eval.html import html_report
from batchscribe.eval.markdown import markdown
from batchscribe.eval.report import Report
from batchscribe.eval.serialize import report_json


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a report
    return path


def write_report(report: Report, out_dir: Path | str, comparison: Comparison | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into `out_dir`; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "json": _write(out / "report.json", report_json(report, comparison) + "\n"),
        "md": _write(out / "report.md", markdown(report, comparison)),
        "html": _write(out / "report.html", html_report(report, comparison)),
    }
