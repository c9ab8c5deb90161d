"""`write_report`: report.json, report.md and report.html of one evaluation, written as a set.

All three are written in full to temp names first, and only then renamed over the old ones, so an
eval killed while rendering or writing leaves the old set untouched (the renames take
microseconds, the writing is what takes time). An output that cannot be written raises
EvalOutputError naming the path and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from batchscribe.eval.compare import Comparison
from batchscribe.eval.html import html_report
from batchscribe.eval.markdown import markdown
from batchscribe.eval.report import Report
from batchscribe.eval.serialize import report_json

REPORT_NAMES = {"json": "report.json", "md": "report.md", "html": "report.html"}


class EvalOutputError(OSError):
    """The report folder cannot be written; the message names the path and the fix."""


def write_report(report: Report, out_dir: Path | str, comparison: Comparison | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into `out_dir`; returns name -> path."""
    out = Path(out_dir)
    texts = {"json": report_json(report, comparison) + "\n", "md": markdown(report, comparison),
             "html": html_report(report, comparison)}  # rendered before anything is written
    temps = {kind: out / f".{name}.{os.getpid()}.tmp" for kind, name in REPORT_NAMES.items()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for kind, text in texts.items():
            with open(temps[kind], "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for kind, name in REPORT_NAMES.items():
            os.replace(temps[kind], out / name)
    except OSError as exc:
        for tmp in temps.values():
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        where = exc.filename or out
        raise EvalOutputError(
            f"cannot write the report into {out} ({exc.strerror or exc}: {where}); fix its permissions or "
            "free space, or choose another --output"
        ) from exc
    return {kind: out / name for kind, name in REPORT_NAMES.items()}
