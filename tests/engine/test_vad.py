"""--vad: on a long file of real speech clips separated by silence, with real tiny.en, every
segment lies within a clip's known span and every clip's speech is found near its offset (times
mapped back to the item's timeline, words included); without the extra installed --vad is a usage
error naming the fix; the option enters the run identity only when on."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from batchscribe.config import ConfigError, DecodeOptions

GAPS = (7.0, 23.0, 41.0, 12.0, 9.0)  # seconds of silence before each clip, and after the last
TOLERANCE = 1.0  # seconds: Whisper's timestamps are 20 ms tokens, but its segment edges wander


def _spliced(utterances) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Four real utterances with long silences (faint noise, as a room has) between them, and
    each clip's (start, end) in seconds."""
    rng = np.random.default_rng(0)
    parts, spans, t = [], [], 0.0
    for gap, (_, clip) in zip(GAPS, utterances[:4]):
        parts += [rng.normal(0, 1e-4, int(gap * 16000)).astype(np.float32), clip]
        t += gap
        spans.append((t, t + len(clip) / 16000))
        t += len(clip) / 16000
    parts.append(np.zeros(int(GAPS[-1] * 16000), dtype=np.float32))
    return np.concatenate(parts), spans


@pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None, reason="needs pip install 'batchscribe[vad]'")
def test_segments_and_words_map_back_to_the_clips(tiny_en_dir, utterances) -> None:
    from batchscribe.api import Transcriber
    from batchscribe.audio.vad import SpeechDetector

    audio, spans = _spliced(utterances)
    chunks = SpeechDetector().detect([audio])[0].chunks
    assert all(e - s <= 30 * 16000 for s, e in chunks)
    t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=4, vad=True, word_timestamps=True,
                    temperatures=(0.0,))  # fmt: skip
    record = t.transcribe([("spliced", audio)], sample_rate=16000)[0]
    assert record["duration"] == pytest.approx(len(audio) / 16000)

    def inside(start: float, end: float) -> bool:
        return any(a - TOLERANCE <= start and end <= b + TOLERANCE for a, b in spans)

    segments = [s for s in record["segments"] if s["text"].strip()]
    assert segments and all(inside(s["start"], s["end"]) for s in segments), (spans, [(s["start"], s["end"], s["text"]) for s in segments])
    outside = [(w["word"], w["start"], w["end"]) for s in segments for w in s["words"] if not inside(w["start"], w["end"])]
    assert outside == [], (spans, outside)
    for a, b in spans:  # each clip is transcribed, starting near its offset
        first = min((s["start"] for s in segments if a - TOLERANCE <= s["start"] <= b), default=None)
        assert first is not None and abs(first - a) <= TOLERANCE, (a, b, first)
    starts = [s["start"] for s in segments]
    print(f"\nclips at {[round(a, 2) for a, _ in spans]}; VAD chunks {[(round(s / 16000, 2), round(e / 16000, 2)) for s, e in chunks]}; "
          f"segments start at {[round(x, 2) for x in starts]}")


def test_vad_without_the_extra_is_a_usage_error(monkeypatch, tmp_path) -> None:
    from typer.testing import CliRunner

    from batchscribe.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "silero_vad" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'batchscribe\[vad\]'"):
        DecodeOptions(vad=True)
    result = CliRunner().invoke(app, ["run", str(tmp_path), "-o", str(tmp_path / "out"), "--vad",
                                      "--model", str(tmp_path / "no-such-model")])  # fmt: skip
    assert result.exit_code == 2 and "batchscribe[vad]" in result.output


def test_merged_chunks_stay_within_a_window() -> None:
    from batchscribe.audio.vad import merge_spans

    spans = [(0, 5), (8, 20), (22, 29), (31, 40), (70, 75)]
    merged = merge_spans(spans, 30)
    assert merged == [(0, 29), (31, 40), (70, 75)]  # consecutive spans joined while within 30
    assert merge_spans([(0, 50)], 30) == [(0, 50)] and merge_spans([], 30) == []


def test_vad_enters_the_identity_only_when_on() -> None:
    from batchscribe.output.identity import FLAGS, decode_identity

    assert "vad" not in decode_identity(DecodeOptions())
    if importlib.util.find_spec("silero_vad") is not None:
        assert decode_identity(DecodeOptions(vad=True))["vad"] is True
    assert FLAGS["decode_options.vad"] == "--vad"


def test_joined_speech_maps_back_to_the_item() -> None:
    from batchscribe.audio.vad import join_speech

    audio = np.arange(100 * 16000, dtype=np.float32)
    spans = [(16000 * 10, 16000 * 12), (16000 * 50, 16000 * 55)]  # 10-12 s and 50-55 s
    joined, clips, speech = join_speech(audio, spans, [(16000 * 10, 16000 * 55)])
    assert np.array_equal(joined, np.concatenate([audio[s:e] for s, e in spans])) and clips == [(0, 16000 * 7)]
    assert speech.to_original(1.0) == 11.0 and speech.to_original(3.0) == 51.0
    assert speech.to_original(2.0) == 50.0 and speech.to_original(2.0, is_end=True) == 12.0  # the seam
