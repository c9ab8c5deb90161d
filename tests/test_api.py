"""The Python API (api.Transcriber) on real tiny.en: one array, lists and pairs, records against the
OpenAI SDK's types."""

from __future__ import annotations

import pytest

from batchscribe.audio.decode import decode_audio
from tests.engine.helpers import greedy_transcriber
from tests.engine.helpers import openai_wer as _wer
from tests.engine.helpers import check_record as _check_record

pytest.importorskip("openai.types.audio")


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    return greedy_transcriber(tiny_en_dir)


def test_jfk(transcriber, shared_data) -> None:
    record = transcriber.transcribe(decode_audio(shared_data / "misc" / "jfk.flac"))
    _check_record(record)
    expected = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    assert _wer(expected, record["text"]) == 0.0
    assert record["language"] == "english" and record["duration"] == pytest.approx(11.0)
    assert record["segments"][0]["start"] == 0.0
    seg = record["segments"][0]
    assert 0.0 <= seg["no_speech_prob"] < 0.2 and -1.0 < seg["avg_logprob"] < 0.0
