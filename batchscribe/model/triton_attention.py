"""A Triton cross-attention decode kernel that reads the cache in its stored dtype (fp8 included).

Cross-attention dominates a large model's decode step: every step, each row reads its window's
1500 frames of K/V in every layer (large-v3: 245.8 MB per row per step in bf16). The work per byte
is tiny, so the kernel is a streaming loop: one program per (row, head) walks the frames in blocks,
upcasting K/V to fp32 in registers, with an online softmax (exp2 domain). Measured on the H200
(docs/GPU_NOTES.md), FlashInfer's CUDA-core decode kernel reads fp8 no faster than bf16; this loop
is what makes fp8 storage pay.

Row i uses slot i (the engine steps rows [0, bucket)); the launch is a single kernel with no host
work beyond argument packing, so it is captured in the decode step's CUDA graph.
"""

from __future__ import annotations

import importlib
import math

import torch

from batchscribe.model.attention import SdpaBackend

BLOCK_N = 64  # frames per loop iteration


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cross_decode(
        Q, K, V, Out,
        scale_log2,
        stride_qb, stride_qh,
        stride_ks, stride_kn, stride_kh,
        stride_vs, stride_vn, stride_vh,
        stride_ob, stride_oh,
        N_CTX: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale_log2  # [D]
        k_base = K + row * stride_ks + head * stride_kh
        v_base = V + row * stride_vs + head * stride_vh
        m_i = tl.zeros([1], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([1], dtype=tl.float32)
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        for start in range(0, N_CTX, BLOCK):
            n = start + tl.arange(0, BLOCK)
            valid = n < N_CTX
            k = tl.load(k_base + n[:, None] * stride_kn + d[None, :], mask=valid[:, None], other=0.0)
            s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)  # [BLOCK] scores, log2 units
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            v = tl.load(v_base + n[:, None] * stride_vn + d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(Out + row * stride_ob + head * stride_oh + d, out.to(Out.dtype.element_ty))

    return cross_decode


_KERNEL = None


def cross_attention_decode(
    q: torch.Tensor,  # [B, n_head, head_dim], fp16/bf16/fp32
    k_cache: torch.Tensor,  # [n_slots >= B, n_ctx, n_head, head_dim], any float dtype incl. fp8
    v_cache: torch.Tensor,
) -> torch.Tensor:  # [B, n_head, head_dim] in q's dtype
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _kernel()
    n_rows, n_head, head_dim = q.shape
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("cross_attention_decode needs the head dimension contiguous")
    out = torch.empty_like(q)
    scale_log2 = (1.0 / math.sqrt(head_dim)) * math.log2(math.e)
    _KERNEL[(n_rows, n_head)](
        q, k_cache, v_cache, out, scale_log2,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        N_CTX=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK=BLOCK_N,
        num_warps=4,
    )  # fmt: skip
    return out


class TritonCrossBackend(SdpaBackend):
    """Cross-attention on the Triton kernel (rows are slots); self-attention stays SDPA."""

    def __init__(self) -> None:
        try:
            importlib.import_module("triton")
        except ImportError as exc:
            raise RuntimeError(f"cross-attention 'triton' needs the triton package ({exc}); use 'sdpa'") from exc

    def cross_attention(self, q, k_cache, v_cache, slots):
        if slots is not None:
            raise ValueError("the Triton cross-attention kernel steps rows [0, B) as slots [0, B); slots must be None")
        return cross_attention_decode(q, k_cache, v_cache)
