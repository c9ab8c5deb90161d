"""The prompt prefill (engine/prefill.py) writes into the self-attention cache exactly what feeding
the same tokens one decode step at a time writes (the step is tested against transformers), for
both cross-cache layouts and an fp8 cross cache; rows with shorter prompts in the same group too."""

from __future__ import annotations

import pytest
import torch

from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.engine.prefill import INVARIANT_GROUP, prefill_groups, prefill_packed, prefill_prompts
from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper
from tests.marks import needs_cuda

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


def test_the_packed_prefill_is_the_prefill() -> None:
    """The graph's form (one [G, 1 + P] input: slot, then tokens) writes what the two-tensor call
    writes, and only into its slots."""
    torch.manual_seed(0)
    model = Whisper(DIMS).eval()
    enc = torch.randn(2, DIMS.n_audio_ctx, DIMS.n_audio_state)
    slots, tokens = torch.tensor([2, 0]), torch.randint(0, DIMS.n_vocab, (2, 6))
    caches = [DecoderCache.allocate(DIMS, 4, "cpu", torch.float32, None, True) for _ in range(2)]
    for cache in caches:
        model.write_cross_kv(cache, enc, slots)
    prefill_prompts(model, caches[0], tokens, slots)
    prefill_packed(model, caches[1], torch.cat([slots[:, None], tokens], 1))
    for a, b in zip(caches[0].tensors(), caches[1].tensors()):
        assert torch.equal(a, b)
    assert caches[1].self_k[0][slots].any() and not caches[1].self_k[0][[1, 3]].any()


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_the_prefill_never_plans_cudnn_attention() -> None:
    """cuDNN's attention plans a graph on the host per new shape; the eager prefill meets a new
    group size at almost every admission, so it must take another SDPA kernel, and still write what
    the steps write."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = Whisper(DIMS).eval().to("cuda", torch.float16)
    enc = torch.randn(2, DIMS.n_audio_ctx, DIMS.n_audio_state, device="cuda", dtype=torch.float16)
    slots, tokens = torch.tensor([3, 1], device="cuda"), torch.randint(0, DIMS.n_vocab, (2, 7), device="cuda")
    caches = [DecoderCache.allocate(DIMS, 4, "cuda", torch.float16, None, True) for _ in range(2)]
    for cache in caches:
        model.write_cross_kv(cache, enc, slots)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill_prompts(model, caches[0], tokens, slots)
    names = {e.name for e in prof.events()}
    assert any("attention" in n for n in names) and not any("cudnn_attention" in n for n in names), sorted(names)
    backend = SdpaBackend(cross_hnd=True)
    for pos in range(tokens.shape[1]):
        model.decode_step(caches[1], tokens[:, pos], torch.full((2,), pos, device="cuda"), slots, pos + 1, backend)
    for layer in range(DIMS.n_text_layer):
        torch.testing.assert_close(caches[0].self_k[layer][slots], caches[1].self_k[layer][slots], rtol=1e-2, atol=1e-2)


def test_batch_invariant_prefills_have_one_shape_on_cuda_and_are_single_rows_on_the_cpu() -> None:
    """By default one prefill padded to the longest prompt; batch-invariant on CUDA every prefill is
    INVARIANT_GROUP rows of the whole prompt budget (the last group padded with its last row), on
    the CPU each prompted row alone at its own length."""
    assert INVARIANT_GROUP == 8
    rows, sots = [3, 5, 9], [10, 20, 224]
    for cuda in (False, True):
        assert prefill_groups(rows, [10, 20, 30], 448, cuda, invariant=False) == [([3, 5, 9], 30)]
        assert prefill_groups([], [], 448, cuda, invariant=False) == []
    for cuda in (False, True):  # an admission without a prompted row (the GPU suite found it failing)
        assert prefill_groups([], [], 448, cuda, invariant=True) == []
    assert prefill_groups(rows, sots, 448, cuda=False, invariant=True) == [([3], 10), ([5], 20), ([9], 224)]
    assert prefill_groups(rows, sots, 448, cuda=True, invariant=True) == [([3, 5, 9, 9, 9, 9, 9, 9], 224)]
    nine = prefill_groups(list(range(9)), [5] * 9, 448, cuda=True, invariant=True)
    assert nine == [(list(range(8)), 224), ([8] * 8, 224)]
