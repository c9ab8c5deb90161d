"""The attention interface the decoder step calls, and the two kernel kinds behind it.

A decode step asks for two attentions per layer, one new query per row:

- self-attention over the row's own cache, positions [0, position] (ragged lengths);
- cross-attention over the row's 1500 encoder frames (the same length for every row).

Each kind has its own kernel (`SelfKernel`, `CrossKernel`), chosen independently by the registry;
`AttentionBackend` pairs one of each. Shapes (one layer; `B` rows, `H` heads of `D`):

    q                 [B, H, D]
    self K/V cache    [n_slots, n_text_ctx, H, D]
    cross K/V cache   [n_slots, n_audio_ctx, H, D], or heads first [n_slots, H, n_audio_ctx, D]
    output            [B, H, D], q's dtype

Row i is slot i unless `slots` ([B] long) names the slots; only kernels with `gathers_rows` accept
`slots`. Everything a kernel does in `begin_step` and its call is capturable in a CUDA graph;
`prepare` is the host work (planning, compiling) that must happen before a capture.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class SelfKernel(ABC):
    """Self-attention of one query per row over that row's first `position + 1` cache entries."""

    gathers_rows = False  # accepts `slots` (rows that are not slots 0..B-1)

    def prepare(self, n_rows: int) -> None:
        """Host work for a batch of n_rows (planning, compiling); never inside a capture."""

    def begin_step(self, positions: torch.Tensor) -> None:
        """Per-step set-up shared by every layer. positions: [B] long, the new token's position."""

    def set_live_rows(self, live: torch.Tensor | None) -> None:
        """live: [n_slots] bool, rows whose output is used (others may be skipped); None: all."""

    @abstractmethod
    def __call__(
        self,
        q: torch.Tensor,  # [B, H, D]
        k_cache: torch.Tensor,  # [n_slots, n_text_ctx, H, D]
        v_cache: torch.Tensor,
        slots: torch.Tensor | None,  # [B] long, or None: row i is slot i
        positions: torch.Tensor,  # [B] long: row i attends to [0, positions[i]]
        kv_len: int | None,  # host-known bound on max(positions) + 1; None: n_text_ctx
    ) -> torch.Tensor:  # [B, H, D]
        ...

    def write_and_attend(
        self,
        q: torch.Tensor,  # [B, H, D]
        k: torch.Tensor,  # [B, H, D]: this step's keys, the cache's dtype
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [n_slots, n_text_ctx, H, D]
        v_cache: torch.Tensor,
        index: tuple[torch.Tensor, torch.Tensor],  # ([B] slots, [B] positions): where k and v go
        slots: torch.Tensor | None,
        positions: torch.Tensor,
        kv_len: int | None,
    ) -> torch.Tensor:  # [B, H, D]
        """Store this step's K/V at each row's (slot, position), then attend, so the token sees
        itself. A kernel that can store them in its own pass overrides this."""
        k_cache.index_put_(index, k)
        v_cache.index_put_(index, v)
        return self(q, k_cache, v_cache, slots, positions, kv_len)


class CrossKernel(ABC):
    """Cross-attention of one query per row over that row's encoder frames."""

    gathers_rows = False

    def prepare(self, n_rows: int) -> None:
        """Host work for a batch of n_rows; never inside a capture."""

    def set_live_rows(self, live: torch.Tensor | None) -> None:
        """As SelfKernel.set_live_rows."""

    @abstractmethod
    def __call__(
        self,
        q: torch.Tensor,  # [B, H, D]
        k_cache: torch.Tensor,  # [n_slots, n_audio_ctx, H, D] or heads first [n_slots, H, n_audio_ctx, D]
        v_cache: torch.Tensor,
        slots: torch.Tensor | None,  # [B] long, or None
    ) -> torch.Tensor:  # [B, H, D]
        ...


class AttentionBackend:
    """One self-attention kernel and one cross-attention kernel: what `Whisper.decode_step` calls."""

    def __init__(self, self_kernel: SelfKernel, cross_kernel: CrossKernel):
        self.self_kernel, self.cross_kernel = self_kernel, cross_kernel

    def prepare(self, n_rows: int) -> None:
        """Plan or compile both kernels for n_rows rows, outside any CUDA graph capture."""
        self.self_kernel.prepare(n_rows)
        self.cross_kernel.prepare(n_rows)

    def begin_step(self, positions: torch.Tensor, slots: torch.Tensor | None) -> None:
        """Once per decode step, before the layers. positions: [B] long; slots: [B] long or None."""
        if slots is not None and not (self.self_kernel.gathers_rows and self.cross_kernel.gathers_rows):
            raise ValueError(f"{type(self.self_kernel).__name__}/{type(self.cross_kernel).__name__} step rows "
                             "[0, B) as slots [0, B); slots must be None")  # fmt: skip
        # A no-op once planned: the graph runner prepares every bucket before capturing.
        self.prepare(positions.shape[0])
        self.self_kernel.begin_step(positions)

    def set_live_rows(self, live: torch.Tensor | None) -> None:
        """live: [n_slots] bool, the decoder's running flags; kernels may skip the other rows."""
        self.self_kernel.set_live_rows(live)
        self.cross_kernel.set_live_rows(live)

    def self_attention(self, q, k_cache, v_cache, slots, positions, kv_len) -> torch.Tensor:
        return self.self_kernel(q, k_cache, v_cache, slots, positions, kv_len)

    def write_and_attend(self, q, k, v, k_cache, v_cache, index, slots, positions, kv_len) -> torch.Tensor:
        """A decode step's self-attention: store k, v [B, H, D] at `index` ([B] slots, [B]
        positions), then attend as `self_attention` does (SelfKernel.write_and_attend)."""
        return self.self_kernel.write_and_attend(q, k, v, k_cache, v_cache, index, slots, positions, kv_len)

    def cross_attention(self, q, k_cache, v_cache, slots) -> torch.Tensor:
        return self.cross_kernel(q, k_cache, v_cache, slots)
