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
# The encoder's self-attention over each window's frames (the fused encoder only): SDPA, or
# FlashInfer's FA3 prefill on Hopper.
ENCODER_KERNELS = {k.name: k for k in (Kernel("sdpa", None), Kernel("fa3", "flashinfer"))}
# "auto"'s preference per kind, fastest first; an fp8 cross cache prefers the Triton kernel, and
# only Triton (or SDPA, dequantising) reads the int4 one.
AUTO_SELF = ("triton", "flashinfer")
AUTO_CROSS = {"auto": ("flashinfer_hnd", "triton_hnd"), "fp8": ("triton_hnd", "flashinfer_hnd"), "int4": ("triton_hnd",)}


def kernel_help() -> str:
    """The kernel names, for --attention's help."""
    return (f"self: {', '.join(SELF_KERNELS)}; cross: {', '.join(CROSS_KERNELS)}; "
            f"encoder: {', '.join(ENCODER_KERNELS)}")
