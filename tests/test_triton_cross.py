"""The Triton cross-attention kernel (model/triton_cross) against SDPA, on the CPU through Triton's
interpreter: the online softmax, the frame splits and their merge, and rows skipped as inert. The
GPU tests run the compiled kernel inside the engine."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("triton")

# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.model import triton_cross as tc
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
        print(rows, heads, n, tc.split_for(rows, heads, n, cfg), flush=True)
    """
)


def test_triton_cross_attention_matches_sdpa_in_the_interpreter(triton_interpreter) -> None:
    splits = [int(line.split()[-1]) for line in triton_interpreter(CHECK)]
    assert splits[0] > 1 and splits[1] == 1 and splits[4] == 2  # the split-and-merge path and the direct one


def test_split_for_fills_the_gpu_but_keeps_two_blocks_per_split() -> None:
    from batchscribe.model.triton_cross import CrossConfig, split_for

    cfg = CrossConfig(block_n=128, min_programs=1024, max_split=8)
    assert split_for(256, 20, 1500, cfg) == 1  # 5,120 programs already
    assert split_for(16, 20, 1500, cfg) == 4  # 320 programs: 4 x
    assert split_for(1, 6, 1500, cfg) == 5  # capped so that each split keeps >= 2 blocks of 128
    assert split_for(1, 6, 300, cfg) == 1
