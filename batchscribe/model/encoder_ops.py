"""The fused encoder's memory-bound passes, with one eager reference each. On CUDA with Triton the
kernels of encoder_triton.py run; elsewhere (the CPU) the eager code below, which is also what the
kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchscribe.model import encoder_triton
from batchscribe.model.fp8 import quantize_rows


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and encoder_triton.triton_available()


def add_norm_reference(y: torch.Tensor, residual: torch.Tensor | None, bias: torch.Tensor | None,
                       norm: torch.nn.LayerNorm, fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """s = y (+ residual) (+ bias) in y's dtype, written over y; returns LayerNorm(s), as e4m3 with
    per-row scales when fp8, else in y's dtype with None."""
    if residual is not None or bias is not None:
        s = y.float()
        if residual is not None:
            s = s + residual.float()
        if bias is not None:
            s = s + bias.float()
        y.copy_(s)
    n = F.layer_norm(y.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps)
    return quantize_rows(n) if fp8 else (n.to(y.dtype), None)


def add_norm(y: torch.Tensor, residual: torch.Tensor | None, bias: torch.Tensor | None, norm: torch.nn.LayerNorm,
             fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """y, residual: [M, D] contiguous; see add_norm_reference."""
    if use_triton(y):
        return encoder_triton.add_norm(y, residual, bias, norm, fp8)
    return add_norm_reference(y, residual, bias, norm, fp8)


def gelu_quant(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU of h [M, N] in its tanh form (the Triton kernel's), quantised to e4m3 per row: fc2's
    fp8 input."""
    if use_triton(h):
        return encoder_triton.gelu_quant(h)
    return quantize_rows(F.gelu(h.float(), approximate="tanh"))


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] as e4m3 with per-row scales."""
    if use_triton(x):
        return encoder_triton.quant_rows(x)
    return quantize_rows(x)
