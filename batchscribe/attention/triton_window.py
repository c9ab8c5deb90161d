"""Cross-attention of a whole token sequence per window over the cross K/V its decoder slot still
holds, as one Triton kernel: the alignment pass's (engine/alignment.py) cross-attention, with the
alignment heads' raw scores written on the way.

The pass runs the decoder over many finished windows at once. Gathering each window's K and V out of
the slot cache first (`DecoderCache.cross_rows`) copies every head's 1500 frames of every layer and
reads them twice more; here each program reads its slot's K and V in place, once: one program per
(window, head, block of queries), an fp32 online softmax over the frames in blocks, the q k^T and
p v products on tensor cores. Where a head is an alignment head, its scaled scores q k^T / sqrt(D)
(before the softmax, fp32) go to `scores[window, index]`, as openai's find_alignment reads them.

Caches may be heads first ([n_slots, H, N, D]) or frames first ([n_slots, N, H, D]), fp16/bf16 or
fp8 (e4m3, scale 1.0); only strides differ. Nothing here syncs with the host, so the pass that calls
it can be captured in a CUDA graph once it has run eagerly.
"""

from __future__ import annotations

import math

import torch

from batchscribe.attention.triton_common import check_caches, triton_available

if triton_available():
    import triton
    import triton.language as tl

BLOCK_M = 64  # queries a program
BLOCK_N = 64  # frames a loop iteration


def window_cross_attention(
    q: torch.Tensor,  # [B, H, L, D] fp16/bf16, any strides with contiguous D
    k_cache: torch.Tensor,  # [n_slots, H, N, D] or [n_slots, N, H, D] (see `hnd`), fp16/bf16/fp8
    v_cache: torch.Tensor,  # same shape and strides as k_cache
    slots: torch.Tensor,  # [B] long: window b reads slot slots[b] (any stride: a column of a table)
    hnd: bool,
    scores: torch.Tensor | None = None,  # [B, A, L, N] float32, written where head_index >= 0
    head_index: torch.Tensor | None = None,  # [H] int32: head h's index in `scores`, or -1
) -> torch.Tensor:  # [B, L, H, D], q's dtype (flatten(2) gives the heads concatenated)
    """softmax(q k^T / sqrt(D)) v for every query of window b over slot slots[b]'s frames."""
    check_caches("window cross-attention", q, k_cache, v_cache)
    batch, n_head, length, head_dim = q.shape
    n_ctx = k_cache.shape[2] if hnd else k_cache.shape[1]
    stride_h, stride_n = (k_cache.stride(1), k_cache.stride(2)) if hnd else (k_cache.stride(2), k_cache.stride(1))
    out = torch.empty((batch, length, n_head, head_dim), dtype=q.dtype, device=q.device)
    has_scores = scores is not None
    if has_scores and (head_index is None or scores.shape[0] < batch or scores.shape[2:] != (length, n_ctx)):
        raise ValueError("scores must be [B, A, L, N] float32 with a head_index [H]")
    sc = scores if has_scores else out  # an unused pointer when there are no scores
    hi = head_index if has_scores else slots
    ss = scores.stride() if has_scores else (0, 0, 0, 0)
    grid = (batch, n_head, triton.cdiv(length, BLOCK_M))
    _window_cross[grid](
        q, k_cache, v_cache, out, sc, slots, hi,
        q.stride(0), q.stride(1), q.stride(2), slots.stride(0), k_cache.stride(0), stride_h, stride_n,
        out.stride(0), out.stride(2), out.stride(1), ss[0], ss[1], ss[2],
        length, n_ctx, 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HAS_SCORES=has_scores, num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


if triton_available():

    # The lengths change with the token bucket: left unspecialised, one compilation per head size.
    @triton.jit(do_not_specialize=["L"])
    def _window_cross(
        Q, K, V, O, S, Slots, HeadIndex,
        stride_qb, stride_qh, stride_qm, stride_slot, stride_ks, stride_kh, stride_kn,
        stride_ob, stride_oh, stride_om, stride_sb, stride_sa, stride_sm,
        L, N, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCORES: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM)
        rows = m < L
        q = tl.load(Q + b * stride_qb + h * stride_qh + m[:, None] * stride_qm + d[None, :], mask=rows[:, None], other=0.0)
        base = tl.load(Slots + b * stride_slot).to(tl.int64) * stride_ks + h * stride_kh
        if HAS_SCORES:
            index = tl.load(HeadIndex + h)
            srow = S + b * stride_sb + tl.maximum(index, 0).to(tl.int64) * stride_sa + m[:, None].to(tl.int64) * stride_sm
            scored = rows & (tl.zeros([BLOCK_M], tl.int32) + index >= 0)  # [BLOCK_M]: none unless an alignment head
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for n0 in range(0, N, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            live = n < N
            offs = base + n[:, None] * stride_kn + d[None, :]  # [BLOCK_N, D]
            k = tl.load(K + offs, mask=live[:, None], other=0.0).to(q.dtype)
            s = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_M, BLOCK_N] fp32: q k^T / sqrt(D)
            if HAS_SCORES:
                tl.store(srow + n[None, :], s, mask=scored[:, None] & live[None, :])
            s = tl.where(live[None, :], s * 1.4426950408889634, float("-inf"))  # to log2 units (x log2 e)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + offs, mask=live[:, None], other=0.0).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
            m_i = m_new
        o = acc / l_i[:, None]
        tl.store(O + b * stride_ob + h * stride_oh + m[:, None] * stride_om + d[None, :], o.to(O.dtype.element_ty),
                 mask=rows[:, None])  # fmt: skip
