"""Writing a window's projected cross-attention K or V into its slot of the decoder cache.

On CUDA with Triton, one kernel per layer and K/V reads the projection's rows as the GEMM wrote them
and stores them in the cache's dtype (fp8 saturated, as `to_cache_dtype`) and layout (NHD, or heads
first) at each window's slot. The eager path does the same in three passes (clamp, cast, then an
index_put from a transposed view), which at the encoder's sizes cost more than the K/V GEMMs
themselves; it stays the reference, and what the CPU runs.
"""

from __future__ import annotations

import torch

from batchscribe.attention import int4_cross
from batchscribe.model.cache import to_cache_dtype

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the eager path below
    triton = None

BLOCK_T = 64  # frames per program: 64 x head_dim elements, one contiguous run of the HND cache


def store_reference(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, hnd: bool) -> None:
    """cache: [S, T, H, D] or (hnd) [S, H, T, D]; kv: [B, T, H, D] in the model's dtype; slots: [B]
    long. Writes window b's K/V into cache[slots[b]]."""
    if cache.dtype == torch.uint8:  # the int4 cache, quantised eagerly (its own layout whatever hnd says)
        int4_cross.store(cache, kv, slots)
        return
    cache[slots] = to_cache_dtype(kv.transpose(1, 2) if hnd else kv, cache.dtype)


def store(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, hnd: bool) -> None:
    """As store_reference, by the kernel where it applies: CUDA, Triton, and kv a view whose last
    two dims are one contiguous row per frame (the projection's [B, T, H * D] output as heads)."""
    d = kv.shape[-1]
    rows = kv.stride(-1) == 1 and kv.stride(-2) == d and d & (d - 1) == 0
    if triton is not None and kv.is_cuda and rows and cache.dtype != torch.uint8:
        store_triton(cache, kv, slots, hnd)
    else:
        store_reference(cache, kv, slots, hnd)


def store_triton(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, hnd: bool) -> None:
    """The kernel (on any device Triton runs on: its CPU interpreter in the tests)."""
    b, t, h, d = kv.shape
    fp8 = cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    limit = torch.finfo(cache.dtype).max if fp8 else 0.0
    # Strides of the cache's frame and head axes, whichever layout it has.
    frame_stride, head_stride = (cache.stride(2), cache.stride(1)) if hnd else (cache.stride(1), cache.stride(2))
    grid = (triton.cdiv(t, BLOCK_T), h, b)
    # slots may be a strided view (admission passes a column of its packed ints): its stride goes too.
    _store_kernel[grid](kv, cache, slots, t, kv.stride(0), kv.stride(1), cache.stride(0), frame_stride,
                        head_stride, slots.stride(0), limit, FP8=fp8, D=d, BLOCK_T=BLOCK_T)  # fmt: skip


if triton is not None:

    @triton.jit
    def _store_kernel(src_ptr, dst_ptr, slots_ptr, T, src_b, src_t, dst_s, dst_t, dst_h, slot_stride, limit,
                      FP8: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        # One program: BLOCK_T frames of one head of one window. Its source rows are D contiguous
        # elements every src_t; in an HND cache its destination is one contiguous run.
        tile, head, win = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        frames = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, D)
        mask = (frames[:, None] < T) & (cols[None, :] < D)
        src = src_ptr + win * src_b + frames[:, None].to(tl.int64) * src_t + head * D + cols[None, :]
        x = tl.load(src, mask=mask, other=0.0)
        if FP8:
            x = tl.clamp(x.to(tl.float32), -limit, limit)  # e4m3 has no infinity: saturate, never NaN
        slot = tl.load(slots_ptr + win * slot_stride)
        dst = dst_ptr + slot * dst_s + frames[:, None].to(tl.int64) * dst_t + head * dst_h + cols[None, :]
        tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=mask)
