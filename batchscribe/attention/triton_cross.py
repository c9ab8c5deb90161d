"""Cross-attention of one query per row over a heads-first cross cache, as a Triton kernel.

Decode-time cross-attention is a pure bandwidth problem: every step, each (row, head) reads its
1500 encoder frames of K and V once and does two dot products per frame. With the cache laid out
heads first ([n_slots, n_head, n_audio_ctx, head_dim]) each (row, head)'s K and V are contiguous
runs, so one program streams them with wide loads and an online softmax, in fp32, from bf16/fp16 or
fp8 (e4m3, scale 1.0) caches alike. Small batches split the frames over several programs
(flash-decoding) and `triton_common.merge_splits` combines the partial softmaxes, so a bucket of a
few rows still spreads over the SMs. Given the decoder's `running` flags, rows that have finished
(or hold no window) read next to nothing: a bucket keeps stepping them until the next admission.

Row i of a step is slot i. Nothing here syncs with the host or allocates outside the caller's
stream, so a step that calls it can be captured in a CUDA graph once it has run eagerly for that
batch size (`TritonCross.prepare`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from batchscribe.attention.triton_common import LOG2E, LaunchShape, check_caches, merge_splits, split_buffers
from batchscribe.attention.triton_common import triton_available

if triton_available():
    import triton
    import triton.language as tl

    from batchscribe.attention.triton_common import frame_range, online_softmax_block, store_partial


@dataclass(frozen=True)
class CrossConfig(LaunchShape):
    """Launch shape, chosen by measurement (benchmarks/cross_kernels.py under CUDA graphs;
    docs/GPU_NOTES.md): 256-frame blocks; how far small batches split mattered little."""

    block_n: int = 256  # frames per loop iteration
    num_warps: int = 4
    num_stages: int = 2


if triton_available():

    @triton.jit
    def _cross_partial(
        Q, K, V, O, Acc, ML, Live,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_ob, stride_oh,
        n_ctx, scale,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
        HAS_LIVE: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        part = tl.program_id(2)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale  # [D], log2 units
        base = row.to(tl.int64) * stride_kb + head * stride_kh
        start, stop = frame_range(Live, row, part, n_ctx, CHUNK, HAS_LIVE)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.zeros([], tl.float32)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        for n0 in range(0, CHUNK, BLOCK_N):  # a trip count known at compile time; the mask ends it
            n = start + n0 + tl.arange(0, BLOCK_N)
            live = n < stop
            offs = base + n[:, None] * stride_kn + d[None, :]  # [BLOCK_N, D]
            m_i, l_i, acc = online_softmax_block(K, V, offs, live, q, m_i, l_i, acc)
        store_partial(O, Acc, ML, row, head, part, m_i, l_i, acc, stride_ob, stride_oh, HEAD_DIM, SPLIT)


def cross_attention(
    q: torch.Tensor,  # [B, n_head, head_dim], fp16/bf16
    k_cache: torch.Tensor,  # [n_slots >= B, n_head, n_ctx, head_dim], fp16/bf16/fp8 (scale 1.0)
    v_cache: torch.Tensor,  # same shape and strides as k_cache
    config: CrossConfig = CrossConfig(),
    live: torch.Tensor | None = None,  # [n_slots >= B] bool: rows whose output is used; None: all
) -> torch.Tensor:  # [B, n_head, head_dim], q's dtype
    """softmax(q kᵀ / sqrt(head_dim)) v for row i over slot i's frames. Rows with `live[i]` False
    read one frame per split and get a finite value nobody uses."""
    check_caches("cross-attention", q, k_cache, v_cache)
    n_rows, n_head, head_dim = q.shape
    n_ctx = k_cache.shape[2]
    out = torch.empty_like(q)
    split, chunk, acc, ml = split_buffers(out, n_ctx, config)
    scale = LOG2E / math.sqrt(head_dim)
    _cross_partial[(n_rows, n_head, split)](
        q, k_cache, v_cache, out, acc, ml, out if live is None else live,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), n_ctx, scale,
        HEAD_DIM=head_dim, BLOCK_N=config.block_n, SPLIT=split, CHUNK=chunk, HAS_LIVE=live is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if split > 1:
        merge_splits(acc, ml, out, split)
    return out
