"""The one list of attention kernels: what each needs, how "auto" and "SELF/CROSS[/ENCODER]" resolve,
and how a backend is built from the result.

Each attention kind gets its own kernel, chosen by measurement (docs/GPU_NOTES.md): SDPA is the
reference and the CPU path; on CUDA in fp16/bf16, "auto" picks batchscribe's Triton self-attention
kernel (each row loops over its own length) and FlashInfer's decode over a heads-first cross cache,
or the Triton cross kernel when the cross cache is fp8. A kernel whose package is missing falls back
to the next: Triton without FlashInfer, FlashInfer without Triton, SDPA without either. The
encoder's attention is FlashInfer's FA3 prefill where it runs (Hopper), else SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from batchscribe.attention.base import AttentionBackend, CrossKernel, SelfKernel
from batchscribe.attention.names import AUTO_CROSS, AUTO_SELF, CROSS_KERNELS, ENCODER_KERNELS, SELF_KERNELS, Kernel
from batchscribe.attention.sdpa import SdpaBackend, SdpaCross, SdpaSelf
from batchscribe.config import ConfigError


def package_available(package: str) -> bool:
    if package == "triton":
        from batchscribe.attention.triton_common import triton_available

        return triton_available()
    from batchscribe.attention.flashinfer import flashinfer_available

    return flashinfer_available()


@dataclass(frozen=True)
class AttentionPlan:
    """Which kernel runs each attention kind, and the cross-attention cache's dtype."""

    self_kernel: str = "sdpa"
    cross_kernel: str = "sdpa"
    cross_dtype: torch.dtype | None = None  # None: the model's dtype; torch.float8_e4m3fn: fp8; torch.uint8: int4
    encoder_kernel: str = "sdpa"  # the fused encoder's attention over each window's frames

    def __post_init__(self) -> None:
        kinds = (("self", self.self_kernel, SELF_KERNELS), ("cross", self.cross_kernel, CROSS_KERNELS),
                 ("encoder", self.encoder_kernel, ENCODER_KERNELS))  # fmt: skip
        for kind, name, known in kinds:
            if name not in known:
                raise ConfigError(f"{kind}-attention kernel {name!r} is unknown; use one of {tuple(known)}")

    @property
    def cross_hnd(self) -> bool:
        """The cross cache is laid out heads first."""
        return CROSS_KERNELS[self.cross_kernel].hnd

    @property
    def ragged_self(self) -> bool:
        """The self-attention kernel reads each row's own length (no padded length buckets)."""
        return self.self_kernel != "sdpa"

    def describe(self, dtype: torch.dtype) -> str:
        """"SELF/CROSS/cross-cache dtype", e.g. "triton/flashinfer_hnd/float16", and "/encoder-fa3"
        after it when the encoder's attention is not SDPA (so folders written before the encoder
        kernel existed keep their identity)."""
        cross = "int4" if self.cross_dtype == torch.uint8 else str(self.cross_dtype or dtype).removeprefix("torch.")
        encoder = "" if self.encoder_kernel == "sdpa" else f"/encoder-{self.encoder_kernel}"
        return f"{self.self_kernel}/{self.cross_kernel}/{cross}{encoder}"


def resolve_attention(attention: str, cross_kv: str, device: torch.device, dtype: torch.dtype,
                      fused_encoder: bool = True) -> AttentionPlan:  # fmt: skip
    """EngineOptions' names -> kernels. `attention` is "auto", one kernel name for the decoder's
    two kinds, or "SELF/CROSS[/ENCODER]" (e.g. "triton/flashinfer_hnd/fa3"; the encoder's is SDPA
    unless named); `cross_kv` is "auto", "fp8" or "int4" (EngineOptions checked it); `fused_encoder`:
    whether the encoder runs fused (EngineConfig.encoder), the only form that takes another
    encoder kernel than SDPA. Raises ConfigError naming the fix where a kernel cannot run."""
    half = dtype in (torch.float16, torch.bfloat16)
    if attention == "auto":
        fast = device.type == "cuda" and half
        self_kind = _first_available(AUTO_SELF, SELF_KERNELS) if fast else "sdpa"
        cross_kind = _first_available(AUTO_CROSS[cross_kv], CROSS_KERNELS) if fast else "sdpa"
        encoder_kind = "fa3" if fast and fused_encoder and fa3_runs(device) else "sdpa"
    else:
        parts = attention.split("/")
        if len(parts) == 1:
            parts *= 2  # one name for the decoder's two kinds
        if len(parts) == 2:
            parts.append("sdpa")
        self_kind, cross_kind, encoder_kind = (parts + ["?"] * 3)[:3]
        if (len(parts) > 3 or self_kind not in SELF_KERNELS or cross_kind not in CROSS_KERNELS
                or encoder_kind not in ENCODER_KERNELS):  # fmt: skip
            raise ConfigError(f"attention={attention!r}; use 'auto', 'sdpa', 'flashinfer' or 'SELF/CROSS[/ENCODER]' "
                              f"with SELF in {tuple(SELF_KERNELS)}, CROSS in {tuple(CROSS_KERNELS)} and ENCODER in "
                              f"{tuple(ENCODER_KERNELS)}")  # fmt: skip
        if encoder_kind != "sdpa" and not fused_encoder:
            raise ConfigError(f"attention={attention!r}: the {encoder_kind} encoder kernel runs in the fused encoder "
                              "(CUDA, float16 or bfloat16, Triton), which this run does not use; end the name "
                              "with /sdpa")  # fmt: skip
        if cross_kv == "int4" and CROSS_KERNELS[cross_kind].package == "flashinfer":
            raise ConfigError(f"attention={attention!r} with cross_kv='int4': FlashInfer cannot read the 4-bit "
                              "cross cache; use the triton_hnd or sdpa cross kernel (auto picks triton_hnd), or "
                              "cross_kv 'fp8'")  # fmt: skip
        _check_runs(attention, (SELF_KERNELS[self_kind], CROSS_KERNELS[cross_kind], ENCODER_KERNELS[encoder_kind]),
                    device, half, dtype)  # fmt: skip
        if encoder_kind == "fa3" and not fa3_runs(device):
            name = torch.cuda.get_device_name(device)
            raise ConfigError(f"attention={attention!r}: the fa3 encoder kernel runs on Hopper GPUs (compute "
                              f"capability 9.x); {name} is not one; end the name with /sdpa or drop /fa3")  # fmt: skip
    cross_dtype = {"fp8": torch.float8_e4m3fn, "int4": torch.uint8}.get(cross_kv)
    return AttentionPlan(self_kind, cross_kind, cross_dtype, encoder_kind)


def fa3_runs(device: torch.device) -> bool:
    """FlashInfer is installed and its FA3 kernels run on this device (a Hopper GPU)."""
    from batchscribe.attention.flashinfer_prefill import fa3_supported

    return fa3_supported(device) and package_available("flashinfer")


def _first_available(names: tuple[str, ...], known: dict[str, Kernel]) -> str:
    return next((n for n in names if package_available(known[n].package)), "sdpa")


def _check_runs(attention: str, kernels: tuple[Kernel, ...], device: torch.device, half: bool,
                dtype: torch.dtype) -> None:  # fmt: skip
    packages = {kernel.package for kernel in kernels} - {None}
    if not packages:
        return
    if not half:
        raise ConfigError(f"attention={attention!r} runs in float16 or bfloat16, not {dtype}; "
                          "pick one of those dtypes or attention='sdpa'")  # fmt: skip
    if "flashinfer" in packages and (device.type != "cuda" or not package_available("flashinfer")):
        where = "flashinfer-python is not installed" if device.type == "cuda" else f"the device is {device}"
        raise ConfigError(f"attention={attention!r} needs FlashInfer on a CUDA device, but {where}; "
                          "install batchscribe[gpu] on a GPU machine or use attention='sdpa'")  # fmt: skip
    if device.type != "cuda":
        raise ConfigError(f"attention={attention!r} needs a CUDA device (Triton kernels), but the device is "
                          f"{device}; use attention='sdpa'")  # fmt: skip
    if "triton" in packages and not package_available("triton"):
        raise ConfigError(f"attention={attention!r} needs the triton package, which CUDA builds of torch "
                          "ship on Linux; install it or use attention='sdpa'")  # fmt: skip


class CacheLike(Protocol):
    self_k: list[torch.Tensor]  # per layer [n_slots, n_text_ctx, H, D]
    cross_k: list[torch.Tensor]  # per layer [n_slots, n_audio_ctx, H, D], or heads first
    cross_hnd: bool


def build_backend(plan: AttentionPlan, cache: CacheLike, q_dtype: torch.dtype) -> AttentionBackend:
    """The plan's kernels over a decoder cache (model.cache.DecoderCache): the kernels read its
    layout and device from layer 0 (every layer is alike)."""
    if cache.cross_hnd != plan.cross_hnd:
        raise ValueError("the cache's cross layout does not match the cross-attention kernel")
    if (plan.self_kernel, plan.cross_kernel) == ("sdpa", "sdpa"):
        return SdpaBackend(cross_hnd=plan.cross_hnd)
    self_cache, cross_cache = cache.self_k[0], cache.cross_k[0]
    workspace = None
    if "flashinfer" in (SELF_KERNELS[plan.self_kernel].package, CROSS_KERNELS[plan.cross_kernel].package):
        from batchscribe.attention.flashinfer import FlashInferWorkspace

        workspace = FlashInferWorkspace(self_cache.device)
    return AttentionBackend(_self_kernel(plan, self_cache, q_dtype, workspace),
                            _cross_kernel(plan, cross_cache, q_dtype, workspace, self_cache.shape[-1]))  # fmt: skip


def _self_kernel(plan: AttentionPlan, cache: torch.Tensor, q_dtype: torch.dtype, workspace) -> SelfKernel:
    if plan.self_kernel == "triton":
        from batchscribe.attention.triton import TritonSelf

        return TritonSelf(cache, q_dtype)
    if plan.self_kernel == "flashinfer":
        from batchscribe.attention.flashinfer import FlashInferSelf

        return FlashInferSelf(workspace, cache, q_dtype)
    return SdpaSelf()


def _cross_kernel(plan: AttentionPlan, cache: torch.Tensor, q_dtype: torch.dtype, workspace,
                  head_dim: int) -> CrossKernel:  # fmt: skip
    if plan.cross_kernel == "triton_hnd":
        from batchscribe.attention.triton import TritonCross

        return TritonCross(cache, q_dtype, head_dim)
    if plan.cross_kernel in ("flashinfer", "flashinfer_hnd"):
        from batchscribe.attention.flashinfer import FlashInferCross

        return FlashInferCross(workspace, cache, q_dtype, hnd=plan.cross_hnd)
    return SdpaCross(hnd=plan.cross_hnd)
