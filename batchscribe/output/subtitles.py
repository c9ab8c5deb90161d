"""Records as subtitle and text files, in openai-whisper's writer formats (`whisper/utils.py`):

- srt: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`;
- vtt: a `WEBVTT` header, then cues with `MM:SS.mmm` (hours only past the first hour);
- txt: each segment's text on its own line;
- tsv: `start`, `end` (integer milliseconds) and `text` columns.

One cue per segment, its text stripped (and `-->` made `->` in cues, where it would end the
timing line); for a record with word timestamps, srt and vtt cues are made from the words, as
openai's writers make them (`_word_cues`). `export.py` writes them, one file per record (`batchscribe export`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SUBTITLE_FORMATS = ("srt", "vtt", "txt", "tsv")
MAX_LINE = 1000  # openai's max_line_width and max_words_per_line when not given


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """seconds >= 0 -> [HH:]MM:SS<marker>mmm, rounded to the millisecond."""
    if seconds < 0:
        raise ValueError(f"timestamp {seconds} is negative")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1_000)
    prefix = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{prefix}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _cues(record: dict[str, Any], hours: bool, marker: str) -> list[tuple[str, str, str]]:
    segments = record.get("segments") or []
    if segments and "words" in segments[0]:
        return [(format_timestamp(a, hours, marker), format_timestamp(b, hours, marker), text)
                for a, b, text in _word_cues(segments)]  # fmt: skip
    return [(format_timestamp(s["start"], hours, marker), format_timestamp(s["end"], hours, marker),
             s["text"].strip().replace("-->", "->")) for s in segments]  # fmt: skip


def _word_cues(segments: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """Cues from word timestamps, as openai's SubtitlesWriter makes them with its default options:
    one cue per segment that has words, from its first word's start to its last word's end, the
    words joined (the first stripped); a line longer than MAX_LINE chars continues on a new line,
    and a segment of more than MAX_LINE words starts a new cue every MAX_LINE words. A segment
    without words gets no cue. The text is not escaped, as openai's word cues are not."""
    cues: list[list[dict[str, Any]]] = []
    line_len = 0
    for seg in segments:
        words = seg.get("words") or []
        for chunk in range(0, len(words), MAX_LINE):
            for i, original in enumerate(words[chunk : chunk + MAX_LINE]):
                word = dict(original)
                new_cue = i == 0 and bool(cues and cues[-1])
                if line_len > 0 and line_len + len(word["word"]) <= MAX_LINE and not new_cue:
                    line_len += len(word["word"])
                else:
                    word["word"] = word["word"].strip()
                    if new_cue:
                        cues.append([])
                    elif line_len > 0:
                        word["word"] = "\n" + word["word"]
                    line_len = len(word["word"].strip())
                if not cues:
                    cues.append([])
                cues[-1].append(word)
    return [(c[0]["start"], c[-1]["end"], "".join(w["word"] for w in c)) for c in cues if c]


def to_srt(record: dict[str, Any]) -> str:
    return "".join(f"{i}\n{a} --> {b}\n{text}\n\n" for i, (a, b, text) in enumerate(_cues(record, True, ","), 1))


def to_vtt(record: dict[str, Any]) -> str:
    return "WEBVTT\n\n" + "".join(f"{a} --> {b}\n{text}\n\n" for a, b, text in _cues(record, False, "."))


def to_txt(record: dict[str, Any]) -> str:
    return "".join(s["text"].strip() + "\n" for s in record.get("segments") or [])


def to_tsv(record: dict[str, Any]) -> str:
    rows = [f"{round(1000 * s['start'])}\t{round(1000 * s['end'])}\t{s['text'].strip().replace(chr(9), ' ')}\n"
            for s in record.get("segments") or []]  # fmt: skip
    return "start\tend\ttext\n" + "".join(rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"srt": to_srt, "vtt": to_vtt, "txt": to_txt, "tsv": to_tsv}


def render(record: dict[str, Any], fmt: str) -> str:
    """One record (a verbose_json transcription) in `fmt`, one of SUBTITLE_FORMATS."""
    if fmt not in RENDERERS:
        raise ValueError(f"format {fmt!r} is not a subtitle format; use one of {', '.join(SUBTITLE_FORMATS)}")
    return RENDERERS[fmt](record)
