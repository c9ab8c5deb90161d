"""The 4-bit cross cache (attention/int4_cross): its format against a direct reading of the layout,
and its Triton kernel against SDPA over the dequantised cache, on the CPU through Triton's
interpreter and (on a GPU) compiled, eagerly and from a CUDA graph."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from batchscribe.attention import int4_cross
from tests.marks import needs_cuda


def test_values_pack_by_halves_with_one_scale_per_frame() -> None:
    torch.manual_seed(0)
    kv = torch.randn(2, 3, 5, 8)  # [slots, heads, frames, head_dim]
    kv[0, 0, 0] = 0  # a silent frame: scale floor, zeros back
    packed, scale = int4_cross.quantize(kv)
    assert packed.shape == (2, 3, 5, 4) and packed.dtype == torch.uint8
    assert scale.shape == (2, 3, 5) and scale.dtype == torch.float16
    # Read the layout by hand: byte j's low nibble is value j, its high nibble value j + 4.
    byte = packed.to(torch.int32)
    lo, hi = byte & 0xF, byte >> 4
    signed = torch.cat([lo, hi], dim=-1)
    signed = torch.where(signed > 7, signed - 16, signed)
    expect = (kv / scale.float()[..., None]).round().clamp(-7, 7)
    assert torch.equal(signed, expect.to(torch.int32))
    assert signed.abs().amax(-1).flatten()[1:].eq(7).all()  # each frame's largest value takes level 7
    back = int4_cross.dequantize(packed, scale)
    assert torch.equal(back, signed.float() * scale.float()[..., None])
    assert (back - kv).abs().le(scale.float()[..., None] / 2 + 1e-6).all()  # half a step at most
    assert back[0, 0, 0].eq(0).all()


def test_negative_values_and_extremes_survive_the_round_trip() -> None:
    kv = torch.tensor([[[7.0, -7.0, 3.0, -1.0, 0.0, 7.0, -3.0, 1.0]]])  # amax 7: scale 1, exact
    back = int4_cross.dequantize(*int4_cross.quantize(kv))
    assert torch.equal(back, kv)


# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.attention import int4_cross as ic
    from batchscribe.attention.triton_common import split_for
    from batchscribe.attention.triton_cross import CrossConfig
    torch.manual_seed(0)
    cases = [  # rows, heads, frames, q dtype, config
        (3, 2, 1500, torch.float32, CrossConfig()),
        (2, 3, 1500, torch.float32, CrossConfig(min_programs=1)),
        (2, 2, 300, torch.float16, CrossConfig(block_n=64)),
    ]
    for rows, heads, n, qd, cfg in cases:
        q = torch.randn(rows, heads, 64).to(qd)
        k = ic.quantize(torch.randn(rows + 2, heads, n, 64))  # more slots than rows: rows [0, B) are read
        v = ic.quantize(torch.randn(rows + 2, heads, n, 64))
        out = ic.cross_attention(q, k, v, cfg)
        kd, vd = ic.dequantize(*k)[:rows], ic.dequantize(*v)[:rows]
        ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), kd, vd).squeeze(2)
        assert out.dtype == q.dtype and out.shape == q.shape
        tol = 1e-5 if qd == torch.float32 else 2e-3
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
        live = torch.tensor([i % 2 == 0 for i in range(rows + 2)])
        skipped = ic.cross_attention(q, k, v, cfg, live=live)
        assert torch.isfinite(skipped.float()).all()
        torch.testing.assert_close(skipped[live[:rows]].float(), ref[live[:rows]], atol=tol, rtol=tol)
        assert not torch.allclose(skipped[1].float(), ref[1], atol=tol, rtol=tol)  # row 1 was skipped
        print(split_for(rows, heads, n, cfg), flush=True)
    """
)


def test_int4_cross_attention_matches_sdpa_in_the_interpreter(triton_interpreter) -> None:
    pytest.importorskip("triton")
    splits = [int(line) for line in triton_interpreter(CHECK)]
    assert splits[0] > 1 and splits[1] == 1  # the split-and-merge path and the direct one


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("in_graph", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head,n_rows", [(6, 1), (20, 37), (20, 256)])
def test_int4_cross_matches_sdpa_on_the_gpu(in_graph, dtype, n_head, n_rows) -> None:
    from tests.attention.helpers import capture

    torch.manual_seed(0)
    dev = torch.device("cuda")
    q = torch.randn(n_rows, n_head, 64, device=dev, dtype=dtype)
    k = int4_cross.quantize(torch.randn(n_rows + 3, n_head, 1500, 64, device=dev, dtype=dtype))
    v = int4_cross.quantize(torch.randn(n_rows + 3, n_head, 1500, 64, device=dev, dtype=dtype))
    ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), int4_cross.dequantize(*k)[:n_rows],
                                         int4_cross.dequantize(*v)[:n_rows]).squeeze(2)  # fmt: skip
    if in_graph:
        out = []
        graph = capture(lambda: out.append(int4_cross.cross_attention(q, k, v)))
        graph.replay()
        torch.cuda.synchronize()
        got = out[-1]
    else:
        got = int4_cross.cross_attention(q, k, v)
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)
