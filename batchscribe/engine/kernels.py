"""Which attention kernels a decoder uses, chosen from EngineOptions' names.

Each attention kind (self-attention over the ragged per-slot caches, cross-attention over the
encoder frames) gets its own kernel, picked by measurement (docs/GPU_NOTES.md): SDPA is the reference
and the CPU path; FlashInfer's paged decode kernels (cross-attention over a heads-first cache) are
the GPU default when installed, with Triton kernels (model/triton_self, model/triton_cross) where
they measured faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchscribe.model.attention import AttentionBackend, SdpaBackend
from batchscribe.model.whisper import DecoderCache

# "flashinfer_hnd": FlashInfer over a heads-first cross cache (see flashinfer_backend); "triton_hnd":
# model/triton_cross's kernel over that cache.
KERNELS = {"self": ("sdpa", "flashinfer", "triton"), "cross": ("sdpa", "flashinfer", "flashinfer_hnd", "triton_hnd")}
HND = ("flashinfer_hnd", "triton_hnd")


@dataclass(frozen=True)
class AttentionKinds:
    """Which kernels run each attention kind, and the cross-attention cache's dtype."""

    self_attention: str = "sdpa"  # "sdpa" | "flashinfer" | "triton"
    cross_attention: str = "sdpa"  # "sdpa" | "flashinfer" | "flashinfer_hnd" | "triton_hnd"
    cross_dtype: torch.dtype | None = None  # None: the model's dtype; torch.float8_e4m3fn: fp8

    def __post_init__(self) -> None:
        for kind, name in (("self", self.self_attention), ("cross", self.cross_attention)):
            if name not in KERNELS[kind]:
                raise ValueError(f"{kind}-attention kernel {name!r} is unknown; use one of {KERNELS[kind]}")

    @classmethod
    def resolve(cls, attention: str, cross_kv: str, device: torch.device, dtype: torch.dtype) -> "AttentionKinds":
        """EngineOptions' names -> kernels. `attention` is "auto", one kernel for both kinds, or
        "SELF/CROSS" (e.g. "flashinfer/sdpa"). "auto" on CUDA in fp16/bf16 with FlashInfer
        installed: the Triton self-attention kernel (ragged lengths; at 512 rows and ~70 positions
        50 us per large-v3 layer against FlashInfer's 92 and masked SDPA's 320; FlashInfer where
        triton is missing) and FlashInfer over the heads-first cross cache (a large-v3 step at 256
        rows: 15.5 ms against 19.4 ms over the frames-first one); with an fp8 cache, the Triton
        kernel over it (3.9-4.0 TB/s against FlashInfer's 3.2-3.3; in bf16 it was 5 % slower).
        Figures in docs/GPU_NOTES.md. SDPA everywhere else (CPU, float32)."""
        if cross_kv not in ("auto", "fp8"):
            raise ValueError(f"cross_kv={cross_kv!r}; use 'auto' (the model's dtype) or 'fp8'")
        half = dtype in (torch.float16, torch.bfloat16)
        if attention == "auto":
            from batchscribe.model.flashinfer_backend import flashinfer_available
            from batchscribe.model.triton_cross import triton_available

            fast = device.type == "cuda" and half and flashinfer_available()
            cross_fast = "triton_hnd" if cross_kv == "fp8" and triton_available() else "flashinfer_hnd"
            self_fast = "triton" if triton_available() else "flashinfer"
            self_kind, cross_kind = (self_fast, cross_fast) if fast else ("sdpa", "sdpa")
        else:
            self_kind, _, cross_kind = attention.partition("/")
            cross_kind = cross_kind or self_kind
            if self_kind not in KERNELS["self"] or cross_kind not in KERNELS["cross"]:
                raise ValueError(f"attention={attention!r}; use 'auto', 'sdpa', 'flashinfer' or 'SELF/CROSS' with "
                                 f"SELF in {KERNELS['self']} and CROSS in {KERNELS['cross']}")  # fmt: skip
        if not half and (self_kind, cross_kind) != ("sdpa", "sdpa"):
            raise ValueError(f"attention={attention!r} runs in float16 or bfloat16, not {dtype}; "
                             "pick one of those dtypes or attention='sdpa'")  # fmt: skip
        if (self_kind, cross_kind) != ("sdpa", "sdpa"):
            from batchscribe.model.flashinfer_backend import flashinfer_available

            if device.type != "cuda" or not flashinfer_available():
                where = "flashinfer-python is not installed" if device.type == "cuda" else f"the device is {device}"
                raise ValueError(f"attention={attention!r} needs FlashInfer on a CUDA device, but {where}; "
                                 "install batchscribe[gpu] on a GPU machine or use attention='sdpa'")  # fmt: skip
        cross_dtype = torch.float8_e4m3fn if cross_kv == "fp8" else None
        return cls(self_kind, cross_kind, cross_dtype)

    @property
    def uses_flashinfer(self) -> bool:
        return self.self_attention != "sdpa" or self.cross_attention != "sdpa"

    @property
    def cross_hnd(self) -> bool:
        """The cross cache is laid out heads first."""
        return self.cross_attention in HND

    def backend(self, cache: DecoderCache, q_dtype: torch.dtype) -> AttentionBackend:
        if cache.cross_hnd != self.cross_hnd:
            raise ValueError("the cache's cross layout does not match the cross-attention kernel")
        if not self.uses_flashinfer:
            return SdpaBackend(cross_hnd=self.cross_hnd)
        from batchscribe.model.flashinfer_backend import FlashInferBackend

        cross = {"sdpa": "sdpa", "triton_hnd": "triton"}.get(self.cross_attention, "flashinfer")
        return FlashInferBackend(cache, q_dtype, self_kernel=self.self_attention, cross=cross)
