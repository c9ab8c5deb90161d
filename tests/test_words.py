"""Word timing (batchscribe/words.py) against openai-whisper's whisper/timing.py: word
splitting and punctuation merging on the same inputs, and the batched alignment pass
(engine/alignment.py) against find_alignment on the same weights, tokens and log-mel features."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from batchscribe.words import WordTiming, merge_punctuations, split_words

timing = pytest.importorskip("whisper.timing")


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


@pytest.fixture(scope="module")
def tiny(tiny_en_dir):
    from tests.engine.helpers import greedy_transcriber

    return greedy_transcriber(tiny_en_dir)


def _within(ours: list[float], theirs: list[float], tol: float) -> float:
    return float(np.mean(np.abs(np.asarray(ours) - np.asarray(theirs)) <= tol + 1e-9))


def test_alignment_pass_equals_find_alignment(tiny, tiny_en_dir, utterances) -> None:
    """Same tokens, same log-mel: our batched pass + DTW + merging vs openai's find_alignment +
    merge_punctuations on openai's model holding the same weights, word by word."""
    from batchscribe.audio.features import LogMel
    from batchscribe.constants import HOP_LENGTH, N_SAMPLES
    from batchscribe.engine.alignment import Aligner, AlignWindow
    from batchscribe.model.alignment_heads import resolve_alignment_heads
    from batchscribe.words import word_timings
    from tests.engine.helpers import openai_model

    items = [(i, a) for i, a in utterances[:16] if len(a) <= N_SAMPLES]
    records = tiny.transcribe(items, sample_rate=16000)
    tok = tiny.tokenizer
    heads = resolve_alignment_heads({}, tiny.model.dims, ("tiny.en",), "tiny.en")
    features = LogMel(tiny.model.dims.n_mels)
    aligner = Aligner(tiny.model, features, tiny.model.encoder, heads, tok.eot, tok.no_timestamps, max_batch=5)
    windows = [AlignWindow(a, (tok.sot,), tuple(t for s in r["segments"] for t in s["tokens"] if t < tok.eot),
                           len(a) // HOP_LENGTH) for (_, a), r in zip(items, records)]  # fmt: skip
    alignments = aligner(windows)
    reference, theirs_tok = openai_model(tiny_en_dir), _openai_tokenizer(False)
    starts, ends, n_words = [], [], 0
    for w, al in zip(windows, alignments):
        ours = word_timings(al.path, w.text_tokens, al.token_probs, tok)
        merge_punctuations(ours)
        audio = torch.zeros(N_SAMPLES)
        audio[: len(w.audio)] = torch.from_numpy(w.audio)
        mel = features(audio[None])[0]
        theirs = timing.find_alignment(reference, theirs_tok, list(w.text_tokens), mel, w.num_frames)
        timing.merge_punctuations(theirs, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        assert [x.word for x in ours] == [x.word for x in theirs]
        np.testing.assert_allclose([x.probability for x in ours], [x.probability for x in theirs], atol=2e-3)
        starts += [(a.start, b.start) for a, b in zip(ours, theirs)]
        ends += [(a.end, b.end) for a, b in zip(ours, theirs)]
        n_words += len(ours)
    share = _within([a for a, _ in starts + ends], [b for _, b in starts + ends], 0.02)
    print(f"\n{n_words} words in {len(windows)} windows: {share:.2%} of starts/ends within 0.02 s of find_alignment")
    assert n_words > 200 and share >= 0.98
