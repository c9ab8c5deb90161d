"""The language table (model/languages) against openai-whisper's."""

from __future__ import annotations

import pytest

from batchscribe.model.languages import LANGUAGES, language_code, language_name

wt = pytest.importorskip("whisper.tokenizer")


def test_language_table_equals_openai() -> None:
    assert LANGUAGES == wt.LANGUAGES
    assert list(LANGUAGES) == list(wt.LANGUAGES)  # the order defines the token ids
    for name, code in wt.TO_LANGUAGE_CODE.items():
        assert language_code(name) == code
        assert language_code(name.title()) == code
    assert language_name("en") == "english"
    assert language_code("xx") is None
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        language_name("xx")
