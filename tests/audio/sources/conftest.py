"""The reference rows of the source tests: 100 LibriSpeech rows straight from pyarrow, and the
same rows written out as an audio folder with sidecar transcripts."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

TEST_OTHER = "librispeech/test-other-subset-00000-of-00001.parquet"


@pytest.fixture(scope="module")
def parquet_path(shared_data: Path) -> Path:
    return shared_data / TEST_OTHER


@pytest.fixture(scope="module")
def reference(parquet_path: Path) -> list[dict]:
    """(id, text, flac bytes, speaker_id, duration_s) per row, straight from pyarrow."""
    table = pq.read_table(parquet_path, columns=["id", "text", "audio", "speaker_id", "duration_s"])
    return table.to_pylist()


@pytest.fixture(scope="module")
def flac_folder(tmp_path_factory: pytest.TempPathFactory, reference: list[dict]) -> Path:
    """The rows as <speaker>/<id>.flac (the original FLAC bytes) + <id>.txt, plus non-audio files."""
    root = tmp_path_factory.mktemp("flac")
    for row in reference:
        path = root / row["speaker_id"] / f"{row['id']}.flac"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(row["audio"]["bytes"])
        path.with_suffix(".txt").write_text(row["text"] + "\n", encoding="utf-8")
    (root / "notes.md").write_text("not audio")
    (root / "cover.jpg").write_bytes(b"\xff\xd8\xff")
    return root
