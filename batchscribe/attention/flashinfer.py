"""FlashInfer's batch-decode kernels over the decoder's static caches (CUDA only; the `gpu` extra).

The caches are already in FlashInfer's paged layouts. Self-attention K/V `[n_slots, n_text_ctx,
n_head, head_dim]` is one page of n_text_ctx positions per slot, so each row attends over exactly its
own length instead of a masked padded length. Cross-attention K/V `[n_slots, 1500, n_head, head_dim]`
is viewed as 1500 / CROSS_PAGE pages per slot, so a small bucket can split the frames over many SMs;
a heads-first cache `[n_slots, n_head, 1500, head_dim]` is one 1500-frame page per slot, so each
(row, head) streams its K/V as one contiguous run. Either may be fp8 (FlashInfer reads e4m3).

Row i of a step is slot i, so the page tables never change: each bucket's wrappers are planned once,
outside any CUDA graph, and then captured. The only per-step input is each row's self-attention
length, which `begin_step` writes on the device into the buffer the kernel reads. That is sound
because FlashInfer's CUDA-core decode plan depends on the page counts per request (here always 1),
not on the last page's length.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from batchscribe.attention.base import CrossKernel, SelfKernel

CROSS_PAGE = 250  # frames per cross-attention page of a frames-first cache; divides n_audio_ctx
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace (split-kv partials)


def flashinfer_available() -> bool:
    try:
        importlib.import_module("flashinfer")
    except Exception:  # ImportError, or a broken CUDA toolchain at import time
        return False
    return True


class FlashInferWorkspace:
    """The flashinfer module and one float workspace, shared by every wrapper of a decoder (their
    runs are ordered on one stream, so they never use it at the same time)."""

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"FlashInfer runs on CUDA; the cache is on {device}: use attention='sdpa'")
        import flashinfer

        self.flashinfer, self.device = flashinfer, device
        self.buffer = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def plan(self, n_rows: int, pages_per_row: int, page_size: int, n_head: int, head_dim: int,
             q_dtype: torch.dtype, kv_dtype: torch.dtype, layout: str) -> _Planned:  # fmt: skip
        """A graph-ready decode wrapper where row i owns the pages of slot i."""
        i32 = dict(dtype=torch.int32, device=self.device)
        indptr = torch.arange(n_rows + 1, **i32) * pages_per_row  # [B + 1]
        indices = torch.arange(n_rows * pages_per_row, **i32)
        last = torch.full((n_rows,), page_size, **i32)  # [B]
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.buffer, layout, use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last,
        )  # fmt: skip
        wrapper.plan(
            indptr.clone(), indices.clone(), last.clone(), n_head, n_head, head_dim, page_size,
            q_data_type=q_dtype, kv_data_type=kv_dtype,
        )  # fmt: skip
        return _Planned(wrapper, last)


@dataclass
class _Planned:
    wrapper: Any  # flashinfer.BatchDecodeWithPagedKVCacheWrapper, planned for a fixed batch
    last_page_len: torch.Tensor  # [B] int32: the buffer its kernel reads for each row's length


class FlashInferSelf(SelfKernel):
    """Paged decode over one n_text_ctx page per slot; each row's length written per step."""

    def __init__(self, workspace: FlashInferWorkspace, probe_cache: torch.Tensor, q_dtype: torch.dtype):
        # probe_cache: one layer's self K cache [n_slots, n_text_ctx, H, D].
        self.workspace, self.q_dtype, self.kv_dtype = workspace, q_dtype, probe_cache.dtype
        self.n_ctx, self.n_head, self.head_dim = probe_cache.shape[1:]
        self.planned: dict[int, _Planned] = {}

    def prepare(self, n_rows):
        if n_rows not in self.planned:
            self.planned[n_rows] = self.workspace.plan(n_rows, 1, self.n_ctx, self.n_head, self.head_dim,
                                                       self.q_dtype, self.kv_dtype, "NHD")  # fmt: skip

    def begin_step(self, positions):
        self.planned[positions.shape[0]].last_page_len.copy_(positions + 1)  # attends to 0..position

    def __call__(self, q, k_cache, v_cache, slots, positions, kv_len):
        # q may be a view of the fused q/k/v projection's rows (Attention.qkv): FlashInfer reads it packed.
        return self.planned[q.shape[0]].wrapper.run(q.contiguous(), (k_cache, v_cache))  # [B, H, D]


class FlashInferCross(CrossKernel):
    """Paged decode over a frames-first cache in CROSS_PAGE-frame pages, or a heads-first cache
    (`hnd`) in one page per slot."""

    def __init__(self, workspace: FlashInferWorkspace, probe_cache: torch.Tensor, q_dtype: torch.dtype, hnd: bool):
        # probe_cache: one layer's cross K cache, [n_slots, n_audio_ctx, H, D] or (hnd) [n_slots, H, n_audio_ctx, D].
        self.workspace, self.q_dtype, self.kv_dtype, self.hnd = workspace, q_dtype, probe_cache.dtype, hnd
        if hnd:
            _, self.n_head, self.n_audio_ctx, self.head_dim = probe_cache.shape
        else:
            _, self.n_audio_ctx, self.n_head, self.head_dim = probe_cache.shape
        if self.n_audio_ctx % CROSS_PAGE:
            raise ValueError(f"n_audio_ctx={self.n_audio_ctx} is not a multiple of CROSS_PAGE={CROSS_PAGE}")
        self.planned: dict[int, _Planned] = {}

    def prepare(self, n_rows):
        if n_rows in self.planned:
            return
        ws, shape = self.workspace, (self.n_head, self.head_dim, self.q_dtype, self.kv_dtype)
        if self.hnd:
            self.planned[n_rows] = ws.plan(n_rows, 1, self.n_audio_ctx, *shape, "HND")
        else:
            self.planned[n_rows] = ws.plan(n_rows, self.n_audio_ctx // CROSS_PAGE, CROSS_PAGE, *shape, "NHD")

    def __call__(self, q, k_cache, v_cache, slots):
        wrapper = self.planned[q.shape[0]].wrapper
        if self.hnd:
            return wrapper.run(q, (k_cache, v_cache))
        paged = (-1, CROSS_PAGE, self.n_head, self.head_dim)  # a view: slot s owns pages s*6 .. s*6+5
        return wrapper.run(q, (k_cache.view(paged), v_cache.view(paged)))
