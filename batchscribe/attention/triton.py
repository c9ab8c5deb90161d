"""batchscribe's Triton decode kernels as attention kernels (CUDA; no FlashInfer needed).

Both read each row's slot directly (row i is slot i) and skip rows the decoder marks as not running
(`set_live_rows`), which a bucket keeps stepping until the next admission. Triton compiles a kernel
per launch shape on first use, which must not happen inside a CUDA graph capture: `prepare` runs it
once for each batch size first.
"""

from __future__ import annotations

import torch

from batchscribe.attention import int4_cross, triton_cross, triton_self
from batchscribe.attention.base import CrossKernel, SelfKernel


class TritonSelf(SelfKernel):
    """`triton_self` over the NHD self cache: each row loops only over its own length."""

    def __init__(self, probe_cache: torch.Tensor, q_dtype: torch.dtype):
        # probe_cache: one layer's self K cache [n_slots, n_text_ctx, H, D], for its dtype and device.
        self.probe, self.q_dtype = probe_cache, q_dtype
        self.live: torch.Tensor | None = None
        self.lengths: torch.Tensor | None = None  # [B] this step's positions + 1
        self.compiled: set[tuple[int, bool]] = set()  # (rows, skips rows)

    def set_live_rows(self, live):
        self.live = live

    def prepare(self, n_rows):
        if (n_rows, self.live is not None) in self.compiled:
            return  # NOTE: begin_step calls this every step, captured ones included: add nothing
        n_head, head_dim = self.probe.shape[2:]
        device = self.probe.device
        ones = torch.ones(n_rows, dtype=torch.long, device=device)
        # Compiled as a step calls it: q, k and v as views of one projection's rows
        # (Attention.qkv) and K/V stored in the cache; the store goes to a scratch cache of one
        # position per row (the strides Triton specialises on divide by 16 alike).
        q, k, v = torch.zeros((n_rows, 3, n_head, head_dim), dtype=self.q_dtype, device=device).unbind(1)
        scratch = torch.zeros((n_rows, 1, n_head, head_dim), dtype=self.probe.dtype, device=device)
        kv = (k.to(scratch.dtype), v.to(scratch.dtype))
        triton_self.self_attention(q, scratch, scratch, ones, live=self.live, new_kv=kv)
        self.compiled.add((n_rows, self.live is not None))

    def begin_step(self, positions):
        self.lengths = positions + 1  # [B]; under capture, a buffer of the graph's pool

    def __call__(self, q, k_cache, v_cache, slots, positions, kv_len):
        return triton_self.self_attention(q, k_cache, v_cache, self.lengths, live=self.live)

    def write_and_attend(self, q, k, v, k_cache, v_cache, index, slots, positions, kv_len):
        # One pass stores K/V at each row's position and attends (row i is slot i, as `index` says).
        return triton_self.self_attention(q, k_cache, v_cache, self.lengths, live=self.live, new_kv=(k, v))


class TritonCross(CrossKernel):
    """`triton_cross` over the heads-first cross cache (model dtype or fp8), or `int4_cross` over
    the int4 one."""

    def __init__(self, probe_cache: torch.Tensor, q_dtype: torch.dtype, head_dim: int):
        # probe_cache: one layer's cross K cache [n_slots, H, n_audio_ctx, D] (int4: packed), to
        # compile against.
        self.probe, self.q_dtype, self.head_dim = probe_cache, q_dtype, head_dim
        self.attend = int4_cross.cross_attention if probe_cache.dtype == torch.uint8 else triton_cross.cross_attention
        self.live: torch.Tensor | None = None
        self.compiled: set[tuple[int, bool]] = set()

    def set_live_rows(self, live):
        self.live = live

    def prepare(self, n_rows):
        if (n_rows, self.live is not None) in self.compiled:
            return
        q = torch.zeros((n_rows, self.probe.shape[1], self.head_dim), dtype=self.q_dtype, device=self.probe.device)
        self.attend(q, self.probe, self.probe, live=self.live)
        self.compiled.add((n_rows, self.live is not None))

    def __call__(self, q, k_cache, v_cache, slots):
        return self.attend(q, k_cache, v_cache, live=self.live)
