"""The prompt prefill (engine/prefill.py) writes into the self-attention cache exactly what feeding
the same tokens one decode step at a time writes (the step is tested against transformers), for
both cross-cache layouts and an fp8 cross cache; rows with shorter prompts in the same group too."""

from __future__ import annotations

import pytest
import torch

from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.engine.prefill import prefill_prompts
from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper

DIMS = ModelDims(n_mels=80, n_vocab=300, n_audio_ctx=20, n_audio_state=32, n_audio_head=4, n_audio_layer=2,
                 n_text_ctx=24, n_text_state=32, n_text_head=4, n_text_layer=3)  # fmt: skip


@pytest.mark.parametrize("hnd", [False, True])
@pytest.mark.parametrize("cross_dtype", [None, torch.float8_e4m3fn])
def test_prefill_writes_what_the_steps_write(hnd: bool, cross_dtype: torch.dtype | None) -> None:
    torch.manual_seed(0)
    model = Whisper(DIMS).eval()
    enc = torch.randn(2, DIMS.n_audio_ctx, DIMS.n_audio_state)
    slots = torch.tensor([3, 1])
    lengths = [7, 4]  # each row's prompt: positions [0, length)
    tokens = torch.randint(0, DIMS.n_vocab, (2, max(lengths)))
    caches = [DecoderCache.allocate(DIMS, 4, "cpu", torch.float32, cross_dtype, hnd) for _ in range(2)]
    for cache in caches:
        model.write_cross_kv(cache, enc, slots)
    prefilled, stepped = caches
    prefill_prompts(model, prefilled, tokens, slots)
    backend = SdpaBackend(cross_hnd=hnd)
    for pos in range(max(lengths)):
        model.decode_step(stepped, tokens[:, pos], torch.full((2,), pos), slots, pos + 1, backend)
    for layer in range(DIMS.n_text_layer):
        for a, b in ((prefilled.self_k[layer], stepped.self_k[layer]), (prefilled.self_v[layer], stepped.self_v[layer])):
            for row, slot in enumerate(slots.tolist()):
                # What a row's own steps will read: its prompt positions.
                torch.testing.assert_close(a[slot, : lengths[row]], b[slot, : lengths[row]], rtol=1e-5, atol=1e-5)
            assert not a[[0, 2]].any()  # other slots untouched
