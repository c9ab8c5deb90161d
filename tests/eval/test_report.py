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


def test_scoring_over_worker_processes_equals_one_process(tmp_path: Path, monkeypatch) -> None:
    """Past PARALLEL_ITEMS the items are scored in worker processes: the same items, in the same
    order, with the same figures as scoring them here; errors and groups survive the slimmed
    records the workers get."""
    from batchscribe.eval import report as report_module

    out = tmp_path / "run"
    out.mkdir()
    rows = []
    for k in range(37):
        for key, ref in REFS.items():
            rec = {"id": f"{key}-{k}", "reference": ref, "speaker": f"s{k % 3}", "duration": 1.0 + k,
                   "segments": [{"tokens": list(range(50))}]}  # fmt: skip
            rec.update({"error": "decode failed"} if k == 5 else {"text": HYPS_B[key]})
            rows.append(rec)
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    here = evaluate(out, [], group_columns=["speaker"], bootstrap=0)
    monkeypatch.setattr(report_module, "PARALLEL_ITEMS", 10)
    monkeypatch.setattr(report_module, "CHUNK_ITEMS", 40)
    monkeypatch.setattr(report_module.os, "cpu_count", lambda: 4)
    spawned = []
    real_pool = report_module.ProcessPoolExecutor
    monkeypatch.setattr(report_module, "ProcessPoolExecutor", lambda *a, **kw: spawned.append(a) or real_pool(*a, **kw))
    pooled = evaluate(out, [], group_columns=["speaker"], bootstrap=0)
    assert spawned == [(4,)]  # min(cpu_count, chunks) workers
    assert pooled.items == here.items and len(here.items) == 185
    assert pooled.wer == here.wer
    assert sum(i.status == "error" for i in pooled.items) == 5
    assert [r.key for r in pooled.groups["speaker"]] == [r.key for r in here.groups["speaker"]]
