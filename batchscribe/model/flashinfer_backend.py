"""FlashInfer's batch-decode kernels over the decoder's static caches (CUDA only; `gpu` extra).

The caches are already in FlashInfer's paged NHD layout. Self-attention K/V `[n_slots, n_text_ctx,
n_head, head_dim]` is one page of n_text_ctx positions per slot, so each row attends over exactly its
own length instead of a masked padded length. Cross-attention K/V `[n_slots, 1500, n_head, head_dim]`
is viewed as 1500 / CROSS_PAGE pages per slot, so a small bucket can split the 1500 frames over many
SMs, and it may be stored in fp8 (FlashInfer reads e4m3 directly; half the bytes, though on the H200
its CUDA-core kernel read fp8 only ~8 % faster than bf16: docs/GPU_NOTES.md).

Row i of a step is slot i (the engine steps rows [0, bucket)), so the page tables never change: each
bucket's wrappers are planned once, outside any CUDA graph, and then captured. The only per-step input
is each row's self-attention length, which `begin_step` writes on the device into the buffer the
kernel reads. That is sound because FlashInfer's CUDA-core decode plan depends on the page counts per
request (here always 1), not on the last page's length.

With an HND cross cache (`DecoderCache.cross_hnd`) the cross wrappers read one 1500-frame page per
slot, heads first: each (row, head) streams its K/V as one contiguous run instead of 64-element
pieces strided by n_head * head_dim (which for fp8 are 64-byte pieces). With `cross="triton"` over
an HND cache, cross-attention runs `triton_cross`'s kernel instead (fp8 under CUDA graphs: 3.9-4.0
TB/s against FlashInfer's 3.2-3.3 at 128-512 rows, and 1.2-2.3x faster at 4-32 rows;
docs/GPU_NOTES.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from batchscribe.model import triton_cross, triton_self
from batchscribe.model.attention import SdpaBackend
from batchscribe.model.whisper import DecoderCache

CROSS_PAGE = 250  # frames per cross-attention page; divides n_audio_ctx = 1500
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace (split-kv partials)


class FlashInferUnavailable(RuntimeError):
    """attention="flashinfer" was asked for where it cannot run."""


def flashinfer_available() -> bool:
    try:
        importlib.import_module("flashinfer")
    except Exception:  # ImportError, or a broken CUDA toolchain at import time
        return False
    return True


@dataclass
class _Planned:
    wrapper: Any  # flashinfer.BatchDecodeWithPagedKVCacheWrapper, planned for a fixed batch
    last_page_len: torch.Tensor  # [B] int32: the buffer its kernel reads for each row's length


class FlashInferBackend:
    """The GPU's AttentionBackend: `self_kernel` names the self-attention kernel and `cross` the
    cross-attention one, each "flashinfer", "triton" or "sdpa", so each kind can use whichever
    measured faster."""

    def __init__(
        self,
        cache: DecoderCache,
        q_dtype: torch.dtype,
        self_kernel: str = "flashinfer",
        cross: str = "flashinfer",
    ):
        try:
            import flashinfer
        except Exception as exc:
            raise FlashInferUnavailable(
                f"attention='flashinfer' needs the flashinfer-python package ({exc}); install "
                "batchscribe[gpu] or use attention='sdpa'"
            ) from exc
        self._flashinfer = flashinfer
        k = cache.self_k[0]
        if k.device.type != "cuda":
            raise FlashInferUnavailable(f"FlashInfer runs on CUDA; the cache is on {k.device}: use attention='sdpa'")
        self.device = k.device
        self.q_dtype = q_dtype
        self.n_ctx, self.n_head, self.head_dim = k.shape[1], k.shape[2], k.shape[3]
        if cross not in ("flashinfer", "triton", "sdpa"):
            raise ValueError(f"cross={cross!r}; use 'flashinfer', 'triton' or 'sdpa'")
        self.cross_hnd = cache.cross_hnd
        if cross == "triton" and not (self.cross_hnd and triton_cross.triton_available()):
            raise FlashInferUnavailable("the triton cross kernel needs an HND cross cache and the triton package")
        if self_kernel not in ("flashinfer", "triton", "sdpa"):
            raise ValueError(f"self_kernel={self_kernel!r}; use 'flashinfer', 'triton' or 'sdpa'")
        if self_kernel == "triton" and not triton_cross.triton_available():
            raise FlashInferUnavailable("the triton self-attention kernel needs the triton package")
        self.self_kernel, self.cross = self_kernel, cross
        self._lengths: torch.Tensor | None = None  # [B] this step's positions + 1 (Triton self kernel)
        self.n_audio_ctx = cache.cross_k[0].shape[2 if self.cross_hnd else 1]
        if self.n_audio_ctx % CROSS_PAGE:
            raise ValueError(f"n_audio_ctx={self.n_audio_ctx} is not a multiple of CROSS_PAGE={CROSS_PAGE}")
        self.self_dtype, self.cross_dtype = k.dtype, cache.cross_k[0].dtype
        self._probe_cache = cache.cross_k[0]  # any layer's cross cache: compiles the Triton kernel
        self._probe_self = k  # and a self cache, for the Triton self kernel
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._self: dict[int, _Planned] = {}
        self._cross: dict[int, _Planned] = {}  # FlashInfer cross wrappers per bucket
        self._compiled: set[tuple[str, int, bool]] = set()  # (kernel, bucket, skips rows) compiled
        # [n_slots] bool, the decoder's running flags: rows the Triton kernels must compute (the
        # others are inert, their outputs unused); None: every row.
        self.live_rows: torch.Tensor | None = None
        self._sdpa = SdpaBackend(cross_hnd=self.cross_hnd)

    # -- planning (outside graphs) -------------------------------------------------------------

    def _plan(
        self, n_rows: int, pages_per_row: int, page_size: int, kv_dtype: torch.dtype, layout: str = "NHD"
    ) -> _Planned:
        i32 = dict(dtype=torch.int32, device=self.device)
        indptr = torch.arange(n_rows + 1, **i32) * pages_per_row  # [B + 1]
        indices = torch.arange(n_rows * pages_per_row, **i32)  # row i owns pages of slot i
        last = torch.full((n_rows,), page_size, **i32)  # [B]
        wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last,
        )
        wrapper.plan(
            indptr.clone(), indices.clone(), last.clone(), self.n_head, self.n_head, self.head_dim, page_size,
            q_data_type=self.q_dtype, kv_data_type=kv_dtype,
        )  # fmt: skip
        return _Planned(wrapper, last)

    def prepare(self, n_rows: int) -> None:
        """Plan this batch size's wrappers (host work and copies: never inside a graph capture)."""
        skips = self.live_rows is not None

        def zeros() -> torch.Tensor:
            """Queries to compile with, made only when a kernel is compiled: begin_step calls
            prepare every step, captured steps included, where it must add nothing."""
            return torch.zeros((n_rows, self.n_head, self.head_dim), dtype=self.q_dtype, device=self.device)

        if self.self_kernel == "flashinfer" and n_rows not in self._self:
            self._self[n_rows] = self._plan(n_rows, 1, self.n_ctx, self.self_dtype)
        elif self.self_kernel == "triton" and ("self", n_rows, skips) not in self._compiled:
            # Compile (and load) the kernel for this shape now: never inside a capture.
            k, ones = self._probe_self, torch.ones(n_rows, dtype=torch.long, device=self.device)
            triton_self.self_attention(zeros(), k, k, ones, live=self.live_rows)
            self._compiled.add(("self", n_rows, skips))
        if self.cross == "triton" and ("cross", n_rows, skips) not in self._compiled:
            k = self._probe_cache
            triton_cross.cross_attention(zeros(), k, k, live=self.live_rows)
            self._compiled.add(("cross", n_rows, skips))
        elif self.cross == "flashinfer" and n_rows not in self._cross:
            if self.cross_hnd:  # one page per slot: [n_slots, n_head, n_audio_ctx, head_dim]
                self._cross[n_rows] = self._plan(n_rows, 1, self.n_audio_ctx, self.cross_dtype, "HND")
            else:
                pages = self.n_audio_ctx // CROSS_PAGE
                self._cross[n_rows] = self._plan(n_rows, pages, CROSS_PAGE, self.cross_dtype)

    # -- the step (captured) -------------------------------------------------------------------

    def begin_step(self, positions: torch.Tensor, slots: torch.Tensor | None) -> None:
        if slots is not None:
            raise ValueError("FlashInferBackend steps rows [0, B) as slots [0, B); slots must be None")
        n_rows = positions.shape[0]
        self.prepare(n_rows)  # a no-op once planned (the graph runner plans every bucket up front)
        if self.self_kernel == "flashinfer":
            self._self[n_rows].last_page_len.copy_(positions + 1)  # attends to 0..position
        elif self.self_kernel == "triton":
            self._lengths = positions + 1  # [B]; under capture, a buffer of the graph's pool

    def self_attention(self, q, k_cache, v_cache, slots, positions, kv_len):
        if self.self_kernel == "sdpa":
            return self._sdpa.self_attention(q, k_cache, v_cache, slots, positions, kv_len)
        if self.self_kernel == "triton":  # rows [0, B) are slots [0, B): begin_step refused anything else
            return triton_self.self_attention(q, k_cache, v_cache, self._lengths, live=self.live_rows)
        return self._self[q.shape[0]].wrapper.run(q, (k_cache, v_cache))  # [B, n_head, head_dim]

    def cross_attention(self, q, k_cache, v_cache, slots):
        if self.cross == "sdpa":
            return self._sdpa.cross_attention(q, k_cache, v_cache, slots)
        if self.cross == "triton":  # rows [0, B) are slots [0, B): begin_step refused anything else
            return triton_cross.cross_attention(q, k_cache, v_cache, live=self.live_rows)
        wrapper = self._cross[q.shape[0]].wrapper
        if self.cross_hnd:
            return wrapper.run(q, (k_cache, v_cache))
        paged = (-1, CROSS_PAGE, self.n_head, self.head_dim)  # a view: slot s owns pages s*6 .. s*6+5
        return wrapper.run(q, (k_cache.view(paged), v_cache.view(paged)))
