"""FlashInfer's kernels (attention/flashinfer): the CPU refused before flashinfer is imported, and
(on a GPU) the kernels against the SDPA reference."""

from __future__ import annotations

import re

import pytest
import torch

from batchscribe.attention.registry import AttentionPlan, build_backend
from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims
from tests.attention.helpers import capture, tiny_dims
from tests.marks import needs_cuda, needs_flashinfer


def test_flashinfer_backend_refuses_the_cpu() -> None:
    # The device check comes before flashinfer is imported: this runs (and can fail) without it.
    cache = DecoderCache.allocate(tiny_dims(), 2, "cpu", torch.float16)
    message = "FlashInfer runs on CUDA; the cache is on cpu: use attention='sdpa'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_backend(AttentionPlan("flashinfer", "flashinfer"), cache, torch.float16)


@pytest.mark.gpu
@needs_cuda
@needs_flashinfer
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head,n_rows", [(6, 1), (6, 37), (20, 5), (20, 256)])
@pytest.mark.parametrize("cross_hnd", [False, True])
@pytest.mark.parametrize("self_kernel", ["flashinfer", "triton"])
def test_flashinfer_kernels_match_sdpa(dtype, n_head, n_rows, cross_hnd, self_kernel) -> None:
    """FlashInfer's (or the Triton kernel's) ragged self-attention and FlashInfer's paged
    cross-attention (model dtype and fp8) equal the SDPA reference over the same static caches,
    inside and outside a CUDA graph."""
    dims = ModelDims.from_hf_config(dict(vocab_size=100, num_mel_bins=80, d_model=64 * n_head, encoder_layers=1,
                                         decoder_layers=1, encoder_attention_heads=n_head,
                                         decoder_attention_heads=n_head, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_source_positions=1500, max_target_positions=448))  # fmt: skip
    torch.manual_seed(n_rows)
    for cross_dtype in (None, torch.float8_e4m3fn):
        cache = DecoderCache.allocate(dims, n_rows, "cuda", dtype, cross_dtype, cross_hnd)
        for t in (cache.self_k[0], cache.self_v[0], cache.cross_k[0], cache.cross_v[0]):
            t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        q = torch.randn(n_rows, n_head, 64, device="cuda", dtype=dtype)
        positions = torch.randint(0, 448, (n_rows,), device="cuda")
        positions[0] = 0  # a row that sees only its own token
        plan = AttentionPlan(self_kernel, "flashinfer_hnd" if cross_hnd else "flashinfer")
        fi, ref = build_backend(plan, cache, dtype), SdpaBackend(cross_hnd=cross_hnd)
        fi.prepare(n_rows)
        out_self = torch.empty_like(q)
        out_cross = torch.empty_like(q)

        def step() -> None:
            fi.begin_step(positions, None)
            out_self.copy_(fi.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None))
            out_cross.copy_(fi.cross_attention(q, cache.cross_k[0], cache.cross_v[0], None))

        want_self = ref.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None).float()
        want_cross = ref.cross_attention(q, cache.cross_k[0], cache.cross_v[0], None).float()
        step()  # eager
        torch.testing.assert_close(out_self.float(), want_self, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out_cross.float(), want_cross, atol=2e-2, rtol=2e-2)
        graph = capture(step)
        positions.copy_(torch.randint(0, 448, (n_rows,), device="cuda"))  # new lengths, same graph
        graph.replay()
        want_self = ref.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None).float()
        torch.testing.assert_close(out_self.float(), want_self, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out_cross.float(), want_cross, atol=2e-2, rtol=2e-2)
