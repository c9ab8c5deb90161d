"""Subtitle and text rendering (output/subtitles.py) against openai-whisper's own writers on the
same records: byte-for-byte, for every format, including hour-long timestamps, rounding at the
millisecond, `-->` in the text, tabs, and a record without segments."""

from __future__ import annotations

import io

import pytest

from batchscribe.output.subtitles import SUBTITLE_FORMATS, format_timestamp, render

whisper_utils = pytest.importorskip("whisper.utils")

RECORDS = [
    {"text": " Hello there. General Kenobi!", "segments": [
        {"id": 0, "start": 0.0, "end": 2.4999, "text": " Hello there."},
        {"id": 1, "start": 2.5005, "end": 4.0, "text": " General --> Kenobi!\t(laughs)  "},
    ]},
    {"text": " late", "segments": [{"id": 0, "start": 3599.9996, "end": 3725.5, "text": " an hour in"},
                                   {"id": 1, "start": 36000.0, "end": 36001.25, "text": "ten hours"}]},
    {"text": "", "segments": []},
]  # fmt: skip


def _openai(record: dict, fmt: str) -> str:
    writer = whisper_utils.get_writer(fmt, ".")
    out = io.StringIO()
    writer.write_result(record, out, {"max_line_width": None, "max_line_count": None, "highlight_words": False})
    return out.getvalue()


@pytest.mark.parametrize("fmt", SUBTITLE_FORMATS)
@pytest.mark.parametrize("index", range(len(RECORDS)))
def test_formats_equal_openai_whisper_writers(fmt: str, index: int) -> None:
    assert render(RECORDS[index], fmt) == _openai(RECORDS[index], fmt)


def test_timestamps_equal_openai_whisper() -> None:
    for seconds in (0, 0.0004, 0.0005, 59.9995, 61.25, 3599.9994, 3599.9995, 3600, 86399.999, 123456.789):
        for hours in (False, True):
            for marker in (".", ","):
                assert format_timestamp(seconds, hours, marker) == whisper_utils.format_timestamp(seconds, hours, marker)
    with pytest.raises(ValueError, match="negative"):
        format_timestamp(-0.001)


def test_an_unknown_format_names_the_choices() -> None:
    with pytest.raises(ValueError, match="srt, vtt, txt, tsv"):
        render(RECORDS[0], "ass")
