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


def _words(text: str, start: float, step: float) -> list[dict]:
    pieces = [" " + w for w in text.split(" ") if w]
    return [{"word": p, "start": round(start + k * step, 2), "end": round(start + (k + 1) * step, 2),
             "probability": 0.5} for k, p in enumerate(pieces)]  # fmt: skip


# Records with word timestamps: srt and vtt cues come from the words (openai's word path), incl. a
# segment without words, "-->" in a word, and a line past openai's 1000-character width.
WORD_RECORDS = [
    {"text": "", "segments": [
        {"id": 0, "start": 0.0, "end": 2.5, "text": " Hello there, friend.", "words": _words("Hello there, friend.", 0.1, 0.7)},
        {"id": 1, "start": 2.5, "end": 2.5, "text": "", "words": []},
        {"id": 2, "start": 2.6, "end": 3725.0, "text": " a --> b", "words": _words("a --> b", 3599.9, 0.35)},
        {"id": 3, "start": 3725.0, "end": 3800.0, "text": " long", "words": _words(" ".join(["wordy"] * 400), 3725.0, 0.1)},
    ]},
    {"text": "", "segments": [{"id": 0, "start": 0.0, "end": 1.0, "text": " x", "words": []}]},
]  # fmt: skip
RECORDS += WORD_RECORDS


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
