"""Our normalisers against openai-whisper's (the reference implementation) on a table and fuzzed text;
spelled-out numbers are fuzzed in test_numbers.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscribe.eval.normalize import EnglishTextNormalizer, basic_normalize, get_normalizer, spelling_mapping

whisper_norm = pytest.importorskip("whisper.normalizers")

ENGLISH_CASES = [
    # (input, what whisper gives; the expectation is checked against whisper too)
    ("Hello, World!", "hello world"),
    ("It's twenty-one dollars and fifty cents.", "it is $21.50"),
    ("I won't go; we can't stay.", "i will not go we can not stay"),
    ("Mr. Smith and Dr. Jones", "mister smith and doctor jones"),
    ("One hundred and five percent", "105%"),
    ("two thousand three hundred forty five", "2345"),
    ("one oh one", "101"),
    ("double seven nine", "779"),
    ("three point one four", "3.14"),
    ("the 1960s and the twenty first century", "the 1960s and the 21st century"),
    ("Uh, um, we hmm ok", "we ok"),
    ("He [laughs] said (quietly) hi", "he said hi"),
    ("The colour of the theatre", "the color of the theater"),
    ("We reached almost 64 billion and uh, profit over 17 billion Euros.",
     "we reached almost 64000000000 and profit over €17000000000"),
    ("revenue of $1,234.56 million", "revenue of $1234560000"),
    ("minus five degrees", "-5 degrees"),
    ("3.5 fifteen hundred", "3.515 100"),  # a scale that leaves a fraction ends the number
    ("two and a half", "2.5"),
    ("one and a half", "one.5"),  # whisper quirk: "1" -> "one" also before a decimal point
    ("ten per cent", "10%"),
    ("café naïve", "cafe naive"),
    ("She's been there. I'd done it. He's got it.", "she has been there i had done it he has got it"),
    ("one", "one"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), ENGLISH_CASES)
def test_english_matches_whisper_table(text: str, expected: str) -> None:
    ref = whisper_norm.EnglishTextNormalizer()(text)
    assert ref.strip() == expected  # the table documents whisper's behaviour
    assert EnglishTextNormalizer()(text) == ref


BASIC_CASES = ["Hello, World!", "¿Qué tal? Ça va.", "日本語のテキスト、です。", "Straße [noise] (aside) x",
               "Ünïcödé — dashes…", "mixed 123,456.7 numbers", "  spaces\tand\nlines  "]


@pytest.mark.parametrize("text", BASIC_CASES)
def test_basic_matches_whisper_table(text: str) -> None:
    assert basic_normalize(text) == whisper_norm.BasicTextNormalizer()(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_basic_and_english_match_whisper_on_arbitrary_text(text: str) -> None:
    assert basic_normalize(text) == whisper_norm.BasicTextNormalizer()(text)
    _english_agrees_with_whisper(text)


def _english_agrees_with_whisper(text: str) -> None:
    """Ours equals whisper's English normaliser wherever whisper's does not raise (it asserts on
    some odd number spellings)."""
    try:
        ref = whisper_norm.EnglishTextNormalizer()(text)
    except (AssertionError, ValueError):
        return
    assert EnglishTextNormalizer()(text) == ref


def test_spelling_mapping_equals_whisper_json_and_carries_licence() -> None:
    import importlib.resources

    theirs = json.loads(importlib.resources.files("whisper.normalizers").joinpath("english.json").read_text())
    assert spelling_mapping() == theirs
    data = json.loads(importlib.resources.files("batchscribe.eval").joinpath("english_spelling.json").read_text())
    assert "MIT License" in data["license"][0]


def test_get_normalizer_names() -> None:
    assert get_normalizer("none")("Hello, World") == "Hello, World"
    assert get_normalizer("basic")("Hello, World") == "hello world"
    with pytest.raises(ValueError, match="english, basic, none"):
        get_normalizer("french")


# English-like text: the words the contraction, title and filler rules look for, apostrophes,
# punctuation and numbers, so the fast paths (ASCII text, no rule's word present) meet their edges.
_PIECES = ["won't", "can't", "let's", "y'all", "wanna", "gonna", "i'ma", "ma'am", "mr", "Mrs.", "st", "Dr",
           "jr", "esq", "'s been", "'d", "n't", "'re", "'ll", "'ve", "'m", "it's", "uh", "hmm", "twenty",
           "one", "oh", "hundred", "percent", "$", "3.5", "1,000", "colour", "the", "and", "[noise]",
           "(aside)", "café", "—", ".", ",", "'", "-", " ", "  "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | st.text(alphabet="abcdemnrst'.,- ", max_size=6), max_size=14))
def test_english_matches_whisper_on_english_like_text(pieces: list[str]) -> None:
    _english_agrees_with_whisper(" ".join(pieces))
