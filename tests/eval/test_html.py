"""report.html: self-contained (no external resources, no scripts), charts as inline SVG, and it
renders in a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from batchscribe.eval.render import write_report
from batchscribe.eval.report import evaluate
from tests.eval.sample_runs import HYPS_A, run_dir


def test_html_is_self_contained_with_embedded_charts(tmp_path: Path, refs: Path) -> None:
    report = evaluate(run_dir(tmp_path, "a", HYPS_A), [str(refs)], group_columns=["book"], bootstrap=50)
    html_path = write_report(report, tmp_path / "r")["html"]
    html = html_path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I), "external reference"
    assert "http://" not in html and "https://" not in html and "<script" not in html.lower()
    assert "@import" not in html and "url(" not in html
    # the three charts (duration, group, histogram) are inline SVG in the file itself
    assert html.count("<svg") == 3 and html.count("</svg>") == 3


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_html_renders_in_headless_chromium(tmp_path: Path, refs: Path) -> None:
    report = evaluate(run_dir(tmp_path, "a", HYPS_A), [str(refs)], bootstrap=50)
    html_path = write_report(report, tmp_path / "r")["html"]
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         f"--screenshot={shot}", "--window-size=1200,1600", html_path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a real picture, not a blank error page
