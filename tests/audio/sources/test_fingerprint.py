"""The inputs' identity: absolute paths and a fingerprint that changes with what they list."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscribe.audio.sources.fingerprint import canonical_input, inputs_fingerprint


def test_relative_inputs_resolve_against_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.parquet").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert canonical_input("a.parquet") == str(tmp_path / "a.parquet")
    assert canonical_input("*.parquet") == str(tmp_path / "*.parquet")
    assert canonical_input("openslr/librispeech_asr") == "openslr/librispeech_asr"  # a hub id


def test_fingerprint_changes_with_the_listing_not_with_the_output(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.wav").write_bytes(b"RIFF1")
    first = inputs_fingerprint([str(folder)])
    out = folder / "out"
    out.mkdir()
    (out / "records-00000.jsonl").write_text("{}\n")
    assert inputs_fingerprint([str(folder)], (os.path.realpath(out),)) == first  # the output is not input
    (folder / "b.wav").write_bytes(b"RIFF2")
    assert inputs_fingerprint([str(folder)], (os.path.realpath(out),)) != first


def test_parquet_is_fingerprinted_by_its_footer(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": ["x", "y"]}), path)
    before = inputs_fingerprint([str(path)])
    os.utime(path, ns=(5, 5))
    assert inputs_fingerprint([str(path)]) == before  # a copy or a touch is the same data
    pq.write_table(pa.table({"id": ["x", "z"]}), path)
    assert inputs_fingerprint([str(path)]) != before
    shutil.copy(path, tmp_path / "b.parquet")
    assert inputs_fingerprint([str(tmp_path / "b.parquet")]) != inputs_fingerprint([str(path)])  # another path
