"""compare(): per-item wins and losses and the paired bootstrap interval, against jiwer."""

from __future__ import annotations

import json
from pathlib import Path

import jiwer
import pytest

from batchscribe.eval.compare import compare
from batchscribe.eval.report import evaluate
from batchscribe.eval.tables import comparison_rows
from tests.eval.sample_runs import HYPS_A, HYPS_B, REFS, run_dir


def test_compare_counts_wins_losses_and_paired_interval(tmp_path: Path, refs: Path) -> None:
    ra = evaluate(run_dir(tmp_path, "a", HYPS_A), [str(refs)], normalizer="basic", bootstrap=400)
    rb = evaluate(run_dir(tmp_path, "b", HYPS_B), [str(refs)], normalizer="basic", bootstrap=400)
    c = compare(ra, rb, name_a="A", name_b="B")
    assert [x.id for x in c.wins_a] == ["w2", "w1"]  # biggest margin first: w2 (0 vs 3), w1 (0 vs 2)
    assert [x.id for x in c.wins_b] == ["w3"]
    assert c.ties == 2 and c.n_items == 5
    ids = list(REFS)
    wer_a = jiwer.wer([REFS[i] for i in ids], [HYPS_A[i] for i in ids])
    wer_b = jiwer.wer([REFS[i] for i in ids], [HYPS_B[i] for i in ids])
    assert c.wer_a == pytest.approx(wer_a) and c.wer_b == pytest.approx(wer_b)
    assert c.diff == pytest.approx(wer_a - wer_b)
    assert c.ci is not None and c.ci[0] <= c.diff <= c.ci[1]
    self_c = compare(ra, ra)  # a system against itself: every resample differs by exactly 0
    assert self_c.ci == (0.0, 0.0) and self_c.ties == 5 and not self_c.wins_a
    assert any("better" in label for label, _ in comparison_rows(c))


def test_compare_refuses_different_references(tmp_path: Path, refs: Path) -> None:
    ra = evaluate(run_dir(tmp_path, "a", HYPS_A), [str(refs)], normalizer="basic", bootstrap=0)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": k, "text": v + " extra"}) + "\n" for k, v in REFS.items()))
    rb = evaluate(run_dir(tmp_path, "b", HYPS_B), [str(other)], normalizer="basic", bootstrap=0)
    with pytest.raises(ValueError, match="same --references"):
        compare(ra, rb)
