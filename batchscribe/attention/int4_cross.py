"""The 4-bit cross-attention cache (`--cross-kv int4`) and the Triton kernel that attends over it.

W2's decode step is the cross K/V read: ~82 % of it at the memory roof with the fp8 cache
(docs/GPU_NOTES.md). At 4 bits a value plus one fp16 scale per frame and head, a row reads 0.53x
the bytes, for a larger accuracy cost than fp8's (`benchmarks/cross_kv_accuracy.py`);
`benchmarks/cross_kernels.py --dtypes int4` times this kernel against the fp8 one.

Format: each frame's head_dim values of one head as head_dim / 2 bytes, byte j holding value j in its
low nibble and value j + head_dim / 2 in its high one, symmetric int4 (-7..7, two's complement), and
one fp16 scale (amax / 7). Halves rather than neighbours share a byte, so the kernel splits q and
the output into two halves and never interleaves registers.

Layout, per layer and for K and V alike: one uint8 tensor [n_slots, n_head, n_ctx * (head_dim / 2 +
2)], heads first; each (slot, head) holds its n_ctx frames' bytes, then their n_ctx fp16 scales. One
tensor per layer, like every other cache, so what moves or sizes a slot's cache needs nothing new;
`views` gives the two.
"""

from __future__ import annotations

import math

import torch

from batchscribe.attention.triton_common import LOG2E, check_caches, merge_splits, split_buffers, triton_available
from batchscribe.attention.triton_cross import CrossConfig

LEVELS = 7  # symmetric: -7..7, so a value and its negation round alike


def quantize(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [..., T, D] -> (packed uint8 [..., T, D / 2], scales fp16 [..., T])."""
    x = kv.float()
    # fp16 as stored (the values are divided by what the kernel will multiply by), floored at its
    # smallest normal so that a silent frame divides by something and stores zeros
    scale = (x.abs().amax(dim=-1) / LEVELS).half().clamp_min(torch.finfo(torch.float16).tiny)
    q = (x / scale.float()[..., None]).round().clamp(-LEVELS, LEVELS).to(torch.int32)
    half = kv.shape[-1] // 2
    packed = (q[..., :half] & 0xF) | ((q[..., half:] & 0xF) << 4)
    return packed.to(torch.uint8), scale


def dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """quantize's inverse: [..., T, D] in `dtype` (what the kernel computes with, in fp32)."""
    b = packed.to(torch.int32)
    lo, hi = ((b & 0xF) ^ 8) - 8, ((b >> 4) ^ 8) - 8  # sign-extend each nibble
    return (torch.cat([lo, hi], dim=-1).float() * scale.float()[..., None]).to(dtype)


def frame_bytes(head_dim: int) -> int:
    """Bytes a frame of one head takes: its packed values and its fp16 scale."""
    return head_dim // 2 + 2


def allocate(n_slots: int, n_head: int, n_ctx: int, head_dim: int, device: torch.device | str) -> torch.Tensor:
    """One layer's K (or V) cache, zeroed: uint8 [n_slots, n_head, n_ctx * frame_bytes(head_dim)]."""
    return torch.zeros((n_slots, n_head, n_ctx * frame_bytes(head_dim)), dtype=torch.uint8, device=device)


def views(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache's views: packed values uint8 [n_slots, n_head, n_ctx, head_dim / 2] and scales fp16
    [n_slots, n_head, n_ctx]."""
    n_slots, n_head, width = cache.shape
    n_ctx, half = width // frame_bytes(head_dim), head_dim // 2
    packed = cache[..., : n_ctx * half].unflatten(-1, (n_ctx, half))
    return packed, cache[..., n_ctx * half :].view(torch.float16)


def store(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    """Window b's K or V (kv [B, n_ctx, n_head, head_dim], the projection's frames-first output)
    quantised into cache[slots[b]]."""
    packed, scale = quantize(kv.transpose(1, 2))  # [B, H, T, D / 2], [B, H, T]
    cache_packed, cache_scale = views(cache, kv.shape[-1])
    cache_packed[slots] = packed
    cache_scale[slots] = scale


def rows(cache: torch.Tensor, slots: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The slots' K or V dequantised, [G, n_head, n_ctx, head_dim] in `dtype` (what SDPA, the
    prompt prefill and the words pass read)."""
    packed, scale = views(cache, head_dim)
    return dequantize(packed[slots], scale[slots], dtype)


if triton_available():
    import triton
    import triton.language as tl

    from batchscribe.attention.triton_common import frame_range

    @triton.jit
    def _nibbles(ptr, offs, live):
        """The signed low and high nibbles of the bytes at offs ([N, D / 2]), as fp32."""
        b = tl.load(ptr + offs, mask=live[:, None], other=0).to(tl.int32)
        return (((b & 15) ^ 8) - 8).to(tl.float32), ((((b >> 4) & 15) ^ 8) - 8).to(tl.float32)

    @triton.jit
    def _int4_partial(
        Q, K, KS, V, VS, O, Acc, ML, Live,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_sb, stride_sh, stride_ob, stride_oh,
        n_ctx, scale,
        HALF: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
        HAS_LIVE: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        part = tl.program_id(2)
        d = tl.arange(0, HALF)
        q_at = Q + row * stride_qb + head * stride_qh
        q_lo = tl.load(q_at + d).to(tl.float32) * scale  # [D / 2], log2 units
        q_hi = tl.load(q_at + HALF + d).to(tl.float32) * scale
        base = row.to(tl.int64) * stride_kb + head * stride_kh
        scales = row.to(tl.int64) * stride_sb + head * stride_sh
        start, stop = frame_range(Live, row, part, n_ctx, CHUNK, HAS_LIVE)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.zeros([], tl.float32)
        acc_lo = tl.zeros([HALF], tl.float32)
        acc_hi = tl.zeros([HALF], tl.float32)
        for n0 in range(0, CHUNK, BLOCK_N):
            n = start + n0 + tl.arange(0, BLOCK_N)
            live = n < stop
            offs = base + n[:, None] * stride_kn + d[None, :]  # [BLOCK_N, D / 2] bytes
            k_lo, k_hi = _nibbles(K, offs, live)
            k_scale = tl.load(KS + scales + n, mask=live, other=0.0).to(tl.float32)
            s = (tl.sum(k_lo * q_lo[None, :], 1) + tl.sum(k_hi * q_hi[None, :], 1)) * k_scale
            s = tl.where(live, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)
            l_i = l_i * alpha + tl.sum(p, 0)
            v_lo, v_hi = _nibbles(V, offs, live)
            pv = p * tl.load(VS + scales + n, mask=live, other=0.0).to(tl.float32)  # the value's scale
            acc_lo = acc_lo * alpha + tl.sum(pv[:, None] * v_lo, 0)
            acc_hi = acc_hi * alpha + tl.sum(pv[:, None] * v_hi, 0)
            m_i = m_new
        if SPLIT == 1:
            out = O + row * stride_ob + head * stride_oh
            tl.store(out + d, (acc_lo / l_i).to(O.dtype.element_ty))
            tl.store(out + HALF + d, (acc_hi / l_i).to(O.dtype.element_ty))
        else:  # triton_common's partial layout: [B, H, SPLIT, D] and [B, H, SPLIT, 2]
            slot = (row * tl.num_programs(1) + head) * SPLIT + part
            tl.store(Acc + slot * 2 * HALF + d, acc_lo)
            tl.store(Acc + slot * 2 * HALF + HALF + d, acc_hi)
            tl.store(ML + slot * 2, m_i)
            tl.store(ML + slot * 2 + 1, l_i)


def cross_attention(
    q: torch.Tensor,  # [B, n_head, head_dim], fp16/bf16/fp32
    k_cache: torch.Tensor,  # uint8 [n_slots >= B, n_head, n_ctx * frame_bytes(head_dim)] (the layout above)
    v_cache: torch.Tensor,  # as k_cache
    config: CrossConfig = CrossConfig(),
    live: torch.Tensor | None = None,  # [n_slots >= B] bool: rows whose output is used; None: all
) -> torch.Tensor:  # [B, n_head, head_dim], q's dtype
    """softmax(q kᵀ / sqrt(head_dim)) v for row i over slot i's dequantised frames."""
    n_rows, n_head, head_dim = q.shape
    (k_packed, k_scale), (v_packed, v_scale) = views(k_cache, head_dim), views(v_cache, head_dim)
    check_caches("int4 cross-attention", q, k_packed, v_packed)
    n_ctx = k_packed.shape[2]
    out = torch.empty_like(q)
    split, chunk, acc, ml = split_buffers(out, n_ctx, config)
    _int4_partial[(n_rows, n_head, split)](
        q, k_packed, k_scale, v_packed, v_scale, out, acc, ml, out if live is None else live,
        q.stride(0), q.stride(1), k_packed.stride(0), k_packed.stride(1), k_packed.stride(2),
        k_scale.stride(0), k_scale.stride(1), out.stride(0), out.stride(1), n_ctx, LOG2E / math.sqrt(head_dim),
        HALF=head_dim // 2, BLOCK_N=config.block_n, SPLIT=split, CHUNK=chunk, HAS_LIVE=live is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if split > 1:
        merge_splits(acc, ml, out, split)
    return out
