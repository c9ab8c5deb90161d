"""Fixtures of the CLI-level run tests: the clips and the uninterrupted reference run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.system.runs import CLIP_IDS, CORRUPT_ID, RUN_TIMEOUT_S, command, committed, outcome, write_clips


@pytest.fixture(scope="session")
def clips(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_clips(shared_data, tmp_path_factory.mktemp("kill") / "clips.parquet")


@pytest.fixture(scope="session")
def reference(clips: Path, tiny_en_dir: Path, model_cache: Path,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """id -> text (or ERROR message) of one uninterrupted run with the real tiny.en."""
    out = tmp_path_factory.mktemp("ref") / "out"
    proc = subprocess.run(command(clips, out, model_cache, "jsonl", 4, 0), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    records = committed(out)
    assert sorted(r["id"] for r in records) == sorted((*CLIP_IDS, CORRUPT_ID))
    greedy = [r["id"] for r in records for s in r.get("segments") or [] if s["temperature"] != 0.0]
    assert not greedy, f"temperature fallback on {greedy}: their text would depend on batching"
    return {r["id"]: outcome(r) for r in records}
