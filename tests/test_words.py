"""Word timing (batchscribe/words.py) against openai-whisper's whisper/timing.py: DTW paths, word
splitting and punctuation merging on the same inputs, and the batched alignment pass
(engine/alignment.py) against find_alignment on the same weights, tokens and log-mel features."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from batchscribe.words import WordTiming, dtw, merge_punctuations, split_words

timing = pytest.importorskip("whisper.timing")


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (12, 40), (40, 12), (25, 300)])
def test_dtw_equals_openai(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    for quantise in (False, True):  # coarse values make ties, which must break the same way
        x = rng.normal(size=shape)
        if quantise:
            x = np.round(x)
        rows, cols = dtw(x)
        expected = timing.dtw_cpu(x.astype(np.float64))
        np.testing.assert_array_equal(np.stack([rows, cols]), expected)


def test_median_filter_equals_openai() -> None:
    from batchscribe.engine.alignment import median_filter

    x = torch.randn(3, 9, 50)
    torch.testing.assert_close(median_filter(x, 7), timing.median_filter(x, 7), rtol=0, atol=0)
    short = torch.randn(2, 3, 3)
    torch.testing.assert_close(median_filter(short, 7), timing.median_filter(short, 7), rtol=0, atol=0)


def _openai_tokenizer(multilingual: bool, language: str | None = None):
    tokenizer_module = pytest.importorskip("whisper.tokenizer")
    return tokenizer_module.get_tokenizer(multilingual, language=language)


def test_split_and_merge_equal_openai(tiny_en_dir) -> None:
    from batchscribe.model.tokenizer import Tokenizer

    ours = Tokenizer.from_folder(tiny_en_dir)
    theirs = _openai_tokenizer(False)
    texts = [' "Hello," she said (quietly)... it\'s 3.5 km -- right?', " ¿Qué? «Oui!» 日本語のテキスト、です。",
             " Mr. Smith's 'quoted' words: [one], {two} \"three\"!"]
    for text in texts:
        tokens = ours.encode(text) + [ours.eot]
        assert split_words(tokens, ours) == theirs.split_to_word_tokens(tokens)
        words, groups = split_words(tokens, ours)
        a = [WordTiming(w, g, i * 0.1, i * 0.1 + 0.05, 0.5) for i, (w, g) in enumerate(zip(words, groups))]
        b = [timing.WordTiming(w, list(g), i * 0.1, i * 0.1 + 0.05, 0.5) for i, (w, g) in enumerate(zip(words, groups))]
        merge_punctuations(a)
        timing.merge_punctuations(b, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        assert [(w.word, w.tokens) for w in a] == [(w.word, w.tokens) for w in b]
