"""Segments and seek advance against openai-whisper's transcribe().

The reference for `split_window` is openai-whisper's own `transcribe()` run on the same tokens: a
scripted stand-in replaces only the neural network (`model.decode` returns the given tokens per
window), so everything compared - the timestamp-pair split, single-timestamp ending, the
no-pair case, the seek advance, the float arithmetic of start/end - is openai's code.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import FrozenInstanceError, asdict, astuple, fields, replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchscribe.constants import N_FRAMES, SAMPLE_RATE
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.segments import Segment, WindowStats, compression_ratio, split_window
from tests.model.test_tokenizer import model_folder

whisper = pytest.importorskip("whisper")
from whisper.decoding import DecodingResult  # noqa: E402
from whisper.transcribe import transcribe as openai_transcribe  # noqa: E402
from whisper.utils import compression_ratio as openai_compression_ratio  # noqa: E402

STATS = WindowStats(temperature=0.0, avg_logprob=-0.25, compression_ratio=1.5, no_speech_prob=0.01)


@pytest.fixture(scope="module")
def tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_folder(model_folder("tiny.en", request, tmp_path_factory))


@cache
def sample_words(tok_path: str) -> tuple[tuple[int, ...], ...]:
    tok = Tokenizer.from_folder(tok_path)
    return tuple(tuple(tok.encode(w)) for w in [" Hello", " world,", " and", " so", " my", " fellow", " ", "."])


class ScriptedModel:
    """openai's Whisper surface that transcribe() touches, decoding window i to script[i]."""

    def __init__(self, script: list[list[int]]):
        self.script = script
        self.calls = 0
        self.device = torch.device("cpu")
        self.dims = SimpleNamespace(n_mels=80, n_audio_ctx=1500, n_text_ctx=448)
        self.is_multilingual = False
        self.num_languages = 99

    def decode(self, mel: torch.Tensor, options: Any) -> DecodingResult:
        tokens = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return DecodingResult(
            audio_features=mel, language="en", tokens=list(tokens), text="",
            avg_logprob=STATS.avg_logprob, no_speech_prob=STATS.no_speech_prob,
            temperature=STATS.temperature, compression_ratio=STATS.compression_ratio,
        )  # fmt: skip


_transcribe_module = importlib.import_module("whisper.transcribe")
_openai_log_mel = _transcribe_module.log_mel_spectrogram


@cache
def _silence_mel(n_samples: int, n_mels: int, padding: int) -> torch.Tensor:
    return _openai_log_mel(np.zeros(n_samples, dtype=np.float32), n_mels, padding=padding)


def openai_segments(script: list[list[int]], n_samples: int) -> list[dict[str, Any]]:
    # openai's own log-mel of silence, computed once per length: the scripted model ignores it,
    # transcribe() only reads its frame count (content_frames).
    cached = lambda audio, n_mels, padding: _silence_mel(len(audio), n_mels, padding)  # noqa: E731
    with patch.object(_transcribe_module, "log_mel_spectrogram", cached):
        result = openai_transcribe(
            ScriptedModel(script), np.zeros(n_samples, dtype=np.float32), temperature=0.0,
            fp16=False, compression_ratio_threshold=None, logprob_threshold=None,
            no_speech_threshold=None, condition_on_previous_text=False,
        )  # fmt: skip
    # openai adds "words": [] to segments it empties; words are word_timestamps' business.
    return [{k: v for k, v in seg.items() if k != "words"} for seg in result["segments"]]


def our_segments(script: list[list[int]], n_samples: int, tok: Tokenizer) -> tuple[list[Segment], list[int]]:
    # The same seek loop as transcribe(): windows of up to 3000 frames until the content ends.
    content_frames = n_samples // 160  # what openai's padded log-mel leaves after removing the pad
    seek, i, segments, seeks = 0, 0, [], []
    while seek < content_frames:
        window = split_window(
            script[min(i, len(script) - 1)], tok, time_offset=seek * 160 / SAMPLE_RATE,
            window_frames=min(N_FRAMES, content_frames - seek), seek=seek, stats=STATS,
        )  # fmt: skip
        assert window.seek > seek, f"seek did not advance from {seek} for {script}"
        segments.extend(window.segments)
        seeks.append(window.seek)
        seek, i = window.seek, i + 1
    return segments, seeks


def as_openai(segments: list[Segment]) -> list[dict[str, Any]]:
    return [{**s.to_dict(), "id": i} for i, s in enumerate(segments)]


# -- hand-derived cases --------------------------------------------------------------------------


def test_pairs_with_single_timestamp_ending(tok: Tokenizer) -> None:
    tb, hello, world = tok.timestamp_begin, tok.encode(" Hello"), tok.encode(" world")
    tokens = [tb, *hello, tb + 100, tb + 100, *world, tb + 250]
    r = split_window(tokens, tok, time_offset=30.0, window_frames=3000, seek=3000, stats=STATS)
    assert [(s.start, s.end, s.text) for s in r.segments] == [(30.0, 32.0, " Hello"), (32.0, 35.0, " world")]
    assert r.segments[0].tokens == (tb, *hello, tb + 100)
    assert r.segments[1].tokens == (tb + 100, *world, tb + 250)
    assert r.single_timestamp_ending and r.seek == 6000  # the lone last timestamp consumes the window
    assert {s.seek for s in r.segments} == {3000}
    assert (r.segments[0].avg_logprob, r.segments[0].no_speech_prob) == (-0.25, 0.01)


def test_unfinished_last_segment_seeks_to_last_pair(tok: Tokenizer) -> None:
    tb, hello, world = tok.timestamp_begin, tok.encode(" Hello"), tok.encode(" world")
    r = split_window([tb, *hello, tb + 100, tb + 100, *world], tok, time_offset=0.0, window_frames=3000, seek=0)
    assert [(s.start, s.end, s.text) for s in r.segments] == [(0.0, 2.0, " Hello")]
    assert r.seek == 200 and not r.single_timestamp_ending  # 100 steps of 0.02 s = 200 mel frames
    # Ending on a pair: the pair's first timestamp closes the segment and is where the next window starts.
    r = split_window([tb, *hello, tb + 100, tb + 100], tok, time_offset=0.0, window_frames=3000, seek=0)
    assert [(s.start, s.end) for s in r.segments] == [(0.0, 2.0)] and r.seek == 200


def test_no_pair_spans_the_window(tok: Tokenizer) -> None:
    tb, hello = tok.timestamp_begin, tok.encode(" Hello")
    # Without timestamps: the whole real content of the window (1234 frames = 12.34 s).
    r = split_window(hello, tok, time_offset=60.0, window_frames=1234, seek=6000)
    assert [(s.start, s.end, s.text) for s in r.segments] == [(60.0, 60.0 + 12.34, " Hello")]
    assert r.seek == 7234
    # One timestamp pair missing: the segment still starts at the window start, ends at the last timestamp.
    r = split_window([tb + 10, *hello, tb + 150], tok, time_offset=0.0, window_frames=3000, seek=0)
    assert [(s.start, s.end) for s in r.segments] == [(0.0, 3.0)] and r.seek == 3000
    # A lone <|0.00|> does not end the segment early.
    r = split_window([tb, *hello], tok, time_offset=0.0, window_frames=3000, seek=0)
    assert [(s.start, s.end) for s in r.segments] == [(0.0, 30.0)]


def test_blank_and_instantaneous_segments_are_emptied(tok: Tokenizer) -> None:
    tb, space, hello = tok.timestamp_begin, tok.encode(" "), tok.encode(" Hello")
    tokens = [tb, *space, tb + 50, tb + 50, *hello, tb + 50, tb + 60, *hello, tb + 80]
    r = split_window(tokens, tok, time_offset=0.0, window_frames=3000, seek=0)
    assert [(s.start, s.end, s.text, s.tokens) for s in r.segments][:2] == [
        (0.0, 1.0, "", ()), (1.0, 1.0, "", ())
    ]  # fmt: skip
    assert r.segments[2].text == " Hello"


def test_zero_progress_window_is_consumed(tok: Tokenizer) -> None:
    # openai would re-decode this window forever (its last pair is at <|0.00|>); we move on.
    tb, hello = tok.timestamp_begin, tok.encode(" Hello")
    r = split_window([tb, tb, *hello], tok, time_offset=0.0, window_frames=3000, seek=0)
    assert r.seek == 3000


# -- equal to openai's transcribe() on random, rule-abiding token sequences -----------------------


@st.composite
def window_tokens(draw: st.DrawFn, tb: int, words: tuple[tuple[int, ...], ...]) -> list[int]:
    """A window's tokens as ApplyTimestampRules allows them: timestamps non-decreasing, at most two in a row."""
    if draw(st.booleans()) and draw(st.booleans()):  # without-timestamps mode: text only
        return [t for w in draw(st.lists(st.sampled_from(words), max_size=6)) for t in w]
    tokens: list[int] = []
    position = draw(st.integers(0, 60))
    for _ in range(draw(st.integers(0, 5))):
        tokens.append(tb + position)
        tokens += [t for w in draw(st.lists(st.sampled_from(words), min_size=1, max_size=4)) for t in w]
        position = min(1500, position + draw(st.integers(0, 400)))
        tokens.append(tb + position)
        if draw(st.booleans()):  # close with a pair, the usual case
            position = min(1500, position + draw(st.sampled_from([0, 0, 5])))
            tokens.append(tb + position)
    ending = draw(st.sampled_from(["as is", "text", "drop last"]))
    if ending == "text":  # unfinished segment, or one whose only timestamp opens it
        if not tokens and draw(st.booleans()):
            tokens.append(tb + draw(st.sampled_from([0, 0, 25])))
        tokens += list(draw(st.sampled_from(words)))
    elif ending == "drop last" and tokens:
        tokens.pop()
    return tokens


def stalls(tokens: list[int], tb: int) -> bool:
    # openai loops forever when the last complete pair sits at <|0.00|>: keep those out.
    pairs = [i for i in range(len(tokens) - 1) if tokens[i] >= tb and tokens[i + 1] >= tb]
    single_end = len(tokens) >= 2 and tokens[-1] >= tb and tokens[-2] < tb
    return bool(pairs) and not single_end and tokens[pairs[-1]] == tb


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seconds=st.sampled_from([3.3, 29.99, 30.0, 47.5, 75.02]))
def test_split_window_equals_openai_transcribe(tok: Tokenizer, data: st.DataObject, seconds: float) -> None:
    words = sample_words(str(tokenizer_folder(tok)))
    tb = tok.timestamp_begin
    script = data.draw(st.lists(window_tokens(tb, words), min_size=1, max_size=4))
    assume(not any(stalls(w, tb) for w in script))
    n_samples = round(seconds * SAMPLE_RATE)
    ours, seeks = our_segments(script, n_samples, tok)
    assert as_openai(ours) == openai_segments(script, n_samples)
    # Properties on top of equality: seek strictly advances, segments stay in their window.
    assert all(b > a for a, b in zip([0, *seeks], seeks))
    for s in ours:
        window_start = s.seek / 100
        assert window_start <= s.start <= s.end <= window_start + 30.0 + 1e-9


def tokenizer_folder(tok: Tokenizer) -> Path:
    return Path(tok._source).parent


# -- window stats and segments --------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300) | st.text(alphabet="ab ", max_size=2000))
def test_compression_ratio_equals_openai(text: str) -> None:
    assert compression_ratio(text) == openai_compression_ratio(text)


def test_window_stats_as_openai_decoding_computes_them(tok: Tokenizer) -> None:
    ref = whisper.tokenizer.get_tokenizer(False)
    tb = tok.timestamp_begin
    rng = np.random.default_rng(7)
    for n in [0, 1, 5, 40]:
        text_ids = [int(t) for t in rng.integers(0, tok.eot, n)]
        tokens = [tb + 3, *text_ids, tb + 90, tb + 90, *ref.encode(" so so so so so so"), tb + 200]
        tokens += [tok.language_tokens["de"]] if n == 5 else []  # a sampled special token stays in the text
        stats = WindowStats.from_decode(tokens, tok, temperature=0.2, sum_logprob=-3.5, no_speech_prob=0.3)
        # openai DecodingTask.run: text = decode(tokens).strip(); avg over len(tokens) + 1 (eot).
        assert stats.compression_ratio == openai_compression_ratio(ref.decode(tokens).strip())
        assert stats.avg_logprob == -3.5 / (len(tokens) + 1)
        assert (stats.temperature, stats.no_speech_prob) == (0.2, 0.3)


def test_segment_built_by_split_window_is_a_plain_segment(tok: Tokenizer) -> None:
    # split_window fills a frozen dataclass's __dict__ directly: the object must be indistinguishable.
    tb, hello = tok.timestamp_begin, tok.encode(" Hello")
    window = split_window([tb, *hello, tb + 50], tok, time_offset=1.5, window_frames=3000, seek=150, stats=STATS)
    built = window.segments[0]
    plain = Segment(0, 150, 1.5, 2.5, " Hello", (tb, *hello, tb + 50), *astuple(STATS))
    assert built == plain and hash(built) == hash(plain) and vars(built) == vars(plain)
    assert list(vars(built)) == [f.name for f in fields(Segment)]
    assert replace(built, id=3) == replace(plain, id=3)
    with pytest.raises(FrozenInstanceError):
        built.text = "changed"  # type: ignore[misc]
    # to_dict: the fields in declaration order, tokens as a list (what json.dumps writes).
    # `words` (None without word timestamps) is left out.
    expected = {k: v for k, v in {**asdict(plain), "tokens": list(plain.tokens)}.items() if k != "words"}
    assert json.dumps(built.to_dict()) == json.dumps(expected)


# -- real speech ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model_fixture", ["tiny_en_dir", "base_dir"])
def test_real_transcripts_decode_as_references(
    request: pytest.FixtureRequest, model_fixture: str, shared_data: Path
) -> None:
    """Real transcripts (English; Japanese, Chinese, Korean, whose characters span tokens): each
    segment's text is what openai's tokenizer and transformers' WhisperTokenizer decode from its
    tokens, and the compression ratio of the item's tokens is openai's, from openai's decode."""
    from transformers import WhisperTokenizer

    from batchscribe.api import Transcriber
    from batchscribe.audio.decode import decode_audio
    from tests.model.test_tokenizer import openai_tokenizer

    folder = request.getfixturevalue(model_fixture)
    if model_fixture == "base_dir":
        clips = sorted((shared_data / "multilingual" / "fleurs").glob("*.wav"))
        clips += [shared_data / "multilingual" / "picovoice-leopard" / f"test_{c}.wav" for c in ("ja", "ko", "de")]
    else:
        clips = [shared_data / "misc" / "jfk.flac", *sorted((shared_data / "longform" / "earnings22").glob("*.wav"))]
    t = Transcriber(str(folder), device="cpu", temperatures=(0.0,))
    records = t.transcribe([(p.stem, decode_audio(p)) for p in clips], sample_rate=16000)
    tok, ref = t.tokenizer, openai_tokenizer(t.tokenizer)
    hf = WhisperTokenizer.from_pretrained(folder)
    n_segments = 0
    for record in records:
        window = [token for seg in record["segments"] for token in seg["tokens"]]
        for seg in split_window(window, tok, time_offset=0.0, window_frames=3000, seek=0).segments + tuple(
            Segment(**{**s, "tokens": tuple(s["tokens"])}) for s in record["segments"]
        ):
            text_ids = [token for token in seg.tokens if token < tok.eot]
            assert seg.text == ref.decode(text_ids) == hf.decode(text_ids, clean_up_tokenization_spaces=False)
            n_segments += bool(seg.text)
        stats = WindowStats.from_decode(window, tok, temperature=0.0, sum_logprob=-1.0, no_speech_prob=0.0)
        assert stats.compression_ratio == openai_compression_ratio(ref.decode(window).strip())
    assert n_segments >= len(records)
    if model_fixture == "base_dir":  # multibyte characters made it through
        assert any("\u3040" <= c <= "\u9fff" for r in records for c in r["text"])


def test_revised_segment_equals_replace(tok: Tokenizer) -> None:
    from batchscribe.segments import revised

    tb, hello = tok.timestamp_begin, tok.encode(" Hello")
    seg = split_window([tb, *hello, tb + 50], tok, time_offset=1.5, window_frames=3000, seek=150, stats=STATS).segments[0]
    words = ({"word": " Hello", "start": 1.5, "end": 2.0, "probability": 0.9},)
    for changes in [dict(start=1.6, end=2.0, words=words), dict(start=2.0, end=2.0, text="", tokens=(), words=())]:
        new = revised(seg, **changes)
        assert new == replace(seg, **changes) and vars(new) == vars(replace(seg, **changes))
        assert list(vars(new)) == [f.name for f in fields(Segment)] and new is not seg
    with pytest.raises(TypeError):
        revised(seg, speaker=1)
