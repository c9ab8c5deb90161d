"""Columns: passthrough values, and a missing column named with the available ones and the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscribe.audio.sources import SourceError, SourceOptions, iter_source


def test_passthrough_columns(parquet_path: Path, reference: list[dict]) -> None:
    items = list(iter_source([str(parquet_path)], SourceOptions(passthrough=("speaker_id", "duration_s"), limit=7)))
    assert [i.extra for i in items] == [
        {"speaker_id": r["speaker_id"], "duration_s": r["duration_s"]} for r in reference[:7]
    ]


@pytest.mark.parametrize(
    ("opts", "flag", "name"),
    [
        (SourceOptions(audio_column="wav"), "--audio-column", "wav"),
        (SourceOptions(id_column="utt_id"), "--id-column", "utt_id"),
        (SourceOptions(text_column="sentence"), "--text-column", "sentence"),
        (SourceOptions(passthrough=("gender",)), "--passthrough", "gender"),
    ],
)
def test_missing_column_lists_available(parquet_path: Path, opts: SourceOptions, flag: str, name: str) -> None:
    with pytest.raises(SourceError) as err:
        next(iter_source([str(parquet_path)], opts))
    message = str(err.value)
    assert repr(name) in message and flag in message and str(parquet_path) in message
    assert "id, audio, text, duration_s, sampling_rate, speaker_id, chapter_id" in message
