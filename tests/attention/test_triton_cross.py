"""The Triton cross-attention kernel (attention/triton_cross) against SDPA, on the CPU through Triton's
interpreter: the online softmax, the frame splits and their merge, and rows skipped as inert; and
(on a GPU) the compiled kernel, eagerly and from a CUDA graph."""

from __future__ import annotations

import textwrap

import pytest
import torch

pytest.importorskip("triton")

# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.attention import triton_cross as tc
    from batchscribe.attention.triton_common import split_for
    torch.manual_seed(0)
    cases = [  # rows, heads, frames, q dtype, cache dtype, config
        (3, 2, 1500, torch.float32, torch.float32, tc.CrossConfig()),
        (2, 3, 1500, torch.float32, torch.float32, tc.CrossConfig(min_programs=1)),
        (2, 2, 300, torch.bfloat16, torch.bfloat16, tc.CrossConfig(block_n=64)),
        (2, 2, 1500, torch.bfloat16, torch.float8_e4m3fn, tc.CrossConfig()),
        (1, 1, 1500, torch.float16, torch.float8_e4m3fn, tc.CrossConfig(block_n=256)),
    ]
    for rows, heads, n, qd, kd, cfg in cases:
        q = torch.randn(rows, heads, 64).to(qd)
        k = torch.randn(rows + 2, heads, n, 64).to(kd)  # more slots than rows: rows [0, B) are read
        v = torch.randn(rows + 2, heads, n, 64).to(kd)
        out = tc.cross_attention(q, k, v, cfg)
        ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), k[:rows].float(), v[:rows].float()).squeeze(2)
        assert out.dtype == q.dtype and out.shape == q.shape
        tol = 1e-5 if qd == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
        # Inert rows (the decoder's running flags off) read one frame per split: finite, unused;
        # the others are unchanged.
        live = torch.tensor([i % 2 == 0 for i in range(rows + 2)])
        skipped = tc.cross_attention(q, k, v, cfg, live=live)
        assert torch.isfinite(skipped.float()).all()
        torch.testing.assert_close(skipped[live[:rows]].float(), ref[live[:rows]], atol=tol, rtol=tol)
        if rows > 1:
            assert not torch.allclose(skipped[1].float(), ref[1], atol=tol, rtol=tol)  # row 1 was skipped
        print(rows, heads, n, split_for(rows, heads, n, cfg), flush=True)
    """
)


def test_triton_cross_attention_matches_sdpa_in_the_interpreter(triton_interpreter) -> None:
    splits = [int(line.split()[-1]) for line in triton_interpreter(CHECK)]
    assert splits[0] > 1 and splits[1] == 1 and splits[4] == 2  # the split-and-merge path and the direct one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("n_head,n_rows,min_programs", [(6, 1, 1024), (6, 37, 1), (20, 5, 1024), (20, 256, 1024), (20, 512, 1)])
def test_triton_cross_matches_sdpa(dtype, cache_dtype, n_head, n_rows, min_programs) -> None:
    """The compiled Triton cross kernel (split over frames or not) equals SDPA over the same HND
    cache rows, eagerly and replayed from a CUDA graph."""
    from batchscribe.attention import triton_cross

    cfg = triton_cross.CrossConfig(min_programs=min_programs)
    torch.manual_seed(n_rows)
    shape = (n_rows + 3, n_head, 1500, 64)  # spare slots: row i reads slot i only
    k = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    v = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    q = torch.randn(n_rows, n_head, 64, device="cuda", dtype=dtype)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k[:n_rows].float(), v[:n_rows].float()
    ).squeeze(2)
    got = triton_cross.cross_attention(q, k, v, cfg)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(triton_cross.cross_attention(q, k, v, cfg))
    q.copy_(torch.randn_like(q))  # new queries, same graph
    graph.replay()
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k[:n_rows].float(), v[:n_rows].float()
    ).squeeze(2)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
