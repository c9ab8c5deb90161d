"""The decode step's narrow projections as split-K GEMMs whose partial sums the next pass adds.

At a step's few hundred rows, a projection with N = d_model outputs (out_proj, the cross-attention
q and out projections, fc2) gives cuBLAS ~20 output tiles for the GPU's 132 SMs, so it reads its
weight with a sixth of the machine (docs/GPU_NOTES.md). Splitting K over more programs spreads
that read; each program writes fp32 partial sums [S, M, N], and the pass that next reads the output
adds them: the residual add and layer norm after out_proj and fc2 (`project_add_norm`), or a small
pass adding the bias (`project`). The stream is then rounded once, from the fp32 sum of the
projection, its bias and the residual, where eager rounds the projection first.

`plan` decides per shape; off CUDA, without Triton, or where it declines, F.linear and
encoder_ops.add_norm run as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from batchscribe.model import encoder_ops
from batchscribe.model.encoder_triton import triton_available

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _partial_kernel(x_ptr, w_ptr, p_ptr, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        """p[split, m, n] = the sum over split's K range of x[m, k] w[n, k], in fp32."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(2)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(split * K_SPLIT, tl.minimum(split * K_SPLIT + K_SPLIT, K), BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                        other=0.0)  # fmt: skip
            # w's rows as nn.Linear stores them (contiguous in k), transposed in registers
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                        other=0.0)  # fmt: skip
            acc += tl.dot(x, tl.trans(w))
        out = p_ptr + split.to(tl.int64) * stride_ps + rm[:, None] * N + rn[None, :]
        tl.store(out, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def _sum_row(p_ptr, bias_ptr, row, cols, mask, stride_ps, N, SPLIT: tl.constexpr):
        """The bias plus row's SPLIT partial sums, fp32."""
        acc = tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(p_ptr + s * stride_ps + row * N + cols, mask=mask, other=0.0)
        return acc

    @triton.jit
    def _sum_kernel(p_ptr, bias_ptr, y_ptr, N, stride_ps, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        acc = _sum_row(p_ptr, bias_ptr, row, cols, mask, stride_ps, N, SPLIT)
        tl.store(y_ptr + row * N + cols, acc.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_norm_kernel(p_ptr, bias_ptr, res_ptr, w_ptr, b_ptr, stream_ptr, out_ptr, N, eps, stride_ps,
                         SPLIT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        """stream = partials + bias + residual, in the model's dtype; out = LayerNorm(stream)."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        res = tl.load(res_ptr + row * N + cols, mask=mask, other=0.0)
        s = _sum_row(p_ptr, bias_ptr, row, cols, mask, stride_ps, N, SPLIT) + res.to(tl.float32)
        stored = s.to(res.dtype)  # the residual stream keeps the model's dtype, as in eager
        tl.store(stream_ptr + row * N + cols, stored, mask=mask)
        s = stored.to(tl.float32)
        mean = tl.sum(s, axis=0) / N
        diff = tl.where(mask, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * N + cols, (diff * rstd * w + b).to(res.dtype), mask=mask)


@dataclass(frozen=True)
class Plan:
    """How one projection splits: K in `split` ranges, tiles of block_m x block_n x block_k."""

    split: int
    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    warps: int = 4
    stages: int = 4


# Above this many 64 x 64 output tiles cuBLAS keeps the GPU busy without a split; below it, K splits
# until there are about TARGET_PROGRAMS programs (~4 an SM on an H100/H200), each range at least
# MIN_DEPTH deep. Chosen by measurement (benchmarks/decoder_gemms.py, docs/GPU_NOTES.md).
MAX_TILES = 100
TARGET_PROGRAMS = 512
MIN_DEPTH = 256


def plan(x: torch.Tensor, linear: nn.Linear) -> Plan | None:
    """A split for x [M, K] through linear (weight [N, K]), or None for F.linear."""
    if not (x.is_cuda and triton_available() and x.dtype in (torch.float16, torch.bfloat16)):
        return None
    if linear.bias is None or x.dim() != 2 or not x.is_contiguous() or not linear.weight.is_contiguous():
        return None
    (m, k), n = x.shape, linear.weight.shape[0]
    split = split_for(m, n, k)
    return Plan(split) if split > 1 else None


def split_for(m: int, n: int, k: int) -> int:
    """How many K ranges a [M, K] x [K, N] product gets: 1 (cuBLAS) where its output tiles already
    fill the GPU or K is too shallow to split."""
    tiles = math.ceil(m / 64) * math.ceil(n / 64)
    if tiles > MAX_TILES:
        return 1
    return max(1, min(TARGET_PROGRAMS // tiles, k // MIN_DEPTH))


def _partials(x: torch.Tensor, weight: torch.Tensor, p: Plan) -> tuple[torch.Tensor, int]:
    """x [M, K] @ weight [N, K]^T as fp32 partial sums [S, M, N], and S."""
    (m, k), n = x.shape, weight.shape[0]
    k_split = math.ceil(k / p.split / p.block_k) * p.block_k
    splits = math.ceil(k / k_split)
    partials = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, p.block_m), triton.cdiv(n, p.block_n), splits)
    _partial_kernel[grid](x, weight, partials, m, n, k, k_split, x.stride(0), weight.stride(0), partials.stride(0),
                          BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k, num_warps=p.warps,
                          num_stages=p.stages)  # fmt: skip
    return partials, splits


def _row_launch(n: int) -> dict[str, int]:
    block = triton.next_power_of_2(n)
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8}


def project(linear: nn.Linear, x: torch.Tensor, p: Plan | None = None) -> torch.Tensor:
    """linear(x) for x [M, K]: split-K where `plan` (or p) says so."""
    p = p or plan(x, linear)
    if p is None:
        return linear(x)
    partials, splits = _partials(x, linear.weight, p)
    m, n = partials.shape[1:]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _sum_kernel[(m,)](partials, linear.bias, y, n, partials.stride(0), SPLIT=splits, **_row_launch(n))
    return y


def project_add_norm(linear: nn.Linear, x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm,
                     p: Plan | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The residual stream residual + linear(x) and its layer norm, both [M, N] in x's dtype."""
    p = p or plan(x, linear)
    if p is None:
        y = linear(x)
        return y, encoder_ops.add_norm(y, residual, None, norm, fp8=False)[0]  # add_norm writes the stream over y
    partials, splits = _partials(x, linear.weight, p)
    m, n = partials.shape[1:]
    stream, out = torch.empty_like(residual), torch.empty_like(residual)
    _add_norm_kernel[(m,)](partials, linear.bias, residual, norm.weight, norm.bias, stream, out, n, norm.eps,
                           partials.stride(0), SPLIT=splits, **_row_launch(n))  # fmt: skip
    return stream, out


def reference(linear: nn.Linear, x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """project_add_norm in float32, rounded once to x's dtype: what the kernels are tested against."""
    s = (F.linear(x.float(), linear.weight.float(), linear.bias.float()) + residual.float()).to(x.dtype)
    n = F.layer_norm(s.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps)
    return s, n.to(x.dtype)
