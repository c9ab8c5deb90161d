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
    # int4: SDPA dequantises on the CPU; FlashInfer cannot read it
    int4 = resolve_attention("auto", "int4", cpu, torch.float32)
    assert int4 == AttentionPlan("sdpa", "sdpa", torch.uint8) and int4.describe(torch.float32) == "sdpa/sdpa/int4"
    with pytest.raises(ValueError, match="FlashInfer cannot read the 4-bit cross cache"):
        resolve_attention("sdpa/flashinfer_hnd", "int4", torch.device("cuda"), torch.float16)
    assert AttentionPlan("flashinfer", "flashinfer_hnd", FP8).cross_hnd
    assert not AttentionPlan("flashinfer", "flashinfer", FP8).cross_hnd
    assert isinstance(build_backend(AttentionPlan(), DecoderCache.allocate(tiny_dims(), 1, "cpu", torch.float32),
                                    torch.float32), SdpaBackend)  # fmt: skip


def test_the_encoder_kernel_is_a_third_name_and_sdpa_unless_named() -> None:
    cpu = torch.device("cpu")
    # Two names (or one) leave the encoder's attention on SDPA: what they meant before it had a kernel.
    assert resolve_attention("sdpa/sdpa", "auto", cpu, torch.float16).encoder_kernel == "sdpa"
    assert resolve_attention("sdpa/sdpa/sdpa", "auto", cpu, torch.float16) == AttentionPlan()
    with pytest.raises(ValueError, match=r"'SELF/CROSS\[/ENCODER\]' .* ENCODER in \('sdpa', 'fa3'\)"):
        resolve_attention("sdpa/sdpa/cudnn", "auto", cpu, torch.float16)
    with pytest.raises(ValueError, match="SELF/CROSS"):
        resolve_attention("sdpa/sdpa/sdpa/sdpa", "auto", cpu, torch.float16)
    with pytest.raises(ValueError, match="needs FlashInfer on a CUDA device, but the device is cpu"):
        resolve_attention("sdpa/sdpa/fa3", "auto", cpu, torch.float16)
    with pytest.raises(ValueError, match="encoder-attention kernel 'flash' is unknown"):
        AttentionPlan(encoder_kernel="flash")


def test_the_identity_names_the_encoder_kernel_only_when_it_is_not_sdpa() -> None:
    # Run folders written before the encoder kernel existed hold "SELF/CROSS/dtype": an SDPA
    # encoder keeps exactly that string, so they still resume.
    assert AttentionPlan("triton", "flashinfer_hnd").describe(torch.float16) == "triton/flashinfer_hnd/float16"
    fa3 = AttentionPlan("triton", "triton_hnd", FP8, "fa3")
    assert fa3.describe(torch.bfloat16) == "triton/triton_hnd/float8_e4m3fn/encoder-fa3"


def test_auto_takes_fa3_for_the_encoder_only_where_it_runs(monkeypatch) -> None:
    # The choice alone (no GPU here): FA3 where FlashInfer's Hopper kernels run, else SDPA.
    from batchscribe.attention import registry

    cuda = torch.device("cuda")
    monkeypatch.setattr(registry, "package_available", lambda package: True)
    monkeypatch.setattr(registry, "fa3_runs", lambda device: True)
    assert resolve_attention("auto", "auto", cuda, torch.float16).encoder_kernel == "fa3"
    assert resolve_attention("auto", "auto", cuda, torch.float32).encoder_kernel == "sdpa"  # half precision only
    # An encoder that runs eagerly (no Triton) keeps SDPA; a name that asks for FA3 there is refused.
    assert resolve_attention("auto", "auto", cuda, torch.float16, fused_encoder=False).encoder_kernel == "sdpa"
    with pytest.raises(ValueError, match="the fa3 encoder kernel runs in the fused encoder"):
        resolve_attention("sdpa/sdpa/fa3", "auto", cuda, torch.float16, fused_encoder=False)
    assert resolve_attention("sdpa/sdpa/fa3", "auto", cuda, torch.float16).encoder_kernel == "fa3"
    monkeypatch.setattr(registry, "fa3_runs", lambda device: False)
    assert resolve_attention("auto", "auto", cuda, torch.bfloat16).encoder_kernel == "sdpa"
