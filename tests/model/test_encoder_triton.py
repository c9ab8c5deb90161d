"""The fused encoder's Triton kernels (model/encoder_triton.py) against their eager references
(model/encoder_ops.py): on the CPU through Triton's interpreter, and (on a GPU) compiled, eagerly
and replayed from a CUDA graph."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.marks import needs_cuda

pytest.importorskip("triton")

# Shared by both tests: run in a fresh interpreter process, or in this one on the GPU.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.model import encoder_triton as et, encoder_ops as eo
    from batchscribe.model.fp8 import quantize_rows

    def close_fp8(q1, s1, q2, s2, values=True, rtol=1e-5):
        # At most one e4m3 step apart where the two sides' float32 sums round differently: 2^-3 of
        # the value at worst, or the subnormal step (2^-9 of the row's scale) near zero.
        torch.testing.assert_close(s1, s2, rtol=rtol, atol=0)
        if not values:
            return
        a, b = q1.float() * s1, q2.float() * s2
        assert ((a - b).abs() <= 0.125 * b.abs() + 2**-9 * s2).all()
        assert (q1.view(torch.uint8) != q2.view(torch.uint8)).float().mean() < 0.05

    def check(device, dtypes, graph, fp8_values=True):
        torch.manual_seed(0)
        for d in (384, 1280):
            for dt in dtypes:
                norm = torch.nn.LayerNorm(d).to(device=device, dtype=dt)
                torch.nn.init.normal_(norm.weight), torch.nn.init.normal_(norm.bias)
                for res in (False, True):
                    for bias in (False, True):
                        for fp8 in (False, True):
                            y = torch.randn(37, d, device=device).to(dt)
                            r = torch.randn(37, d, device=device).to(dt) if res else None
                            b = torch.randn(d, device=device).to(dt) if bias else None
                            y1, y2 = y.clone(), y.clone()
                            o1, s1 = graph(lambda: et.add_norm(y1, r, b, norm, fp8), lambda: y1.copy_(y))
                            o2, s2 = eo.add_norm_reference(y2, r, b, norm, fp8)
                            ulp = 0 if dt == torch.float32 else 1e-2  # bf16: one unit in the last place
                            torch.testing.assert_close(y1, y2, rtol=ulp, atol=ulp)
                            if res or bias:
                                assert not torch.equal(y1, y)  # the stream was written over y
                            if fp8:
                                assert o1.dtype == torch.float8_e4m3fn and s1.shape == (37, 1)
                                close_fp8(o1, s1, o2, s2, fp8_values, rtol=2e-2 if ulp else 1e-5)
                            else:
                                assert s1 is None and o1.dtype == dt
                                torch.testing.assert_close(o1.float(), o2.float(), rtol=2e-2 if ulp else 1e-5, atol=2e-2 if ulp else 1e-5)
            h = torch.randn(37, 4 * d, device=device).to(dtypes[-1])
            h[3] = 0  # a padded row: zero scale floor, zero output
            tanh = quantize_rows(F.gelu(h.float(), approximate="tanh"))
            close_fp8(*et.gelu_quant(h), *tanh, fp8_values)  # the default: the tanh form
            for launch in ((0, 8, True), (1024, 4, True)):  # whole rows and in chunks
                close_fp8(*et.gelu_quant(h, launch), *tanh, fp8_values)
            for launch in ((0, 16, False), (1024, 4, False)):  # the erf form on request
                close_fp8(*et.gelu_quant(h, launch), *quantize_rows(F.gelu(h.float())), fp8_values)
            close_fp8(*et.quant_rows(h), *quantize_rows(h), fp8_values)
            assert (et.quant_rows(h)[0][3].float() == 0).all()
        print("ok")

    def eager(fn, reset):
        return fn()
    """
)


def test_encoder_kernels_match_eager_in_the_interpreter(triton_interpreter) -> None:
    # The interpreter rounds float32 -> bfloat16 toward zero (the GPU rounds to nearest): float32
    # checks the arithmetic exactly, bfloat16 within one unit. Its float32 -> e4m3 conversion
    # halves values that round up across a power of two, so e4m3 values are checked on the GPU only
    # (their scales here).
    assert triton_interpreter(CHECK + "\ncheck('cpu', (torch.float32, torch.bfloat16), eager, False)\n") == ["ok"]


def _graphed(fn, reset):
    """fn captured in a CUDA graph, its inputs reset, then replayed: the replay's outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    reset()
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("in_graph", [False, True])
def test_encoder_kernels_match_eager_on_the_gpu(in_graph) -> None:
    scope: dict = {}
    exec(CHECK, scope)
    scope["check"]("cuda", (torch.float32, torch.float16, torch.bfloat16), _graphed if in_graph else scope["eager"])
