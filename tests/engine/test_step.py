"""The decode step (engine/step.py): padded self-attention lengths change no token; the fused
greedy kernel decodes like the tensor rules."""

from __future__ import annotations

import dataclasses

import pytest

from batchscribe.audio.decode import decode_audio
from batchscribe.engine.sizing import default_kv_buckets
from tests.engine.helpers import GREEDY, records, tokens
from tests.marks import needs_cuda


def test_bucketed_attention_lengths_change_nothing(tiny_en_dir, shared_data) -> None:
    """The CUDA path rounds each step's self-attention length up to a captured bucket; masked
    positions must not change a single token (checked here on the CPU with the same code)."""
    from batchscribe.api import Transcriber

    audio = decode_audio(shared_data / "longform" / "earnings22" / "earnings22_3_4483589_261_321.wav")
    items = [("a", audio[: 16000 * 25]), ("b", audio[16000 * 25 :])]
    exact = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY)
    bucketed = exact.build_scheduler(config=dataclasses.replace(exact.config, kv_buckets=tuple(default_kv_buckets(448))))
    a, b = exact.transcribe(items, sample_rate=16000), records(bucketed, items)
    assert [[s["tokens"] for s in r["segments"]] for r in a] == [[s["tokens"] for s in r["segments"]] for r in b]
    # Only float summation order differs: the masked positions weigh exactly zero.
    lp_a = [s["avg_logprob"] for r in a for s in r["segments"]]
    lp_b = [s["avg_logprob"] for r in b for s in r["segments"]]
    assert lp_a == pytest.approx(lp_b, abs=1e-5)


@pytest.mark.gpu
@needs_cuda
def test_fused_greedy_step_transcribes_like_the_tensor_rules(tiny_en_dir, utterances, monkeypatch) -> None:
    """Greedy steps through triton_select's kernel (the CUDA default) and through the tensor rules
    (engine/logits, parity-tested against transformers): the same tokens, log-probabilities and
    no-speech probabilities on real speech, under CUDA graphs."""
    from batchscribe.api import Transcriber
    from batchscribe.engine import triton_select

    kw = dict(device="cuda", dtype="float16", batch_size=32, temperatures=(0.0,))
    fused_t = Transcriber(str(tiny_en_dir), **kw)
    fused = fused_t.transcribe(utterances, sample_rate=16000)
    assert fused_t.scheduler().engine.rules.greedy is not None
    monkeypatch.setattr(triton_select, "triton_available", lambda: False)
    tensor_t = Transcriber(str(tiny_en_dir), **kw)
    tensor = tensor_t.transcribe(utterances, sample_rate=16000)
    assert tensor_t.scheduler().engine.rules.greedy is None
    assert tokens(fused) == tokens(tensor)
    for a, b in zip(fused, tensor):
        for sa, sb in zip(a["segments"], b["segments"], strict=True):
            assert sa["avg_logprob"] == pytest.approx(sb["avg_logprob"], abs=1e-4)
            assert sa["no_speech_prob"] == pytest.approx(sb["no_speech_prob"], abs=1e-5)
