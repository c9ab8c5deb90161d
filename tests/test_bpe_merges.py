"""restore_missing_merges on small byte-level vocabularies built here: which merges go back, where,
and when the JSON is left alone. The real defect (base's lost "Ġ t", against openai's tiktoken) is
tested in tests/model/test_tokenizer.py and tests/weights/test_ct2_convert.py."""

from __future__ import annotations

import copy
import json

import pytest

from batchscribe.bpe_merges import restore_missing_merges

BYTES = [chr(0x100 + i) for i in range(256)]  # stand-ins for the 256 byte symbols


def tokenizer_json(merges_as_pairs: bool, drop_first: bool = True) -> dict:
    """Vocabulary: the byte symbols 0..255, then 256 = b0 b1, 257 = b2 b3, 258 = (b2 b3) b4, then
    <|endoftext|> at 259. Merges in rank order, the first one (256's) dropped when drop_first."""
    b = BYTES
    vocab = {s: i for i, s in enumerate(b)} | {b[0] + b[1]: 256, b[2] + b[3]: 257, b[2] + b[3] + b[4]: 258,
                                                 "<|endoftext|>": 259}  # fmt: skip
    merges = [[b[0], b[1]], [b[2], b[3]], [b[2] + b[3], b[4]]][1 if drop_first else 0 :]
    return {"model": {"type": "BPE", "vocab": vocab,
                      "merges": merges if merges_as_pairs else [" ".join(m) for m in merges]}}  # fmt: skip


@pytest.mark.parametrize("pairs", [True, False])
def test_the_lost_two_symbol_merge_goes_back_at_its_rank(pairs: bool) -> None:
    data = tokenizer_json(pairs)
    assert restore_missing_merges(data) is True
    assert data == tokenizer_json(pairs, drop_first=False)
    assert restore_missing_merges(data) is False  # nothing left to restore: unchanged
    assert data == tokenizer_json(pairs, drop_first=False)


def test_the_restored_json_encodes_the_merged_token() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    data = tokenizer_json(True)
    before = tokenizers.Tokenizer.from_str(json.dumps(data)).encode(BYTES[0] + BYTES[1]).ids
    restore_missing_merges(data)
    after = tokenizers.Tokenizer.from_str(json.dumps(data)).encode(BYTES[0] + BYTES[1]).ids
    assert (before, after) == ([0, 1], [256])


def test_merges_out_of_vocabulary_order_are_left_alone() -> None:
    data = tokenizer_json(True)
    data["model"]["merges"].reverse()
    expected = copy.deepcopy(data)
    assert restore_missing_merges(data) is False
    assert data == expected


@pytest.mark.parametrize("model", [{"type": "WordPiece", "vocab": {}}, {"type": "BPE", "vocab": {}, "merges": []}])
def test_json_without_bpe_merges_is_left_alone(model: dict) -> None:
    data = {"model": copy.deepcopy(model)}
    assert restore_missing_merges(data) is False
    assert data == {"model": model}
