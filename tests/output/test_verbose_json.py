"""verbose_json records against the OpenAI SDK types (TranscriptionVerbose, TranscriptionSegment).

The segments in the records come from `batchscribe.segments.split_window` on random, rule-abiding
token sequences (tests/test_segments.py checks those against openai's transcribe()).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchscribe.constants import SAMPLE_RATE
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.output.verbose_json import make_error_record, make_record
from batchscribe.segments import Segment, clamp_segments
from tests.model.test_tokenizer import model_folder

pytest.importorskip("whisper")  # the segments come from tests/test_segments.py's openai-checked helpers
from openai.types.audio import TranscriptionSegment, TranscriptionVerbose  # noqa: E402

from tests.test_segments import our_segments, sample_words, stalls, tokenizer_folder, window_tokens  # noqa: E402


@pytest.fixture(scope="module")
def tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_folder(model_folder("tiny.en", request, tmp_path_factory))


def validate(record: dict[str, Any]) -> None:
    parsed = TranscriptionVerbose.model_validate(record, strict=True)
    assert set(record) == {"id", "text", "language", "duration", "segments"}
    assert parsed.segments is not None and len(parsed.segments) == len(record["segments"])
    for seg in record["segments"]:
        TranscriptionSegment.model_validate(seg, strict=True)
        assert set(seg) == set(TranscriptionSegment.model_fields)  # nothing missing or extra
    json.dumps(record, allow_nan=False)  # JSON-safe: no NaN/inf


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seconds=st.sampled_from([3.3, 30.0, 47.5, 75.02]))
def test_records_validate_and_stay_in_bounds(tok: Tokenizer, data: st.DataObject, seconds: float) -> None:
    words = sample_words(str(tokenizer_folder(tok)))
    script = data.draw(st.lists(window_tokens(tok.timestamp_begin, words), min_size=1, max_size=4))
    assume(not any(stalls(w, tok.timestamp_begin) for w in script))
    segments, _ = our_segments(script, round(seconds * SAMPLE_RATE), tok)
    record = make_record("item-1", segments, "en", seconds)
    validate(record)
    assert record["language"] == "english"
    assert record["text"] == "".join(s.text for s in segments)
    assert [s["id"] for s in record["segments"]] == list(range(len(segments)))
    # The segments are clamp_segments' result as the dataclass defines it, key order included.
    # (`words` only with word timestamps.)
    expected = [{k: v for k, v in {**asdict(s), "tokens": list(s.tokens)}.items() if k != "words"}
                for s in clamp_segments(segments, seconds)]
    assert json.dumps(record["segments"]) == json.dumps(expected)
    previous_end = 0.0
    for s in record["segments"]:
        assert previous_end <= s["start"] <= s["end"] <= seconds
        previous_end = s["end"]


def test_clamping_rule(tok: Tokenizer) -> None:
    def seg(start: float, end: float, text: str) -> Segment:
        return Segment(7, 0, start, end, text, (1,), 0.0, -0.1, 1.0, 0.0)

    segments = [seg(-0.5, 4.0, " a"), seg(3.5, 9.0, " b"), seg(9.5, 12.0, " c"), seg(11.0, 12.0, " d")]
    record = make_record("x", segments, "English", 10.0)
    validate(record)
    times = [(s["start"], s["end"], s["text"]) for s in record["segments"]]
    # start = clamp(start, previous end, duration); end = clamp(end, start, duration): moved, never dropped.
    assert times == [(0.0, 4.0, " a"), (4.0, 9.0, " b"), (9.5, 10.0, " c"), (10.0, 10.0, " d")]
    assert record["text"] == " a b c d"


def test_language_names_follow_the_openai_api() -> None:
    assert make_record("x", [], "de", 1.0)["language"] == "german"
    assert make_record("x", [], "Haitian Creole", 1.0)["language"] == "haitian creole"
    validate(make_record("x", [], "en", 0.0))
    with pytest.raises(ValueError, match="item 'x': unknown language 'xx'"):
        make_record("x", [], "xx", 1.0)


def test_error_record_and_passthrough() -> None:
    error = "cannot decode a/b.flac: not audio; remove it or convert it"
    record = make_error_record("a/b.flac", error, {"split": "dev"})
    assert record == {"id": "a/b.flac", "error": record["error"], "duration": None, "split": "dev"}
    with pytest.raises(ValueError, match=r"\['text'\] would overwrite"):
        make_error_record("a", "e", {"text": "reference"})
    assert make_record("a", [], "en", 1.0, {"speaker": 3})["speaker"] == 3
