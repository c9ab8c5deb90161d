"""The attention kernels by name: what each needs and what "auto" prefers. No torch here, so the
CLI can list them in its help without loading it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    name: str
    package: str | None  # "flashinfer" or "triton": what it needs installed (and CUDA); None: SDPA
    hnd: bool = False  # cross kernels: reads the heads-first cross cache


SELF_KERNELS = {k.name: k for k in (Kernel("sdpa", None), Kernel("flashinfer", "flashinfer"), Kernel("triton", "triton"))}
CROSS_KERNELS = {k.name: k for k in (
    Kernel("sdpa", None), Kernel("flashinfer", "flashinfer"), Kernel("flashinfer_hnd", "flashinfer", hnd=True),
    Kernel("triton_hnd", "triton", hnd=True),
)}  # fmt: skip
# "auto"'s preference per kind, fastest first; an fp8 cross cache prefers the Triton kernel, and
# so do models narrower than FLASHINFER_CROSS_MIN_WIDTH: FlashInfer's cross kernel was measured no
# faster there, and importing FlashInfer is about a second of start-up (docs/GPU_NOTES.md).
AUTO_SELF = ("triton", "flashinfer")
AUTO_CROSS = {"auto": ("flashinfer_hnd", "triton_hnd"), "fp8": ("triton_hnd", "flashinfer_hnd")}
AUTO_CROSS_NARROW = ("triton_hnd", "flashinfer_hnd")
FLASHINFER_CROSS_MIN_WIDTH = 1024  # decoder width (n_text_state): medium and the large models


def auto_cross(cross_kv: str, width: int | None) -> tuple[str, ...]:
    """"auto"'s cross kernels, fastest first, for a cross cache of `cross_kv` ("auto" or "fp8") and
    a decoder `width` (None: unknown, taken as wide)."""
    if width is not None and width < FLASHINFER_CROSS_MIN_WIDTH:
        return AUTO_CROSS_NARROW
    return AUTO_CROSS[cross_kv]


def kernel_help() -> str:
    """The kernel names, for --attention's help."""
    return f"self: {', '.join(SELF_KERNELS)}; cross: {', '.join(CROSS_KERNELS)}"
