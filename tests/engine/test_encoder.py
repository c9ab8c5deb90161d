"""Admission's encoder (engine/encoder.py): chunk sizes, and captured chunks equal eager ones."""

from __future__ import annotations

import pytest
import torch

from batchscribe.engine.encoder import ENCODER_CHUNKS, encoder_chunks, padded_chunks
from tests.marks import needs_cuda


def test_encoder_chunks_cover_any_group_with_few_shapes() -> None:
    for n in range(0, 300):
        parts = encoder_chunks(n)
        assert [i for p in parts for i in range(p.start, p.stop)] == list(range(n))
        assert all(p.stop - p.start in ENCODER_CHUNKS for p in parts)
    assert [p.stop - p.start for p in encoder_chunks(77)] == [64, 8, 4, 1]
    assert encoder_chunks(3, (1,)) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # batch-invariant on the CPU


def test_a_batch_invariant_group_is_cut_into_one_chunk_size_padded() -> None:
    """On CUDA a batch-invariant engine encodes only chunks of one size: the last is padded."""
    assert padded_chunks(19, 8) == [(slice(0, 8), 0), (slice(8, 16), 0), (slice(16, 19), 5)]
    assert padded_chunks(16, 8) == [(slice(0, 8), 0), (slice(8, 16), 0)]
    assert padded_chunks(1, 8) == [(slice(0, 1), 7)]


def test_the_fp8_encoder_keeps_its_first_layer_in_the_models_dtype(tiny_en_dir, utterances) -> None:
    """--encoder-precision fp8 runs every GEMM of the encoder in e4m3 but the first layer's (the
    most sensitive: tests/model/test_fused_encoder.py), and transcribes (emulated on the CPU)."""
    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cpu", encoder_precision="fp8")
    records = t.transcribe(utterances[:1], sample_rate=16000)
    layers = t.scheduler().engine.encoder.encode.layers
    assert [layer.fp8 is None for layer in layers] == [True, False, False, False]
    assert records[0]["text"].strip() and t.config.identity()["encoder_dense_layers"] == "0"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("attention,cross_kv,encoder_precision", [
    ("sdpa", "auto", "auto"), ("auto", "fp8", "auto"), ("auto", "auto", "fp8"), ("sdpa/sdpa/fa3", "auto", "auto"),
    ("sdpa/sdpa/fa3", "auto", "fp8")])  # fmt: skip
def test_encoder_graphs_write_the_cross_cache_like_eager(tiny_en_dir, utterances, attention, cross_kv,
                                                         encoder_precision) -> None:  # fmt: skip
    """A captured admission chunk (features, encoder, cross K/V into the chunk's slots) writes the
    same cross cache as the same chunk run eagerly, for every chunk size, into any slots."""
    import numpy as np

    from batchscribe.api import Transcriber
    from batchscribe.attention.registry import fa3_runs
    from batchscribe.audio.features import pad_or_trim

    fa3 = fa3_runs(torch.device("cuda"))
    if attention.endswith("/fa3") and not fa3:
        pytest.skip("the fa3 encoder kernel needs FlashInfer and a Hopper GPU")
    n = 16
    # Not batch-invariant (CUDA's default), which captures one chunk size: every size is captured
    t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=n, attention=attention,
                    cross_kv=cross_kv, encoder_precision=encoder_precision, batch_invariant=False)  # fmt: skip
    assert t.config.encoder == ("fp8" if encoder_precision == "fp8" else "fused")
    # "auto" takes FA3 for the encoder wherever it runs (its graphs are then what this checks)
    assert t.config.attention.encoder_kernel == ("fa3" if attention.endswith("fa3") or (attention == "auto" and fa3)
                                                 else "sdpa")  # fmt: skip
    t.transcribe(utterances[:2], sample_rate=16000)
    engine = t.scheduler().engine
    runner = engine.encoder_graphs
    assert runner is not None and runner.sizes == [g for g in ENCODER_CHUNKS if g <= n]
    audio = torch.from_numpy(np.stack([pad_or_trim(a) for _, a in utterances[:n]])).cuda()  # [n, N_SAMPLES]
    caches = (*engine.cache.cross_k, *engine.cache.cross_v)

    def bits(slots: torch.Tensor) -> list[torch.Tensor]:
        return [c[slots].view(torch.uint8).clone() for c in caches]

    for size in runner.sizes:
        slots = torch.arange(n - size, n, device="cuda").flip(0)  # any slots, in any order
        runner.replay(audio[:size], slots)
        graphed = bits(slots)
        engine.encoder(audio.flip(0)[:size], slots)  # other windows: the cache really changes
        assert any(not torch.equal(a, b) for a, b in zip(bits(slots), graphed)), size
        engine.encoder(audio[:size], slots)
        assert all(torch.equal(a, b) for a, b in zip(bits(slots), graphed)), size
