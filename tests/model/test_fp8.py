"""fp8 GEMMs (model/fp8.py): per-row e4m3 quantisation, and the scaled GEMM on the CPU (emulated)
and the GPU (torch._scaled_mm) against float64 arithmetic on the dequantised operands."""

from __future__ import annotations

import pytest
import torch

from batchscribe.model.fp8 import E4M3, E4M3_MAX, Fp8Weight, quantize_rows
from tests.marks import needs_cuda


def test_quantize_rows_keeps_e4m3_precision_per_row() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 512) * torch.logspace(-3, 3, 6).unsqueeze(1)  # rows 6 decades apart
    x[2] = 0  # padding: no NaN, zeros back
    q, scale = quantize_rows(x)
    assert q.dtype == E4M3 and scale.shape == (6, 1)
    back = q.float() * scale
    assert (back[2] == 0).all() and torch.isfinite(back).all()
    assert torch.allclose(q.float().abs().amax(dim=1)[[0, 1, 3, 4, 5]], torch.tensor(E4M3_MAX))  # full range used
    normal = x.abs() >= 2**-6 * scale  # e4m3's normal range below the row's largest value
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2**-4 + 1e-6  # 3 mantissa bits: half a step
    assert rel.mean() > 1e-3  # it really is quantised


def _reference(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What a scaled GEMM computes, from the dequantised operands in float64."""
    qa, sa = quantize_rows(a)
    qw, sw = quantize_rows(w)
    return (qa.double() * sa.double()) @ (qw.double() * sw.double()).t() + bias.double()


def test_fp8_weight_emulation_on_the_cpu_is_the_scaled_gemm() -> None:
    torch.manual_seed(1)
    a, w, bias = torch.randn(33, 384), torch.randn(1536, 384) * 0.05, torch.randn(1536)
    layer = Fp8Weight(w, bias, torch.float32)
    assert not layer.hardware and layer.out_features == 1536
    out = layer(*quantize_rows(a))
    torch.testing.assert_close(out.double(), _reference(a, w, bias), rtol=1e-5, atol=1e-5)
    exact = a @ w.t() + bias
    assert 1e-3 < float((out - exact).norm() / exact.norm()) < 0.1  # fp8's error, not a bug's


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_weight_on_the_gpu_is_the_scaled_gemm(dtype) -> None:
    torch.manual_seed(2)
    a = torch.randn(1500, 1280, device="cuda").to(dtype)
    w, bias = (torch.randn(3840, 1280, device="cuda") * 0.02).to(dtype), torch.randn(3840, device="cuda").to(dtype)
    layer = Fp8Weight(w, bias, dtype)
    assert layer.hardware
    out = layer(*quantize_rows(a))
    assert out.dtype == dtype
    ref = _reference(a.float(), w.float(), bias.float())
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)  # float32 accumulation, rounded output
