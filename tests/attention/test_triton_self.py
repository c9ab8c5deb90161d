"""The Triton self-attention kernel (attention/triton_self) against SdpaBackend's masked reference, on
the CPU through Triton's interpreter: per-row lengths (one position, part of a block, several
blocks, the whole cache), the positions split over programs and merged (splits past a row's length
empty), rows beyond the batch untouched, and inert rows skipped; and, given the step's new K/V,
the store and the attention against index_put then SDPA. The GPU tests run the compiled kernel
inside the engine."""

from __future__ import annotations

import textwrap

import pytest

triton = pytest.importorskip("triton")
# Before 3.7, the interpreter holds every scalar as a one-element array, which a `range` over a
# loaded length cannot take (the compiled kernel can: the GPU tests run it on those versions).
pytestmark = pytest.mark.skipif(
    tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7),
    reason=f"Triton {triton.__version__}'s interpreter cannot run a data-dependent loop bound (3.7+ can)",
)

# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch
    from batchscribe.attention import triton_self as ts
    from batchscribe.attention.sdpa import SdpaBackend
    from batchscribe.attention.triton_common import split_for
    torch.manual_seed(0)
    ref_backend = SdpaBackend()
    cases = [  # heads, cache positions, q/cache dtype, config, each row's position (attends to 0..position)
        (3, 448, torch.float32, ts.SelfConfig(), [0, 5, 63, 64, 130, 447]),
        (2, 100, torch.float32, ts.SelfConfig(block_n=16, min_programs=1), [99, 16, 15, 1]),  # no split
        (2, 448, torch.bfloat16, ts.SelfConfig(), [3, 200, 447]),
        (1, 448, torch.float16, ts.SelfConfig(block_n=32, num_warps=2), [70]),
        # Few rows: the positions split over programs (some splits past a row's length read nothing).
        (2, 448, torch.float32, ts.SelfConfig(min_programs=64), [0, 70, 300, 447]),
        (1, 448, torch.bfloat16, ts.SelfConfig(block_n=16, min_programs=1024), [5, 447]),
    ]
    for heads, n_ctx, dt, cfg, pos in cases:
        rows = len(pos)
        q = torch.randn(rows, heads, 64).to(dt)
        k = torch.randn(rows + 2, n_ctx, heads, 64).to(dt)  # more slots than rows: rows [0, B) are read
        v = torch.randn(rows + 2, n_ctx, heads, 64).to(dt)
        positions = torch.tensor(pos)
        out = ts.self_attention(q, k, v, positions + 1, cfg)
        ref = ref_backend.self_attention(q.float(), k.float(), v.float(), None, positions, None)
        assert out.dtype == q.dtype and out.shape == q.shape
        tol = 1e-5 if dt == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
        # Inert rows read one position (finite, unused); the others are unchanged.
        live = torch.tensor([i % 2 == 0 for i in range(rows + 2)])
        skipped = ts.self_attention(q, k, v, positions + 1, cfg, live=live)
        assert torch.isfinite(skipped.float()).all()
        torch.testing.assert_close(skipped[live[:rows]].float(), ref[live[:rows]], atol=tol, rtol=tol)
        one = ref_backend.self_attention(q.float(), k.float(), v.float(), None, torch.zeros_like(positions), None)
        torch.testing.assert_close(skipped[~live[:rows]].float(), one[~live[:rows]], atol=tol, rtol=tol)
        print(heads, n_ctx, rows, split_for(rows, heads, n_ctx, cfg), flush=True)
    """
)


# With the step's new K/V (`new_kv`): the kernel stores them and attends, against index_put then SDPA.
CHECK_WRITE = textwrap.dedent(
    """
    import torch
    from batchscribe.attention import triton_self as ts
    from batchscribe.attention.sdpa import SdpaBackend
    from batchscribe.attention.triton_common import split_for
    torch.manual_seed(1)
    ref_backend = SdpaBackend()
    cases = [  # heads, cache positions, dtype, config, each row's position (the new token's)
        (3, 448, torch.float32, ts.SelfConfig(), [0, 5, 63, 64, 130, 447]),
        (2, 100, torch.float32, ts.SelfConfig(block_n=16, min_programs=1), [99, 16, 15, 1, 0]),  # no split
        (2, 448, torch.bfloat16, ts.SelfConfig(), [3, 200, 447]),
        (2, 448, torch.float32, ts.SelfConfig(min_programs=64), [0, 70, 300, 447]),  # split, some splits empty
        (1, 448, torch.bfloat16, ts.SelfConfig(block_n=16, min_programs=1024), [5, 447, 128]),
    ]
    for heads, n_ctx, dt, cfg, pos in cases:
        rows = len(pos)
        q = torch.randn(rows, heads, 64).to(dt)
        new_k, new_v = torch.randn(rows, 2, heads, 64).to(dt).unbind(1)  # views of one tensor, as Attention.qkv's
        k = torch.randn(rows + 2, n_ctx, heads, 64).to(dt)
        v = torch.randn(rows + 2, n_ctx, heads, 64).to(dt)
        positions = torch.tensor(pos)
        want_k, want_v = k.clone(), v.clone()
        index = (torch.arange(rows), positions)
        want_k.index_put_(index, new_k)
        want_v.index_put_(index, new_v)
        ref = ref_backend.self_attention(q.float(), want_k.float(), want_v.float(), None, positions, None)
        tol = 1e-5 if dt == torch.float32 else 2e-2
        live = torch.tensor([i % 2 == 0 for i in range(rows + 2)])
        for rows_live in (None, live):
            got_k, got_v = k.clone(), v.clone()
            out = ts.self_attention(q, got_k, got_v, positions + 1, cfg, live=rows_live, new_kv=(new_k, new_v))
            # Stored bit for bit where index_put stores (inert rows too), and nothing else touched.
            assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
            keep = torch.ones(rows, dtype=torch.bool) if rows_live is None else live[:rows]
            torch.testing.assert_close(out[keep].float(), ref[keep], atol=tol, rtol=tol)
            assert torch.isfinite(out.float()).all()
        print(heads, n_ctx, rows, split_for(rows, heads, n_ctx, cfg), flush=True)
    """
)


def test_triton_self_attention_matches_sdpa_in_the_interpreter(triton_interpreter) -> None:
    splits = [int(line.split()[-1]) for line in triton_interpreter(CHECK)]
    assert len(splits) == 6  # every case ran
    assert splits[1] == 1 and splits[4] == 7 and splits[5] == 8  # the direct path and the split-and-merge one


def test_the_kernel_stores_the_steps_kv_and_attends_like_index_put_then_sdpa(triton_interpreter) -> None:
    splits = [int(line.split()[-1]) for line in triton_interpreter(CHECK_WRITE)]
    assert len(splits) == 5  # every case ran
    assert splits[1] == 1 and splits[3] == 7 and splits[4] == 8  # the direct path and the split-and-merge one
