"""Word timing (batchscribe/words.py) against openai-whisper's whisper/timing.py: word
splitting and punctuation merging on the same inputs, and the batched alignment pass
(engine/alignment.py) against find_alignment on the same weights, tokens and log-mel features."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from batchscribe.words import merge_punctuations, split_words

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
        b = [timing.WordTiming(w, list(g), i * 0.1, i * 0.1 + 0.05, 0.5) for i, (w, g) in enumerate(zip(words, groups))]
        merge_punctuations(words, groups)
        timing.merge_punctuations(b, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        assert list(zip(words, groups)) == [(w.word, w.tokens) for w in b]


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
    from batchscribe.engine.alignment import AlignWindow
    from batchscribe.words import word_timings
    from tests.engine.helpers import aligner_over, openai_model

    items = [(i, a) for i, a in utterances[:16] if len(a) <= N_SAMPLES]
    records = tiny.transcribe(items, sample_rate=16000)
    tok = tiny.tokenizer
    features = LogMel(tiny.model.dims.n_mels)
    # The pass reads each window's cross K/V from its slot, as the engine leaves them.
    aligner = aligner_over(tiny.model, [a for _, a in items], tok.eot, tok.no_timestamps, max_batch=5)
    windows = [AlignWindow(k, (tok.sot,), tuple(t for s in r["segments"] for t in s["tokens"] if t < tok.eot),
                           len(a) // HOP_LENGTH) for k, ((_, a), r) in enumerate(zip(items, records))]  # fmt: skip
    alignments = aligner(windows)
    reference, theirs_tok = openai_model(tiny_en_dir), _openai_tokenizer(False)
    starts, ends, n_words = [], [], 0
    for (_, samples), w, al in zip(items, windows, alignments):
        timed = word_timings(al.path, w.text_tokens, al.token_probs, tok)
        merge_punctuations(timed.words, timed.tokens)
        ours = [timing.WordTiming(*word) for word in zip(timed.words, timed.tokens, timed.starts, timed.ends,
                                                          timed.probabilities)]  # fmt: skip
        audio = torch.zeros(N_SAMPLES)
        audio[: len(samples)] = torch.from_numpy(samples)
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


# -- the host word rules' fast paths, equal to the plain computations they replace -----------------


def test_mean_and_median_equal_numpy() -> None:
    from batchscribe.words import _mean, _median

    rng = np.random.default_rng(0)
    for n in [*range(1, 21), 40]:
        for _ in range(200):
            values = (rng.random(n) * 10.0 ** rng.integers(-8, 3)).tolist()
            assert _mean(values) == float(np.mean(values))
            durations = [round(v, 2) for v in values]  # ties, as word durations have them
            assert _median(durations) == float(np.median(durations))
    assert _mean([1e16, 1.0, 1.0]) == float(np.mean([1e16, 1.0, 1.0]))  # the order of the additions


def test_merge_punctuations_equals_openai_on_random_words() -> None:
    """The scans that visit only the marks against openai's, on runs of marks, spaces and words."""
    rng = np.random.default_rng(1)
    pool = [" the", " cat", "s", '"', ' "', " (", "(", ".", ",", ")", " .", "", "'", " '", "?", " -", "-", "word ",
            "!"]  # fmt: skip
    for _ in range(3000):
        texts = [pool[i] for i in rng.integers(0, len(pool), rng.integers(0, 12))]
        ours, tokens = list(texts), [[k] for k in range(len(texts))]
        b = [timing.WordTiming(w, [k], k, k + 1, 0.5) for k, w in enumerate(texts)]
        merge_punctuations(ours, tokens)
        timing.merge_punctuations(b, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        assert list(zip(ours, tokens)) == [(w.word, w.tokens) for w in b], texts


def test_word_timings_equal_openai_on_a_path(tiny_en_dir) -> None:
    """word_timings' times and probabilities from a DTW path, bit for bit find_alignment's."""
    from batchscribe.model.tokenizer import Tokenizer
    from batchscribe.words import word_timings

    ours, theirs = Tokenizer.from_folder(tiny_en_dir), _openai_tokenizer(False)
    rng = np.random.default_rng(2)
    # The last text: every word one token (word_timings' shortcut).
    for text in [' "Hello," she said (quietly)... it\'s 3.5 km -- right?', " Straße, naïve café — 日本語です。",
                 " the cat sat on the mat"]:
        tokens = ours.encode(text)
        rows = np.repeat(np.arange(len(tokens) + 2), rng.integers(1, 6, len(tokens) + 2))
        cols = np.sort(rng.integers(0, 1500, len(rows)))
        probs = rng.random(len(tokens)).tolist()
        words, groups = theirs.split_to_word_tokens(tokens + [theirs.eot])
        bounds = np.pad(np.cumsum([len(t) for t in groups[:-1]]), (1, 0))
        jumps = np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)
        times = cols[jumps] / 50
        expected = [(w, g, times[i], times[j], np.mean(probs[i:j]))
                    for w, g, i, j in zip(words, groups, bounds[:-1], bounds[1:])]  # fmt: skip
        t = word_timings((rows, cols), tokens, probs, ours)
        got = list(zip(t.words, t.tokens, t.starts, t.ends, t.probabilities))
        assert got == expected


def test_attach_words_equals_add_word_timestamps(tiny_en_dir, monkeypatch) -> None:
    """The word rules after the alignment (clipping at sentences and pauses, punctuation merged,
    words shared out to segments, segment times moved) against openai's add_word_timestamps given
    the same word timings, on random paths over real sentences: equal segments and words."""
    import copy

    from batchscribe.model.tokenizer import Tokenizer
    from batchscribe.words import WindowWords, attach_words, word_timings

    ours, theirs = Tokenizer.from_folder(tiny_en_dir), _openai_tokenizer(False)
    sentences = [' "Hello," she said (quietly).', " It's 3.5 km -- right?", " Yes. No! (Maybe)", " the cat sat on the mat",
                 " Mr. Smith's 'quoted' words: [one], {two}."]  # fmt: skip
    pieces = [ours.encode(t) for t in sentences]
    # A sentence end after a word ending in a space is not merged into it: the only place where its
    # own clipped time shows. Tokens the model may give; no text encodes to them.
    pieces.append(ours.encode(" Wait") + ours.encode(" ") + ours.encode(".") + ours.encode(" Go"))
    rng = np.random.default_rng(3)
    rounds = 0
    for _ in range(400):
        seg_tokens = [pieces[i] for i in rng.integers(0, len(pieces), rng.integers(1, 4))]
        text = [t for toks in seg_tokens for t in toks]
        # A path with long and zero-length rows over 3 to 30 s: words long enough to be clipped,
        # pauses between them, and short medians (so long first words after a pause).
        rows = np.repeat(np.arange(len(text) + 2), rng.choice([0, 1, 2, 5, 40], len(text) + 2) + 1)
        cols = np.sort(rng.integers(0, rng.choice([150, 500, 1500]), len(rows)))
        timed = word_timings((rows, cols), text, rng.random(len(text)).tolist(), ours)
        reference = [timing.WordTiming(*w) for w in zip(timed.words, copy.deepcopy(timed.tokens), list(timed.starts),
                                                         list(timed.ends), timed.probabilities)]  # fmt: skip
        seek = int(rng.integers(0, 3)) * 3000
        offset, last_speech = seek / 100, seek / 100 + float(rng.choice([0.0, 0.5, 20.0]))
        bounds = np.sort(rng.uniform(0, 30, 2 * len(seg_tokens))).round(2).tolist()  # each segment's timestamps
        segments = [{"seek": seek, "start": offset + bounds[2 * k], "end": offset + bounds[2 * k + 1],
                     "tokens": [theirs.timestamp_begin, *toks, theirs.timestamp_begin + 1]}
                    for k, toks in enumerate(seg_tokens)]  # fmt: skip
        window = WindowWords([s["start"] for s in segments], [s["end"] for s in segments], [len(t) for t in seg_tokens])
        attach_words(window, timed, offset, last_speech)
        monkeypatch.setattr(timing, "find_alignment", lambda *args, **kwargs: reference)
        timing.add_word_timestamps(segments=segments, model=None, tokenizer=theirs, mel=None, num_frames=3000,
                                   last_speech_timestamp=last_speech)  # fmt: skip
        assert window.words == [s["words"] for s in segments]
        assert (window.starts, window.ends) == ([s["start"] for s in segments], [s["end"] for s in segments])
        rounds += any(len(w) for w in window.words)
    assert rounds > 300
