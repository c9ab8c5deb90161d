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
        (SourceOptions(prompt_column="names"), "--prompt-column", "names"),
    ],
)
def test_missing_column_lists_available(parquet_path: Path, opts: SourceOptions, flag: str, name: str) -> None:
    with pytest.raises(SourceError) as err:
        next(iter_source([str(parquet_path)], opts))
    message = str(err.value)
    assert repr(name) in message and flag in message and str(parquet_path) in message
    assert "id, audio, text, duration_s, sampling_rate, speaker_id, chapter_id" in message


def test_decoded_audio_struct_is_read_as_audio(tmp_path: Path) -> None:
    """`{array, sampling_rate}` (how `datasets` stores decoded audio) is audio: resampled to 16 kHz
    like a file, checked against soxr on the same samples."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import soxr

    from batchscribe.audio.worker import decode_one

    t = np.arange(8000) / 8000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 1 s at 8 kHz
    # datasets keeps the original file name beside the samples; that file need not exist here.
    rows = [{"id": "tone", "audio": {"array": tone.tolist(), "sampling_rate": 8000, "path": "gone/tone.flac"}}]
    path = tmp_path / "decoded.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (item,) = iter_source([str(path)], SourceOptions())
    audio, error = decode_one(item, None)
    assert error is None
    expected = soxr.resample(tone, 8000, 16000, quality="HQ")
    assert audio.shape == expected.shape == (16000,)
    np.testing.assert_allclose(audio, expected, atol=1e-6)
