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
