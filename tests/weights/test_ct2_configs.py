"""The converted folder's tokenizer and configs: timestamp tokens as transformers and openai-whisper have them."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize(("name", "first_timestamp"), [("tiny.en", 50363), ("base", 50364)])
def test_timestamp_tokens_agree_with_transformers_and_openai(
    name: str, first_timestamp: int, request: pytest.FixtureRequest
) -> None:
    transformers = pytest.importorskip("transformers")
    oa_tokenizer = pytest.importorskip("whisper.tokenizer")
    folder = request.getfixturevalue(f"{name.replace('.', '_')}_dir")
    tok = transformers.WhisperTokenizerFast.from_pretrained(folder)
    assert tok.convert_tokens_to_ids("<|0.00|>") == first_timestamp
    assert tok.convert_tokens_to_ids("<|30.00|>") == first_timestamp + 1500
    assert tok.convert_tokens_to_ids("<|0.02|>") == first_timestamp + 1
    assert tok.all_special_ids[-1] + 1 == first_timestamp  # how transformers finds timestamp_begin
    config = json.loads((folder / "config.json").read_text())
    assert len(tok) == config["vocab_size"]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["no_timestamps_token_id"] + 1 == first_timestamp
    ref = oa_tokenizer.get_tokenizer(multilingual=name == "base")
    assert ref.timestamp_begin == first_timestamp
    assert (ref.eot, ref.sot, ref.sot_prev, ref.no_timestamps) == (
        config["eos_token_id"], config["decoder_start_token_id"], gen["prev_sot_token_id"], gen["no_timestamps_token_id"]
    )
    text = " And so my fellow Americans, ask not what your country can do for you."
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    if name == "base":
        assert gen["lang_to_id"] == {f"<|{code}|>": i for code, i in zip(ref.all_language_codes, ref.all_language_tokens)}
        assert gen["task_to_id"] == {"transcribe": ref.transcribe, "translate": ref.translate}
