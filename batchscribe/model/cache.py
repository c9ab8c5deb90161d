"""The decoder's static K/V cache: fixed per-slot buffers the decode step writes in place.

Self-attention K/V hold n_text_ctx positions per slot; cross-attention K/V are written once per window
from the encoder output. The layouts are FlashInfer's paged ones with one page per slot, so every
attention kernel reads the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchscribe.attention import int4_cross
from batchscribe.model.dims import ModelDims


@dataclass
class DecoderCache:
    """Static per-slot K/V buffers, one tensor per layer, in FlashInfer's paged layouts with one page
    per slot: self-attention NHD; cross-attention NHD or, with `cross_hnd`, HND (heads first: each
    row's head reads its 1500 frames as one contiguous run). Lives on the model's device."""

    self_k: list[torch.Tensor]  # n_layer x [n_slots, n_text_ctx, n_head, head_dim]
    self_v: list[torch.Tensor]
    # n_layer x [n_slots, n_audio_ctx, n_head, head_dim]; HND: [n_slots, n_head, n_audio_ctx, head_dim];
    # int4 (cross_dtype torch.uint8): attention/int4_cross's packed layout, heads first whatever cross_hnd says
    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]
    cross_hnd: bool = False

    @classmethod
    def allocate(
        cls,
        dims: ModelDims,
        n_slots: int,
        device: torch.device | str,
        dtype: torch.dtype,
        cross_dtype: torch.dtype | None = None,  # torch.float8_e4m3fn, torch.uint8 (int4); None: dtype
        cross_hnd: bool = False,
    ) -> "DecoderCache":
        head_dim = dims.n_text_state // dims.n_text_head
        self_shape = (n_slots, dims.n_text_ctx, dims.n_text_head, head_dim)
        cross_shape = (n_slots, dims.n_audio_ctx, dims.n_text_head, head_dim)
        if cross_hnd:
            cross_shape = (n_slots, dims.n_text_head, dims.n_audio_ctx, head_dim)

        def make(shape: tuple[int, ...], kind: torch.dtype) -> list[torch.Tensor]:
            if kind == torch.uint8:
                return [int4_cross.allocate(n_slots, dims.n_text_head, dims.n_audio_ctx, head_dim, device)
                        for _ in range(dims.n_text_layer)]  # fmt: skip
            return [torch.zeros(shape, device=device, dtype=kind) for _ in range(dims.n_text_layer)]

        cross = cross_dtype or dtype
        return cls(make(self_shape, dtype), make(self_shape, dtype), make(cross_shape, cross), make(cross_shape, cross),
                   cross_hnd)  # fmt: skip

    @property
    def cross_int4(self) -> bool:
        """The cross cache is attention/int4_cross's packed 4-bit layout."""
        return self.cross_k[0].dtype == torch.uint8

    @property
    def n_slots(self) -> int:
        return self.self_k[0].shape[0]

    @staticmethod
    def bytes_per_slot(dims: ModelDims, dtype: torch.dtype, cross_dtype: torch.dtype | None = None) -> int:
        def size(kind: torch.dtype) -> int:
            return torch.empty((), dtype=kind).element_size()

        if cross_dtype == torch.uint8:  # int4: per frame and head, the packed values and an fp16 scale
            cross = dims.n_audio_ctx * dims.n_text_head * int4_cross.frame_bytes(dims.n_text_state // dims.n_text_head)
        else:
            cross = dims.n_audio_ctx * dims.n_text_state * size(cross_dtype or dtype)
        per_layer = 2 * (dims.n_text_state * dims.n_text_ctx * size(dtype) + cross)
        return per_layer * dims.n_text_layer

    def cross_rows(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cross K and V of `slots` [G] (long, on the cache's device), each
        [G, n_head, n_audio_ctx, head_dim] in `dtype` (fp8 upcast with scale 1, gathered as bytes:
        index_select has no fp8 kernels; int4 dequantised)."""
        if self.cross_int4:
            head_dim = self.self_k[layer].shape[-1]
            return (int4_cross.rows(self.cross_k[layer], slots, head_dim, dtype),
                    int4_cross.rows(self.cross_v[layer], slots, head_dim, dtype))  # fmt: skip
        out = []
        for cached in (self.cross_k[layer], self.cross_v[layer]):
            raw = cached.view(torch.uint8) if cached.element_size() == 1 else cached
            rows = raw.index_select(0, slots).view(cached.dtype).to(dtype)
            out.append(rows if self.cross_hnd else rows.transpose(1, 2))
        return out[0], out[1]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every per-slot buffer ([n_slots, ...]) of every layer: what moves with a slot."""
        return (*self.self_k, *self.self_v, *self.cross_k, *self.cross_v)


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast projected K/V to the cache's dtype. fp8 (e4m3) has no infinity: values beyond its
    range would become NaN, so they saturate instead (scale 1.0, as vLLM's uncalibrated fp8 cache)."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        limit = torch.finfo(dtype).max
        x = x.clamp(-limit, limit)
    return x.to(dtype)
