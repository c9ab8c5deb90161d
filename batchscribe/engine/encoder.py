"""Admission's device side: log-mel features, the encoder and the cross-attention K/V of a chunk of
windows, written once into their slots.

Admission groups are encoded in chunks whose sizes are ENCODER_CHUNKS (the binary decomposition of
the group): a group of any size then reuses a handful of shapes, so cuFFT plans and cuDNN graphs are
built once, and on CUDA each size is one captured graph (graphs.EncoderGraphs).

A batch-invariant engine uses one chunk size, so a window's encoding never depends on the windows
admitted with it (the conv stem's and the GEMMs' kernels change with the chunk size): on CUDA chunks
of INVARIANT_CHUNK, the last one of a group filled with copies of its last window (written to that
window's slot again, the same values), on the CPU chunks of 1 (where padding would cost more than
small chunks do).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchscribe.audio.features import LogMel
from batchscribe.constants import N_SAMPLES
from batchscribe.model.cache import DecoderCache
from batchscribe.model.fused_encoder import FP8_DENSE_LAYERS, FusedEncoder
from batchscribe.model.whisper import Whisper

ENCODER_CHUNKS = (64, 32, 16, 8, 4, 2, 1)
INVARIANT_CHUNK = 8  # a batch-invariant engine's one chunk size on CUDA


def encoder_chunks(n: int, sizes: Sequence[int] = ENCODER_CHUNKS) -> list[slice]:
    """[0, n) cut into consecutive slices whose sizes are `sizes` (descending, ending in 1), largest first."""
    parts, start = [], 0
    for size in sizes:
        while n - start >= size:
            parts.append(slice(start, start + size))
            start += size
    return parts


def padded_chunks(n: int, size: int) -> list[tuple[slice, int]]:
    """[0, n) cut into slices of `size` windows, the last one with the padding that fills it."""
    return [(slice(s, min(s + size, n)), max(0, s + size - n)) for s in range(0, n, size)]


class WindowEncoder:
    """Encodes chunks of windows into a decoder cache's cross K/V. Pure tensor code: eager on the
    CPU, captured once per chunk size on CUDA."""

    def __init__(self, model: Whisper, cache: DecoderCache, max_chunk: int, mode: str = "eager",
                 attention: str = "sdpa", invariant: bool = False):  # fmt: skip
        """mode: EngineConfig.encoder ("eager", "fused" or "fp8"); attention: the fused encoder's
        attention kernel (AttentionPlan.encoder_kernel: "sdpa" or "fa3"); invariant: one chunk size."""
        self.model, self.cache = model, cache
        self.dtype = next(model.parameters()).dtype
        self.device = cache.self_k[0].device
        self.attention = None
        if attention == "fa3":
            if mode == "eager":
                raise ValueError("the fa3 encoder kernel runs in the fused encoder; mode is 'eager'")
            from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention

            dims = model.dims
            self.attention = FlashInferEncoderAttention(self.device, self.dtype, dims.n_audio_head,
                                                        dims.n_audio_state // dims.n_audio_head, dims.n_audio_ctx)  # fmt: skip
        self.encode = model.encoder if mode == "eager" else FusedEncoder(
            model.encoder, fp8=mode == "fp8", dense_layers=FP8_DENSE_LAYERS, attention=self.attention)
        self.features = LogMel(model.dims.n_mels, device=self.device)
        # What an admission can use, largest first (batch-invariant: one size)
        if invariant:
            self.chunk_sizes = [min(INVARIANT_CHUNK, max_chunk) if self.device.type == "cuda" else 1]
        else:
            self.chunk_sizes = [g for g in ENCODER_CHUNKS if g <= max_chunk]

    def chunks(self, n: int) -> list[tuple[slice, int]]:
        """A group of n windows as (slice, padding) chunks: with one chunk size, padding copies of
        the last slice's last window fill it to that size; else the padding is 0."""
        if len(self.chunk_sizes) == 1:
            return padded_chunks(n, self.chunk_sizes[0])
        return [(part, 0) for part in encoder_chunks(n, self.chunk_sizes)]

    @torch.no_grad()
    def __call__(self, audio: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """audio: [g, N_SAMPLES] float32, zero-padded; slot_ids: [g] long, where the K/V go."""
        mel = self.features(audio)  # [g, n_mels, 3000]
        enc = self.encode(mel.to(self.dtype))  # [g, n_audio_ctx, n_state]
        self.model.write_cross_kv(self.cache, enc, slot_ids)

    @torch.no_grad()
    def warm_up(self) -> None:
        """Run every chunk size once, so cuFFT plans, cuDNN convolution/attention graphs and FA3's
        plans are built here, not mid-run (and before they are captured). The K/V go to slot 0,
        which is free."""
        for size in self.chunk_sizes:
            if self.attention is not None:  # a FlashInfer plan per chunk size, before any capture
                self.attention.prepare(size)
            audio = torch.zeros(size, N_SAMPLES, device=self.device)
            self(audio, torch.zeros(size, dtype=torch.long, device=self.device))
