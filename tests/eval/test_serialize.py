"""report.json's text (eval/serialize): the same JSON as json's own indented dump of the report's
figures, with each item on one line; strict JSON with non-finite numbers as null."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from batchscribe.eval.report import evaluate
from batchscribe.eval.serialize import _finite_json, report_dict, report_json
from tests.eval.sample_runs import HYPS_B, run_dir


def _no_constants(token: str) -> float:
    raise AssertionError(f"non-JSON constant {token} in report.json")


def test_report_json_is_the_reports_json_one_item_a_line(tmp_path: Path, refs: Path) -> None:
    err = [{"id": "w5-bad", "error": "w5-bad: unreadable", "duration": None}]
    report = evaluate(run_dir(tmp_path, "a", HYPS_B, extra=err), [str(refs)], normalizer="basic",
                      group_columns=["book"], worst_n=2, bootstrap=50)  # fmt: skip
    # A NaN from outside (a run summary's figure) and one in an item's group value.
    item = dataclasses.replace(report.items[0], groups={**report.items[0].groups, "score": math.nan})
    report = dataclasses.replace(report, items=(item, *report.items[1:]),
                                 run_summary={**(report.run_summary or {}), "rtfx": math.inf})  # fmt: skip
    text = report_json(report)
    expected = json.loads(json.dumps(_finite_json(report_dict(report)), indent=1, ensure_ascii=False, default=str))
    assert json.loads(text, parse_constant=_no_constants) == expected
    assert expected["items"][0]["groups"]["score"] is None and expected["run_summary"]["rtfx"] is None
    lines = text.splitlines()
    start = lines.index(' "items": [')
    assert lines[start + 1 : start + 1 + len(report.items)] == [
        "  " + json.dumps(i, ensure_ascii=False) + ("," if k < len(report.items) - 1 else "")
        for k, i in enumerate(expected["items"])
    ]


def test_report_json_without_items(tmp_path: Path, refs: Path) -> None:
    report = evaluate(run_dir(tmp_path, "a", HYPS_B), [str(refs)], normalizer="basic", bootstrap=10)
    empty = dataclasses.replace(report, items=())
    assert json.loads(report_json(empty), parse_constant=_no_constants)["items"] == []
