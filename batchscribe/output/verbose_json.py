"""One OpenAI `verbose_json` record per item, from the engine's `Transcript`s.

The record shape and field meanings are the OpenAI API's `TranscriptionVerbose` /
`TranscriptionSegment`; segments come from `batchscribe.segments` (openai transcribe()'s rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchscribe.model.languages import language_code, language_name
from batchscribe.segments import Segment, Transcript, clamped_times

_RECORD_KEYS = ("id", "text", "language", "duration", "segments", "words")


def transcript_record(transcript: Transcript, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of a finished item (see make_record)."""
    return make_record(transcript.id, transcript.segments, transcript.language, transcript.duration, extra,
                       transcript.word_timestamps)


def make_record(
    item_id: str,
    segments: Sequence[Segment],
    language: str,
    duration: float,
    extra: Mapping[str, Any] | None = None,
    word_timestamps: bool = False,
) -> dict[str, Any]:
    """The verbose_json record of one item (OpenAI TranscriptionVerbose plus our `id`).

    `language`: a code ("en") or an English name; written as the lowercase name ("english"), as
    the OpenAI API writes it. `extra`: passthrough columns, which must not shadow record fields.
    `word_timestamps`: add the top-level `words` (every segment's words, without probability).
    """
    code = language_code(language)
    if code is None:
        raise ValueError(f"item {item_id!r}: unknown language {language!r}; pass a Whisper code such as 'en'")
    if duration < 0:
        raise ValueError(f"item {item_id!r}: duration {duration} is negative")
    times = clamped_times(segments, duration)
    record: dict[str, Any] = {
        "id": item_id,
        "text": "".join([s.text for s in segments]),
        "language": language_name(code),
        "duration": duration,
        # clamp_segments' result as dicts, without the intermediate segments.
        "segments": [seg.as_dict(i, start, end) for i, (seg, (start, end)) in enumerate(zip(segments, times))],
    }
    if word_timestamps:
        # The OpenAI API's top-level words (TranscriptionWord: word, start, end), in order.
        record["words"] = [{"word": w["word"], "start": w["start"], "end": w["end"]}
                           for seg in segments for w in seg.words or ()]  # fmt: skip
    return _with_extra(record, extra)


def make_error_record(item_id: str, error: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A failed item: its id, what went wrong and how to fix it, null duration, passthrough columns."""
    return _with_extra({"id": item_id, "error": error, "duration": None}, extra)


def _with_extra(record: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if not extra:
        return record
    clash = sorted(set(extra) & {*_RECORD_KEYS, "error"})
    if clash:
        raise ValueError(
            f"passthrough columns {clash} would overwrite record fields; rename or drop them"
        )
    return {**record, **extra}
