"""The attention registry (attention/registry): how names resolve to an AttentionPlan, and the
backend built from a plan."""

from __future__ import annotations

import pytest
import torch

from batchscribe.attention.registry import AttentionPlan, build_backend, resolve_attention
from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.model.cache import DecoderCache
from tests.attention.helpers import tiny_dims

FP8 = torch.float8_e4m3fn


def test_attention_kinds_resolve() -> None:
    cpu = torch.device("cpu")
    assert resolve_attention("auto", "auto", cpu, torch.float32) == AttentionPlan("sdpa", "sdpa", None)
    assert resolve_attention("sdpa", "fp8", cpu, torch.float32).cross_dtype == FP8
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        resolve_attention("flashinfer", "auto", cpu, torch.float32)
    with pytest.raises(ValueError, match="unknown"):
        AttentionPlan("cudnn", "sdpa")
    with pytest.raises(ValueError, match="unknown"):
        AttentionPlan("sdpa", "triton")  # the cross kernel reads a heads-first cache: triton_hnd
    assert AttentionPlan("triton", "triton_hnd", FP8).self_kernel == "triton"
    with pytest.raises(ValueError, match="SELF/CROSS"):
        resolve_attention("flashinfer/cudnn", "auto", cpu, torch.float16)
    assert resolve_attention("sdpa", "auto", cpu, torch.float16) == AttentionPlan()
    with pytest.raises(ValueError, match="needs FlashInfer on a CUDA device, but the device is cpu"):
        resolve_attention("flashinfer/sdpa", "fp8", cpu, torch.bfloat16)
    # The Triton kernels need CUDA, not FlashInfer.
    with pytest.raises(ValueError, match=r"needs a CUDA device \(Triton kernels\), but the device is cpu"):
        resolve_attention("triton/triton_hnd", "auto", cpu, torch.float16)
    assert AttentionPlan("flashinfer", "flashinfer_hnd", FP8).cross_hnd
    assert not AttentionPlan("flashinfer", "flashinfer", FP8).cross_hnd
    assert isinstance(build_backend(AttentionPlan(), DecoderCache.allocate(tiny_dims(), 1, "cpu", torch.float32),
                                    torch.float32), SdpaBackend)  # fmt: skip
