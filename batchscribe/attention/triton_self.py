"""Decoder self-attention of one query per row over that row's own length, as a Triton kernel.

The self-attention cache is `[n_slots, n_text_ctx, n_head, head_dim]` per layer, and row i of a
step is slot i. Each (row, head) program reads positions 0..position of its slot (its head's
head_dim-value pieces, strided by n_head * head_dim) with an online softmax in fp32, looping only as
far as that row's length instead of the cache's 448. Small batches split the positions over several
programs (flash-decoding; a split past a row's length reads nothing) and `triton_common.merge_splits`
combines the partial softmaxes, so a few rows with long lengths still spread over the SMs.

Given the decoder's `running` flags, finished and free rows (which keep their last position until
the slot is reused) read one position: finite, unused.

Given the step's new K/V (`new_kv`), the kernel also stores them at each row's position and attends
to them from registers, so a decode step needs no separate cache write (two index_put kernels a
layer). Split 0 takes the new position; the cache reads stop before it, so no program reads what
another writes.

Nothing here syncs with the host or allocates outside the caller's stream, so a step that calls it
can be captured in a CUDA graph once it has run eagerly for that batch size (`TritonSelf.prepare`).
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

    from batchscribe.attention.triton_common import online_softmax_block, store_partial


@dataclass(frozen=True)
class SelfConfig(LaunchShape):
    """Launch shape, chosen by measurement (benchmarks/self_kernels.py under CUDA graphs;
    docs/GPU_NOTES.md has the table): one warp per (row, head) with 32-position blocks."""

    block_n: int = 32  # positions per loop iteration
    num_warps: int = 1


if triton_available():

    @triton.jit
    def _self_partial(
        Q, K, V, O, Acc, ML, Lengths, Live, NewK, NewV,
        stride_qb, stride_qh, stride_kb, stride_kn, stride_kh, stride_ob, stride_oh, stride_nb, stride_nh,
        scale,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
        HAS_LIVE: tl.constexpr, WRITE: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        part = tl.program_id(2)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale  # [D], log2 units
        length = tl.load(Lengths + row).to(tl.int32)  # >= 1: the new token's K/V is in the cache or NewK/NewV
        base = row.to(tl.int64) * stride_kb + head * stride_kh
        last = length - 1  # the new token's position: written there for inert rows too
        if HAS_LIVE:
            length = tl.where(tl.load(Live + row).to(tl.int32) != 0, length, 1)
        if WRITE:  # the last position comes from registers, not the cache
            length = length - 1
        start = part * CHUNK
        stop = tl.minimum(start + CHUNK, length)  # <= start: this split reads nothing
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.zeros([], tl.float32)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        # A split's first block holds a live position whenever the loop runs, so m_i is finite after
        # it (no 0 / 0); split 0 always sees a position (the cache's first, or the new one), so the
        # merge has a finite maximum.
        for n0 in range(start, stop, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            live = n < stop
            offs = base + n[:, None].to(tl.int64) * stride_kn + d[None, :]  # [BLOCK_N, D]
            m_i, l_i, acc = online_softmax_block(K, V, offs, live, q, m_i, l_i, acc)
        if WRITE:
            if part == 0:
                new = row.to(tl.int64) * stride_nb + head * stride_nh + d
                k = tl.load(NewK + new)
                v = tl.load(NewV + new)
                at = base + last.to(tl.int64) * stride_kn + d  # [D]
                tl.store(K + at, k)
                tl.store(V + at, v)
                # The new position, as one more key of the online softmax (the cache's dtype, as read back).
                s = tl.sum(k.to(tl.float32) * q, 0)
                m_new = tl.maximum(m_i, s)
                alpha = tl.exp2(m_i - m_new)  # m_i = -inf (nothing read): 0
                p = tl.exp2(s - m_new)
                acc = acc * alpha + p * v.to(tl.float32)
                l_i = l_i * alpha + p
                m_i = m_new
        store_partial(O, Acc, ML, row, head, part, m_i, l_i, acc, stride_ob, stride_oh, HEAD_DIM, SPLIT)


def self_attention(
    q: torch.Tensor,  # [B, n_head, head_dim], fp16/bf16/fp32
    k_cache: torch.Tensor,  # [n_slots >= B, n_text_ctx, n_head, head_dim], q's dtype
    v_cache: torch.Tensor,  # same shape and strides as k_cache
    lengths: torch.Tensor,  # [B] (any integer dtype, device): row i attends to positions [0, lengths[i])
    config: SelfConfig = SelfConfig(),
    live: torch.Tensor | None = None,  # [n_slots >= B] bool: rows whose output is used; None: all
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # this step's K, V [B, n_head, head_dim], the cache's dtype
) -> torch.Tensor:  # [B, n_head, head_dim], q's dtype
    """softmax(q kᵀ / sqrt(head_dim)) v for row i over slot i's first lengths[i] positions. Rows
    with `live[i]` False read one position and get a finite value nobody uses. With `new_kv`, row
    i's K and V are first stored at position lengths[i] - 1 of slot i (every row, live or not)."""
    check_caches("self-attention", q, k_cache, v_cache)
    n_rows, n_head, head_dim = q.shape
    n_ctx = k_cache.shape[1]
    out = torch.empty_like(q)
    new_k, new_v = (k_cache, v_cache) if new_kv is None else new_kv  # unread without new_kv
    if new_kv is not None and (new_k.stride() != new_v.stride() or new_k.stride(-1) != 1
                               or new_k.dtype != k_cache.dtype or new_k.shape != q.shape):  # fmt: skip
        raise ValueError("the new K and V must be [B, n_head, head_dim] in the cache's dtype, with one layout")
    # Splits by the cache's length (lengths stay on the device: no sync, one graph per bucket).
    split, chunk, acc, ml = split_buffers(out, n_ctx, config)
    _self_partial[(n_rows, n_head, split)](
        q, k_cache, v_cache, out, acc, ml, lengths, lengths if live is None else live, new_k, new_v,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), new_k.stride(0), new_k.stride(1), LOG2E / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_N=config.block_n, SPLIT=split, CHUNK=chunk, HAS_LIVE=live is not None,
        WRITE=new_kv is not None, num_warps=config.num_warps,
    )  # fmt: skip
    if split > 1:
        merge_splits(acc, ml, out, split)
    return out
