"""The seek loop, temperature fallback and the no-speech rule (engine/windows.py) on real tiny.en,
against openai-whisper's transcribe() and its rules."""

from __future__ import annotations

import numpy as np
import pytest

from batchscribe.audio.decode import decode_audio
from tests.engine.helpers import GREEDY, greedy_transcriber
from tests.engine.helpers import openai_wer as _wer
from tests.engine.helpers import check_record as _check_record

pytest.importorskip("openai.types.audio")


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    return greedy_transcriber(tiny_en_dir)


def test_long_form_seek_matches_openai_whisper(transcriber, shared_data, tiny_en_dir) -> None:
    """A 5-minute file: segments cover the audio in order; text close to openai-whisper's
    transcribe() on the same weights (it computes features over the whole file, we per window)."""
    whisper = pytest.importorskip("whisper")

    from batchscribe.weights import load_state_dict

    path = shared_data / "longform" / "librispeech-concat" / "19-198-longform.flac"
    reference = (path.with_suffix(".txt")).read_text()
    audio = decode_audio(path)
    record = transcriber.transcribe(audio, sample_rate=16000)
    _check_record(record)
    assert record["duration"] > 270 and len(record["segments"]) > 20
    assert record["segments"][-1]["end"] > record["duration"] - 30
    assert sorted({s["seek"] for s in record["segments"]})[1] < 3000  # seeks to a timestamp, not by 30 s

    # openai-whisper's own model and transcribe() on the same weights, same greedy settings.
    sd = load_state_dict(tiny_en_dir)
    dims = whisper.model.ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
                                         n_audio_layer=4, n_vocab=51864, n_text_ctx=448, n_text_state=384,
                                         n_text_head=6, n_text_layer=4)  # fmt: skip
    ref_model = whisper.model.Whisper(dims)
    ref_model.load_state_dict(_to_openai_names(sd))
    ref = whisper.transcribe(ref_model, audio, temperature=0.0, condition_on_previous_text=False, fp16=False, language="en")
    wer_ours, wer_ref = _wer(reference, record["text"]), _wer(reference, ref["text"])
    print(f"\nlong form WER ours {wer_ours:.4f} openai-whisper {wer_ref:.4f}")
    assert wer_ours < 0.12
    assert abs(wer_ours - wer_ref) < 0.02


def _to_openai_names(sd: dict) -> dict:
    """HF Whisper names -> openai/whisper names (for the reference model only)."""
    import re

    out = {}
    for name, t in sd.items():
        if name == "proj_out.weight":
            continue
        n = name.removeprefix("model.")
        n = n.replace("embed_positions.weight", "positional_embedding").replace("embed_tokens", "token_embedding")
        n = n.replace("layers.", "blocks.").replace("self_attn_layer_norm", "attn_ln").replace("self_attn.", "attn.")
        n = n.replace("encoder_attn_layer_norm", "cross_attn_ln").replace("encoder_attn.", "cross_attn.")
        n = n.replace("final_layer_norm", "mlp_ln").replace("fc1", "mlp.0").replace("fc2", "mlp.2")
        n = re.sub(r"\.(q|k|v)_proj", lambda m: "." + {"q": "query", "k": "key", "v": "value"}[m.group(1)], n)
        n = n.replace("out_proj", "out").replace("encoder.layer_norm", "encoder.ln_post").replace("decoder.layer_norm", "decoder.ln")
        out[n] = t.float()
    return out


def test_without_timestamps_long_form(tiny_en_dir, shared_data) -> None:
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_1_4482311_3_62.wav")
    record = Transcriber(str(tiny_en_dir), device="cpu", without_timestamps=True, **GREEDY).transcribe(audio, sample_rate=16000)
    _check_record(record)
    # One segment per 30 s window, no timestamp tokens anywhere.
    assert [s["start"] for s in record["segments"]] == [30.0 * i for i in range(len(record["segments"]))]
    assert all(t < 50257 for s in record["segments"] for t in s["tokens"])


def test_temperature_fallback_walks_the_ladder(tiny_en_dir, shared_data) -> None:
    """A threshold no decode can meet makes every window try every temperature, keeping the last."""
    from batchscribe.api import Transcriber

    jfk = decode_audio(shared_data / "misc" / "jfk.flac")
    t = Transcriber(str(tiny_en_dir), device="cpu", temperatures=(0.0, 0.5, 1.0), compression_ratio_threshold=0.0)
    record = t.transcribe(jfk, sample_rate=16000)
    _check_record(record)
    assert {s["temperature"] for s in record["segments"]} == {1.0}
    # The default thresholds accept the greedy decode of clear speech.
    plain = Transcriber(str(tiny_en_dir), device="cpu").transcribe(jfk, sample_rate=16000)
    assert {s["temperature"] for s in plain["segments"]} == {0.0}


def test_silence_and_empty_audio(transcriber) -> None:
    silent, empty = transcriber.transcribe([("silent", np.zeros(16000 * 5, np.float32)), ("empty", np.zeros(0, np.float32))], sample_rate=16000)
    for record in (silent, empty):
        _check_record(record)
    assert empty["segments"] == [] and empty["text"] == ""
    # Default thresholds: a silent window is skipped (openai's no-speech rule) or yields no words.
    assert silent["duration"] == 5.0
    assert len(silent["text"].split()) <= 2


def test_long_item_prompts_warn_twice_not_once_each(tiny_en_dir, caplog) -> None:
    """Five items whose --prompt-column prompts pass openai's 223-token cap (counted by the model's
    own tokenizer): one warning naming the first when it comes, one count at the end of the
    stream, and the prompt each item decodes with is its last 223 tokens, as openai trims it."""
    import logging

    from batchscribe.config import DecodeOptions
    from batchscribe.engine.windows import MAX_PROMPT_TOKENS, WindowPlanner
    from batchscribe.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(tiny_en_dir)
    planner = WindowPlanner(tokenizer, DecodeOptions(language="en"))
    long = " ".join(f"Kenobi{k}" for k in range(300))
    assert len(tokenizer.encode(" " + long)) > MAX_PROMPT_TOKENS
    silence = np.zeros(16000, dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="batchscribe"):
        items = [planner.start(f"row{k}", silence, long if k != 2 else "short") for k in range(6)]
        planner.trims.report()
    assert items[0].context == tuple(tokenizer.encode(" " + long)[-MAX_PROMPT_TOKENS:])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("row0: the --prompt-column prompt is") and "only its last 223" in warnings[0]
    assert warnings[1] == ("5 items' --prompt-column prompts were longer than 223 tokens and were trimmed to "
                           "their last 223 (the first: row0)")
