"""evaluate() joins predictions to references; here the references come from the records' own
`reference` field (the full figures are checked in test_wer.py, the files in test_render.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jiwer
import pytest

from batchscribe.eval.report import evaluate
from tests.eval.sample_runs import HYPS_B, REFS


def test_references_default_to_the_records_reference_field(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    rows = [{"id": k, "text": HYPS_B[k], "reference": v, "speaker": "s1"} for k, v in REFS.items()]
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = evaluate(out, [], normalizer="none", group_columns=["speaker"], bootstrap=0)
    ids = list(REFS)
    assert report.wer == pytest.approx(jiwer.wer([REFS[i] for i in ids], [HYPS_B[i] for i in ids]))
    assert [r.key for r in report.groups["speaker"]] == ["s1"]
