"""Spelled-out numbers (eval/numbers.py, through the English normaliser) against openai-whisper's
EnglishTextNormalizer on fuzzed phrases of number words."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscribe.eval.normalize import EnglishTextNormalizer
from batchscribe.eval.numbers import NUMBER_WORDS

whisper_norm = pytest.importorskip("whisper.normalizers")

_WORDS = sorted(NUMBER_WORDS | {"a", "half", "and", "the", "cat", "1", "20", "3.5", "0", "$5", "£2",
                                "1960s", "21st", "colour", "it's", "-", ",", ".", "%", "$", "mr"})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=8))
def test_english_matches_whisper_fuzzed_number_phrases(words: list[str]) -> None:
    text = " ".join(words)
    try:
        ref = whisper_norm.EnglishTextNormalizer()(text)
    except (AssertionError, ValueError):  # whisper's own internal asserts; nothing to compare
        return
    assert EnglishTextNormalizer()(text) == ref, text
