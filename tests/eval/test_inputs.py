"""Reading a run's records for eval: a damaged shard is named, with the fix, not a bare traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscribe.eval.inputs import EvalInputError, load_predictions
from batchscribe.output.retry import retry_errors
from batchscribe.output.resume import open_output
from tests.eval.sample_runs import HYPS_B, run_dir
from tests.output.test_resume import commit, rec


def test_a_truncated_shard_is_named_with_the_fix(tmp_path: Path) -> None:
    run = run_dir(tmp_path, "a", HYPS_B)
    shard = run / "records-00000.jsonl"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(EvalInputError, match=f"{shard}: cannot be read as record shard.*rerun that `batchscribe run`"):
        load_predictions(run)


def test_a_run_folder_is_read_through_its_manifests(tmp_path: Path) -> None:
    """In a run's folder eval reads what the run committed, as export and resume do: not a
    .jsonl of the user's beside the records (eval failed on it, and `run` then skipped its WER
    report without a word), nor the old copy an interrupted --retry-errors leaves until the next
    run moves it aside (its stale error record was scored in place of the retried one)."""
    commit(tmp_path, [rec(0), rec(1, ok=False)])  # records-00000.jsonl
    old = (tmp_path / "records-00000.jsonl").read_bytes()
    retry_errors(open_output(tmp_path, "jsonl"))  # records-00001.jsonl: u0
    commit(tmp_path, [rec(1)])  # records-00002.jsonl: u1 redone, ok
    (tmp_path / "records-00000.jsonl").write_bytes(old)  # as if killed before the old shard's unlink
    (tmp_path / "notes.jsonl").write_text('{"note": "mine"}\n')
    preds = load_predictions(tmp_path)
    assert preds.records == {"u0": rec(0), "u1": rec(1)} and preds.duplicates == ()
    assert sorted(p.name for p in preds.files) == ["records-00001.jsonl", "records-00002.jsonl"]


def test_a_damaged_shard_of_a_run_folder_is_named_with_the_fix(tmp_path: Path) -> None:
    commit(tmp_path, [rec(0), rec(1)])
    shard = tmp_path / "records-00000.jsonl"
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(EvalInputError, match=f"{shard}: cannot be read as record shard.*rerun that `batchscribe run`"):
        load_predictions(tmp_path)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_references_find_a_conventional_text_column_as_run_does(tmp_path: Path, suffix: str) -> None:
    """A reference table whose text is in `transcription` (FLEURS, many hub sets): found without
    --text-column, as `run` finds it (it was 'text' or a usage error); a named column still wins."""
    import csv
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchscribe.audio.sources.columns import REFERENCE_COLUMNS
    from batchscribe.eval.inputs import load_references

    rows = [{"id": "a", "transcription": "one two", "sentence": "other"}, {"id": "b", "transcription": "three", "sentence": "x"}]
    path = tmp_path / f"refs{suffix}"
    if suffix == ".parquet":  # a dataset's table: the audio beside the text (not read here)
        pq.write_table(pa.Table.from_pylist([{**r, "audio": b"not read"} for r in rows]), path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    assert REFERENCE_COLUMNS.index("transcription") < REFERENCE_COLUMNS.index("sentence")
    refs = {r.id: r.text for r in load_references([str(path)])}
    assert refs == {"a": "one two", "b": "three"}
    assert {r.id: r.text for r in load_references([str(path)], text_column="sentence")} == {"a": "other", "b": "x"}


def test_references_that_match_no_record_are_named_not_scored_as_all_missing(tmp_path: Path) -> None:
    """Another input's references (no id in common) used to give WER 100 % over 'missing' items."""
    import json

    from batchscribe.eval import evaluate
    from tests.eval.sample_runs import write_refs

    run = run_dir(tmp_path, "a", HYPS_B)
    refs = tmp_path / "other.jsonl"
    refs.write_text("".join(json.dumps({"id": f"x{k}", "text": "words"}) + "\n" for k in range(3)))
    with pytest.raises(EvalInputError, match=r"none of the 3 reference ids matches one of the 5 records' ids.*'x0'.*'w1'"):
        evaluate(run, [str(refs)])
    assert evaluate(run, [str(write_refs(tmp_path / "refs.jsonl"))]).items  # the right file scores
