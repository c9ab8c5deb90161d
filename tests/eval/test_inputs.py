"""Reading a run's records for eval: a damaged shard is named, with the fix, not a bare traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscribe.eval.inputs import EvalInputError, load_predictions
from tests.eval.sample_runs import HYPS_B, run_dir


def test_a_truncated_shard_is_named_with_the_fix(tmp_path: Path) -> None:
    run = run_dir(tmp_path, "a", HYPS_B)
    shard = run / "records-00000.jsonl"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(EvalInputError, match=f"{shard}: cannot be read as record shard.*rerun that `batchscribe run`"):
        load_predictions(run)


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
