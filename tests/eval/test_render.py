"""write_report: report.json holds every figure (strict JSON, checked against jiwer) and report.md
its tables."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import jiwer
import pytest

from batchscribe.eval.normalize import basic_normalize
from batchscribe.eval.render import write_report
from batchscribe.eval.report import evaluate
from batchscribe.eval.tables import summary_rows
from tests.eval.sample_runs import HYPS_B, REFS, run_dir


def test_write_report_files_hold_every_figure(tmp_path: Path, refs: Path) -> None:
    err = [{"id": "w5-bad", "error": "w5-bad: unreadable", "duration": None}]
    run = run_dir(tmp_path, "a", {k: v for k, v in HYPS_B.items() if k != "w4"}, extra=err)
    report = evaluate(run, [str(refs)], normalizer="basic", group_columns=["book"], worst_n=3, bootstrap=100)
    paths = write_report(report, tmp_path / "report")
    assert {p.name for p in paths.values()} == {"report.json", "report.md", "report.html"}

    def no_nan(token: str) -> float:
        raise AssertionError(f"non-JSON constant {token} in report.json")

    data = json.loads(paths["json"].read_text(), parse_constant=no_nan)
    ids = list(REFS)
    hyps = [HYPS_B.get(i, "") if i != "w4" else "" for i in ids]
    expected = jiwer.process_words([basic_normalize(REFS[i]) for i in ids], [basic_normalize(h) for h in hyps])
    assert data["corpus"]["wer"] == pytest.approx(expected.wer)
    assert data["corpus"]["words"]["deletions"] == expected.deletions
    lo, hi = data["corpus"]["wer_ci95"]
    assert lo <= data["corpus"]["wer"] <= hi
    assert data["model"] == "model-a" and data["versions"]["jiwer"] == metadata.version("jiwer")
    assert data["settings"]["normalizer"] == "basic" and data["settings"]["bootstrap"] == 100
    assert data["missing"] == ["w4"] and data["unmatched_predictions"] == ["w5-bad"]
    assert len(data["items"]) == 5 and len(data["worst"]) == 3
    assert {r["key"] for r in data["by_group"]["book"]} == {"True", "False"}
    assert data["worst"][0]["aligned"]["ref"].split() == basic_normalize(REFS[data["worst"][0]["id"]]).split()

    md = paths["md"].read_text()
    assert "## By book" in md and "## Missing predictions" in md and "REF: " in md
    assert "| WER |" in md
    labels = [label for label, _ in summary_rows(report)]
    assert labels[:2] == ["Items", "WER"]
