"""write_report: report.json holds every figure (strict JSON, checked against jiwer) and report.md
its tables."""

from __future__ import annotations

import json
import os
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


def test_a_report_set_is_replaced_whole_or_not_at_all(tmp_path: Path, refs: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from batchscribe.eval import render

    run = run_dir(tmp_path, "a", HYPS_B)
    report = evaluate(run, [str(refs)], normalizer="basic", bootstrap=0)
    out = tmp_path / "report"
    write_report(report, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_open = open

    def full_disk(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith(f".report.html.{os.getpid()}.tmp"):
            raise OSError(28, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_disk)  # the last file of the set cannot be written
    with pytest.raises(render.EvalOutputError, match=f"cannot write the report into {out}.*No space left"):
        write_report(evaluate(run_dir(tmp_path, "b", {}), [str(refs)], normalizer="basic", bootstrap=0), out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old set, nothing half-new


def test_an_unwritable_report_folder_is_exit_2_naming_it(tmp_path: Path, refs: Path) -> None:
    from typer.testing import CliRunner

    from batchscribe.cli import app

    run = run_dir(tmp_path, "a", HYPS_B)
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["eval", str(run), "--references", str(refs), "-o", str(blocker / "rep"),
                                      "--bootstrap", "0"], env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"cannot write the report into {blocker / 'rep'}" in result.output and "choose another --output" in result.output
