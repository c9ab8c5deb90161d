"""Records shaped like a run's output (an ok record and an error record), shared by the output tests."""

from __future__ import annotations

from typing import Any


def ok_record(i: int) -> dict[str, Any]:
    # Shaped like a tiny.en result: timestamp tokens start at 50363 in that vocabulary.
    return {
        "id": f"utt-{i}",
        "text": " He was not an ill disposed young man.",
        "language": "english",
        "duration": 2.99,
        "segments": [
            {"id": 0, "seek": 0, "start": 0.0, "end": 2.5,
             "text": " He was not an ill disposed young man.",
             "tokens": [50363, 679, 373, 407, 281, 4171, 32668, 1862, 582, 13, 50488],
             "temperature": 0.0, "avg_logprob": -0.2345, "compression_ratio": 0.9,
             "no_speech_prob": 0.012},
        ],
        "reference": "he was not an ill disposed young man",
        "speaker_id": 7 + i,
        "tags": ["a", "b"],
    }


def error_record(i: int) -> dict[str, Any]:
    return {"id": f"bad-{i}", "error": f"bad-{i}: not audio; re-encode it", "duration": None,
            "reference": "x", "speaker_id": 3, "tags": []}
