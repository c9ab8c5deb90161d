"""The Python API (api.Transcriber) on real tiny.en: one array, lists and pairs, records against the
OpenAI SDK's types."""

from __future__ import annotations

import hashlib

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


def test_engine_options_are_resolved_once_and_described(tiny_en_dir) -> None:
    """EngineOptions (or the same fields as keywords, not both) resolve into the transcriber's
    EngineConfig; describe() reports it and the identity a resume checks."""
    from batchscribe.api import Transcriber
    from batchscribe.config import ConfigError, EngineOptions

    t = Transcriber(str(tiny_en_dir), engine=EngineOptions(device="cpu", batch_size=3, cuda_graphs=False))
    assert t.config.device.type == "cpu" and t.config.n_slots == t.n_slots == 3 and not t.config.cuda_graphs
    described = t.describe()
    weights = hashlib.sha256((tiny_en_dir / "model.safetensors").read_bytes()).hexdigest()
    assert described["identity"] == {"dtype": "float32", "attention": "sdpa/sdpa/float32",
                                     "weights_sha256": hashlib.sha256(f"model.safetensors\0{weights}\n".encode()).hexdigest()}
    assert described["engine"]["batch_size"] == 3 and described["engine"]["device"] == "cpu"
    assert t.scheduler().engine.n_slots == 3
    with pytest.raises(ConfigError, match="not both"):
        Transcriber(str(tiny_en_dir), device="cpu", engine=EngineOptions(device="cpu"))
    with pytest.raises(ConfigError, match="not a device"):
        Transcriber(str(tiny_en_dir), device="gpu0")
