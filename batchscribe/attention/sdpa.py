"""The reference kernels: torch's scaled_dot_product_attention over the static caches (CPU and GPU).

Self-attention masks each row to its own length within a padded length (`kv_len`); cross-attention
reads all 1500 frames. An fp8 cross cache (e4m3, scale 1.0) is upcast to the query's dtype, an int4
one (attention/int4_cross) dequantised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchscribe.attention import int4_cross
from batchscribe.attention.base import AttentionBackend, CrossKernel, SelfKernel


def _rows(cache: torch.Tensor, slots: torch.Tensor | None, n_rows: int, length: int) -> torch.Tensor:
    """The rows' cache entries as [B, H, length, D] (a view when slots is None)."""
    if slots is None:
        picked = cache[:n_rows, :length]
    else:
        picked = cache[slots, :length]  # gather: copies [B, length, H, D]
    return picked.transpose(1, 2)


def _as(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A cache read in the query's dtype: an fp8 cache is upcast (scale 1.0)."""
    return x if x.dtype == like.dtype else x.to(like.dtype)


class SdpaSelf(SelfKernel):
    """Masked SDPA over the first kv_len positions."""

    gathers_rows = True

    def __call__(self, q, k_cache, v_cache, slots, positions, kv_len):
        n_rows = q.shape[0]
        length = k_cache.shape[1] if kv_len is None else kv_len
        k = _rows(k_cache, slots, n_rows, length)  # [B, H, L, D]
        v = _rows(v_cache, slots, n_rows, length)
        keys = torch.arange(length, device=q.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask)
        return out.squeeze(2)


class SdpaCross(CrossKernel):
    """SDPA over every encoder frame, frames-first or heads-first (`hnd`) caches."""

    gathers_rows = True

    def __init__(self, hnd: bool = False):
        self.hnd = hnd  # the cache is [n_slots, H, n_audio_ctx, D]

    def __call__(self, q, k_cache, v_cache, slots):
        n_rows = q.shape[0]
        if k_cache.dtype == torch.uint8:  # int4: heads first, whatever hnd says
            picked = torch.arange(n_rows, device=q.device) if slots is None else slots
            k, v = (int4_cross.rows(c, picked, q.shape[-1], q.dtype) for c in (k_cache, v_cache))
        elif self.hnd:  # already [B, H, n_audio_ctx, D]
            k = k_cache[:n_rows] if slots is None else k_cache[slots]
            v = v_cache[:n_rows] if slots is None else v_cache[slots]
            k, v = _as(k, q), _as(v, q)
        else:
            length = k_cache.shape[1]
            k = _as(_rows(k_cache, slots, n_rows, length), q)
            v = _as(_rows(v_cache, slots, n_rows, length), q)
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v).squeeze(2)


class SdpaBackend(AttentionBackend):
    """Both kinds on SDPA: the reference semantics, and the CPU path."""

    def __init__(self, cross_hnd: bool = False):
        super().__init__(SdpaSelf(), SdpaCross(cross_hnd))
