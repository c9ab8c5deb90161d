"""--initial-prompt (windows.py's prompt, engine/prefill.py's batched prefill, the step's sot
position): on real tiny.en the tokens, no_speech_prob and avg_logprob equal openai-whisper's
DecodingTask (whisper.decode with `prompt=`) on the same log-mel; only an item's first kept window is
prompted, as openai transcribe() without condition_on_previous_text; long prompts are trimmed to
their last 223 tokens with a warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from batchscribe.config import ConfigError, DecodeOptions
from batchscribe.engine.requests import FinishedWindow
from batchscribe.engine.windows import MAX_PROMPT_TOKENS, WindowPlanner
from batchscribe.model.tokenizer import Tokenizer
from tests.engine.helpers import GREEDY, openai_model

whisper = pytest.importorskip("whisper")
PROMPT = "Mutton, turnips and carrots. Stew! Mr. Bennet's girls."


def _rows(shared_data, n: int) -> list:
    import io

    import pyarrow.parquet as pq
    import soundfile as sf

    rows = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet").to_pylist()
    rows += pq.read_table(shared_data / "librispeech" / "train-clean-5-00000-of-00008.parquet").to_pylist()[: n - 4]
    return [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]


def test_prompted_windows_equal_openai_decode(tiny_en_dir, shared_data) -> None:
    from batchscribe.api import Transcriber
    from batchscribe.audio.features import LogMel
    from batchscribe.constants import N_SAMPLES

    t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=4, initial_prompt=PROMPT, **GREEDY)
    items = [(i, a) for i, a in _rows(shared_data, 10) if len(a) <= N_SAMPLES]
    records = t.transcribe(items, sample_rate=16000)
    reference, features = openai_model(tiny_en_dir), LogMel(80)
    same = 0
    for (item_id, audio), record in zip(items, records):
        padded = torch.zeros(N_SAMPLES)
        padded[: len(audio)] = torch.from_numpy(audio)
        ref = whisper.decode(reference, features(padded[None])[0],
                             whisper.DecodingOptions(prompt=PROMPT, temperature=0.0, language="en", fp16=False))
        seg = record["segments"][0]
        if [tok for s in record["segments"] for tok in s["tokens"]] == ref.tokens:
            same += 1
            assert seg["avg_logprob"] == pytest.approx(ref.avg_logprob, abs=1e-4)
        assert seg["no_speech_prob"] == pytest.approx(ref.no_speech_prob, rel=1e-3, abs=1e-6)
    print(f"\n{same}/{len(items)} prompted windows decode to openai-whisper's tokens")
    assert same >= 0.9 * len(items)


def _finished(tok: Tokenizer, key: int, words: str) -> FinishedWindow:
    tb = tok.timestamp_begin
    return FinishedWindow(key, [tb, *tok.encode(words), tb + 100], -0.5, 0.01, None, 0.0, True)


def test_only_the_first_kept_window_is_prompted(tiny_en_dir, caplog) -> None:
    tok = Tokenizer.from_folder(tiny_en_dir)
    planner = WindowPlanner(tok, DecodeOptions(initial_prompt=PROMPT, **GREEDY))
    item = planner.start("a", np.zeros(16000 * 70, dtype=np.float32))
    first = planner.request(0, item)
    expected = (tok.sot_prev, *tok.encode(" " + PROMPT), tok.sot)  # openai: " " + prompt.strip()
    assert first.prompt == expected and first.sot_index == len(expected) - 1
    planner.fold(item, _finished(tok, 0, " Hello there."))
    second = planner.request(1, item)
    assert second.prompt == (tok.sot,) and second.sot_index == 0
    long = WindowPlanner(tok, DecodeOptions(initial_prompt="word " * 400, **GREEDY))
    with caplog.at_level(logging.WARNING):
        request = long.request(0, long.start("b", np.zeros(16000, dtype=np.float32)))
    assert request.sot_index == 1 + MAX_PROMPT_TOKENS == 224
    assert request.prompt[1:-1] == tuple(tok.encode(" " + ("word " * 400).strip())[-MAX_PROMPT_TOKENS:])
    assert "only its last 223" in caplog.text


def test_multilingual_detection_with_a_prompt_is_refused(base_dir) -> None:
    from batchscribe.api import Transcriber

    with pytest.raises(ConfigError, match="--initial-prompt.*--language"):
        Transcriber(str(base_dir), device="cpu", initial_prompt=PROMPT)
