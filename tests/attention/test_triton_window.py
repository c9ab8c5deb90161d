"""The alignment pass's cross-attention kernel (attention/triton_window) against the path it replaces:
each window's slot K/V gathered, SDPA over them, and the alignment heads' q k^T / sqrt(D) in float32.
On the CPU through Triton's interpreter (heads-first and frames-first caches, fp16 and fp8, with and
without scores); on a GPU the compiled kernel, eagerly and replayed from a CUDA graph."""

from __future__ import annotations

import textwrap

import pytest
import torch

pytest.importorskip("triton")


def _reference(q, k_cache, v_cache, slots, hnd, heads):
    """The gather path: out [B, L, H, D] float32 and scores [B, len(heads), L, N] float32."""
    k, v = k_cache[slots].float(), v_cache[slots].float()
    if not hnd:
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, H, N, D]
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k, v).transpose(1, 2)
    scores = (q.float() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5  # [B, H, L, N]
    return out, scores[:, list(heads)]


# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch
    from batchscribe.attention.triton_window import window_cross_attention
    from tests.attention.test_triton_window import _reference
    torch.manual_seed(0)
    for hnd, kd, length in [(True, torch.float16, 70), (False, torch.float16, 64), (True, torch.float8_e4m3fn, 9),
                            (False, torch.float8_e4m3fn, 130)]:
        n_slots, heads, frames, dim = 5, 3, 150, 16
        shape = (n_slots, heads, frames, dim) if hnd else (n_slots, frames, heads, dim)
        k, v = (torch.randn(shape) * 0.5).to(kd), torch.randn(shape).to(kd)
        q = torch.randn(2, length, heads, dim).to(torch.float16).transpose(1, 2)  # as the pass makes it
        slots = torch.tensor([[3, 0, 2], [1, 4, 4]])[:, 0]  # a column of a table, as the pass passes it
        scores = torch.full((2, 2, length, frames), 7.0)
        out = window_cross_attention(q, k, v, slots, hnd, scores, torch.tensor([-1, 1, 0], dtype=torch.int32))
        want, want_scores = _reference(q, k, v, slots, hnd, heads=(2, 1))
        assert out.shape == (2, length, heads, dim) and out.dtype == q.dtype
        torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(scores, want_scores, atol=1e-5, rtol=1e-5)  # every cell written
        alone = window_cross_attention(q, k, v, slots, hnd)
        assert torch.equal(alone, out)
        print(hnd, kd, length, flush=True)
    """
)


def test_window_cross_attention_matches_the_gather_path_in_the_interpreter(triton_interpreter) -> None:
    assert len(triton_interpreter(CHECK)) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("hnd", [True, False])
@pytest.mark.parametrize("n_head,length,batch", [(6, 64, 16), (6, 448, 3), (20, 128, 16)])
def test_window_cross_attention_matches_the_gather_path(dtype, cache_dtype, hnd, n_head, length, batch) -> None:
    """The compiled kernel equals the gather path at the pass's shapes (1500 frames, 64-dim heads),
    eagerly and replayed from a CUDA graph with new queries and other slots."""
    from batchscribe.attention.triton_window import window_cross_attention

    torch.manual_seed(length)
    n_slots = batch + 5
    shape = (n_slots, n_head, 1500, 64) if hnd else (n_slots, 1500, n_head, 64)
    k = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    v = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    q = torch.randn(batch, length, n_head, 64, device="cuda", dtype=dtype).transpose(1, 2)
    table = torch.randint(0, n_slots, (batch, 4), device="cuda")
    slots = table[:, 1]  # a column, as the pass passes it
    slots.copy_(torch.randperm(n_slots, device="cuda")[:batch])
    heads = (n_head - 1, 0, 2)
    index = torch.full((n_head,), -1, dtype=torch.int32, device="cuda")
    index[list(heads)] = torch.arange(len(heads), dtype=torch.int32, device="cuda")
    scores = torch.empty(batch, len(heads), length, 1500, device="cuda")

    def check(out) -> None:
        want, want_scores = _reference(q, k, v, slots, hnd, heads)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(scores, want_scores, atol=1e-3, rtol=1e-3)

    check(window_cross_attention(q, k, v, slots, hnd, scores, index))
    out = torch.empty(batch, length, n_head, 64, device="cuda", dtype=dtype)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(window_cross_attention(q, k, v, slots, hnd, scores, index))
    q.copy_(torch.randn_like(q))  # new queries and slots, same graph
    slots.copy_(torch.randperm(n_slots, device="cuda")[:batch])
    scores.zero_()
    graph.replay()
    check(out)
