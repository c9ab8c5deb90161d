"""Attention backends behind one small interface.

The decoder step asks a backend for two things: attention of one new query per row over that row's
self-attention cache (ragged lengths), and attention over the row's cross-attention K/V (1500 encoder
frames, same for every row). `SdpaBackend` is the reference and the CPU path; the GPU engine can use
`flashinfer_backend.FlashInferBackend` with the same methods. The cross-attention cache may be fp8
(e4m3, scale 1.0): it halves the bytes every decode step reads, the dominant cost of a large model's
step.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionBackend(Protocol):
    def prepare(self, n_rows: int) -> None:
        """Per-batch-size set-up done outside CUDA graph capture (host work, copies)."""
        ...

    def begin_step(
        self,
        positions: torch.Tensor,  # [B] position of each row's new token
        slots: torch.Tensor | None,  # [B] or None
    ) -> None:
        """Called once per decode step before the layers: per-step set-up shared by every layer."""
        ...

    def self_attention(
        self,
        q: torch.Tensor,  # [B, n_head, head_dim]
        k_cache: torch.Tensor,  # [n_slots, n_text_ctx, n_head, head_dim] (one layer)
        v_cache: torch.Tensor,  # [n_slots, n_text_ctx, n_head, head_dim]
        slots: torch.Tensor | None,  # [B] slot of each row; None: row i is slot i
        positions: torch.Tensor,  # [B] position of the new token (attends to 0..position)
        kv_len: int | None,  # host-known upper bound on positions + 1; None: n_text_ctx
    ) -> torch.Tensor:  # [B, n_head, head_dim]
        ...

    def cross_attention(
        self,
        q: torch.Tensor,  # [B, n_head, head_dim]
        k_cache: torch.Tensor,  # [n_slots, n_audio_ctx, n_head, head_dim] (HND caches: heads first)
        v_cache: torch.Tensor,
        slots: torch.Tensor | None,  # [B]
    ) -> torch.Tensor:  # [B, n_head, head_dim]
        ...


def _rows(cache: torch.Tensor, slots: torch.Tensor | None, n_rows: int, length: int) -> torch.Tensor:
    """The rows' cache entries as [B, n_head, length, head_dim] (a view when slots is None)."""
    if slots is None:
        picked = cache[:n_rows, :length]
    else:
        picked = cache[slots, :length]  # gather: copies [B, length, n_head, head_dim]
    return picked.transpose(1, 2)


def _as(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A cache read in the query's dtype: an fp8 cache is upcast (scale 1.0) for SDPA."""
    return x if x.dtype == like.dtype else x.to(like.dtype)


class SdpaBackend:
    """torch's scaled_dot_product_attention with an explicit length mask (reference semantics)."""

    def __init__(self, cross_hnd: bool = False):
        self.cross_hnd = cross_hnd  # the cross cache is [n_slots, n_head, n_audio_ctx, head_dim]

    def prepare(self, n_rows):
        pass

    def begin_step(self, positions, slots):
        pass

    def self_attention(self, q, k_cache, v_cache, slots, positions, kv_len):
        n_rows = q.shape[0]
        length = k_cache.shape[1] if kv_len is None else kv_len
        k = _rows(k_cache, slots, n_rows, length)  # [B, n_head, L, head_dim]
        v = _rows(v_cache, slots, n_rows, length)
        keys = torch.arange(length, device=q.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask)
        return out.squeeze(2)

    def cross_attention(self, q, k_cache, v_cache, slots):
        n_rows = q.shape[0]
        if self.cross_hnd:  # already [B, n_head, n_audio_ctx, head_dim]
            k = k_cache[:n_rows] if slots is None else k_cache[slots]
            v = v_cache[:n_rows] if slots is None else v_cache[slots]
            k, v = _as(k, q), _as(v, q)
        else:
            length = k_cache.shape[1]
            k = _as(_rows(k_cache, slots, n_rows, length), q)
            v = _as(_rows(v_cache, slots, n_rows, length), q)
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v).squeeze(2)

