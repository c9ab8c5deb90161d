"""Corpus figures against jiwer on strings normalised independently with openai-whisper's normaliser."""

from __future__ import annotations

import json
from pathlib import Path

import jiwer
import numpy as np
import pytest

from batchscribe.eval import evaluate
from batchscribe.eval.wer import bootstrap_rates, duration_bucket, interval, score

whisper_norm = pytest.importorskip("whisper.normalizers")

REFS = {
    "a": "Mr. Smith paid twenty-one dollars for the colour TV.",
    "b": "Uh, we reached almost 64 billion in revenue, um, last year.",
    "c": "It's one hundred and five percent certain.",
    "d": "The quick brown fox jumps over the lazy dog.",
    "e": "Hello there, general Kenobi!",
    "f": "Short one.",
}
HYPS = {
    "a": "Mister Smith paid $21 for the color TV",
    "b": "We reached almost sixty four billion in revenue last year",
    "c": "its 105% certain",
    "d": "the quick brown fox jumped over a lazy lazy dog",
    # "e": no prediction at all; "f": an error record
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def crafted(tmp_path: Path) -> tuple[Path, Path]:
    recs = [{"id": k, "text": v, "duration": 3.0 + i, "language": "english", "segments": []}
            for i, (k, v) in enumerate(HYPS.items())]
    recs.append({"id": "f", "error": "f: could not decode audio; re-encode the file", "duration": None})
    recs.append({"id": "stray", "text": "not in the references", "duration": 1.0})
    preds = write_jsonl(tmp_path / "out" / "records-00000.jsonl", recs)
    refs = write_jsonl(tmp_path / "refs.jsonl", [{"id": k, "text": v, "spk": k in "abc"} for k, v in REFS.items()])
    return preds.parent, refs


def test_corpus_wer_equals_jiwer_on_whisper_normalised_strings(crafted: tuple[Path, Path]) -> None:
    preds, refs = crafted
    report = evaluate(preds, [str(refs)], normalizer="english", bootstrap=0)
    norm = whisper_norm.EnglishTextNormalizer()
    ids = list(REFS)
    ref_n = [norm(REFS[i]) for i in ids]
    hyp_n = [norm(HYPS.get(i, "")) for i in ids]  # missing and error items: empty hypothesis
    words = jiwer.process_words(ref_n, hyp_n)
    chars = jiwer.process_characters(ref_n, hyp_n)
    assert report.wer == pytest.approx(words.wer, abs=1e-12)
    assert report.cer == pytest.approx(chars.cer, abs=1e-12)
    assert (report.words.substitutions, report.words.deletions, report.words.insertions) == (
        words.substitutions, words.deletions, words.insertions)
    for item, r, h in zip(report.items, ref_n, hyp_n):
        assert item.wer == pytest.approx(jiwer.wer(r, h), abs=1e-12)


def test_basic_normaliser_corpus_wer(crafted: tuple[Path, Path]) -> None:
    preds, refs = crafted
    report = evaluate(preds, [str(refs)], normalizer="basic", bootstrap=0)
    norm = whisper_norm.BasicTextNormalizer()
    ids = list(REFS)
    expected = jiwer.wer([norm(REFS[i]) for i in ids], [norm(HYPS.get(i, "")) for i in ids])
    assert report.wer == pytest.approx(expected, abs=1e-12)


def test_error_and_missing_items_are_all_deletions_and_listed(crafted: tuple[Path, Path]) -> None:
    preds, refs = crafted
    report = evaluate(preds, [str(refs)], bootstrap=0)
    by_id = {i.id: i for i in report.items}
    norm = whisper_norm.EnglishTextNormalizer()
    for rid, status in (("e", "missing"), ("f", "error")):
        n_words = len(norm(REFS[rid]).split())
        item = by_id[rid]
        assert item.status == status
        assert (item.words.deletions, item.words.hits, item.words.substitutions, item.words.insertions) == (
            n_words, 0, 0, 0)
        assert item.wer == 1.0
    assert report.missing == ("e",)
    assert [i.id for i in report.errors] == ["f"] and "could not decode" in (report.errors[0].error or "")
    assert report.unmatched_predictions == ("stray",)
    assert len(report.items) == len(REFS)  # every reference is scored, none dropped


def test_groups_and_duration_buckets_sum_to_jiwer_on_subsets(crafted: tuple[Path, Path]) -> None:
    preds, refs = crafted
    report = evaluate(preds, [str(refs)], group_columns=["spk"], bootstrap=0)
    norm = whisper_norm.EnglishTextNormalizer()
    rows = {r.key: r for r in report.groups["spk"]}
    for key, ids in (("True", "abc"), ("False", "def")):
        expected = jiwer.wer([norm(REFS[i]) for i in ids], [norm(HYPS.get(i, "")) for i in ids])
        assert rows[key].wer == pytest.approx(expected, abs=1e-12) and rows[key].items == 3
    buckets = {r.key: r.items for r in report.durations}
    assert buckets == {"2-5 s": 2, "5-10 s": 2, "unknown": 2}  # durations 3,4,5,6; e/f have none
    assert sum(r.words.n_ref for r in report.durations) == report.words.n_ref


def test_bootstrap_interval_contains_estimate_and_is_seed_deterministic(crafted: tuple[Path, Path]) -> None:
    preds, refs = crafted
    r1 = evaluate(preds, [str(refs)], bootstrap=500, seed=7)
    r2 = evaluate(preds, [str(refs)], bootstrap=500, seed=7)
    r3 = evaluate(preds, [str(refs)], bootstrap=500, seed=8)
    assert r1.ci is not None and r1.ci[0] <= r1.wer <= r1.ci[1]
    assert r1.ci[0] < r1.ci[1]
    assert r1.ci == r2.ci
    assert r1.ci != r3.ci


def test_bootstrap_matches_a_plain_loop_and_does_not_depend_on_chunking() -> None:
    rng = np.random.default_rng(0)
    n_ref = rng.integers(1, 30, size=50)
    errors = rng.binomial(n_ref, 0.2)
    big = bootstrap_rates(errors, n_ref, 300, seed=3)
    small = bootstrap_rates(errors, n_ref, 300, seed=3, chunk_cells=50 * 7)  # 7 resamples a chunk
    # The same stream of indices is drawn either way, so chunking changes nothing.
    idx = np.random.default_rng(3).integers(0, 50, size=(300, 50))
    loop = np.array([errors[i].sum() / n_ref[i].sum() for i in idx])
    np.testing.assert_allclose(big, loop)
    np.testing.assert_allclose(small, big)
    lo, hi = interval(big)
    assert lo <= errors.sum() / n_ref.sum() <= hi


def test_alignment_and_counts_of_one_pair() -> None:
    s = score("a b c d", "a x c")
    assert [op for op, _, _ in s.alignment] == ["=", "S", "=", "D"]
    assert (s.words.substitutions, s.words.deletions, s.words.insertions) == (1, 1, 0)
    empty_ref = score("", "a b")
    assert empty_ref.words.insertions == 2 and empty_ref.words.n_ref == 0


def test_duration_bucket_edges() -> None:
    assert duration_bucket(1.0) == "<2 s"
    assert duration_bucket(5.0) == "5-10 s"
    assert duration_bucket(75.0) == ">=60 s"
    assert duration_bucket(None) == "unknown"


def test_real_librispeech_references_and_parquet_predictions(shared_data: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    table = pq.read_table(src, columns=["id", "text", "speaker_id"]).to_pylist()
    hyps = {}
    for k, row in enumerate(table):  # a plausible system: drops a word now and then, cases the text
        words = row["text"].split()
        hyps[row["id"]] = " ".join(words[:-1] if k % 4 == 0 else words).capitalize() + "."
    out = tmp_path / "run"
    out.mkdir()
    pq.write_table(pa.table({"id": list(hyps), "text": list(hyps.values())}), out / "records-00000.parquet")
    report = evaluate(out, [str(src)], group_columns=["speaker_id"], bootstrap=200)
    norm = whisper_norm.EnglishTextNormalizer()
    expected = jiwer.wer([norm(r["text"]) for r in table], [norm(hyps[r["id"]]) for r in table])
    assert report.wer == pytest.approx(expected, abs=1e-12)
    assert len(report.items) == 100 and len(report.groups["speaker_id"]) == 10
