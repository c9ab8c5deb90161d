"""The fused encoder (model/fused_encoder.py) against the eager module it rearranges: real tiny.en
weights on real speech, in float32 on the CPU and half precision on the GPU; and its fp8 form,
emulated on the CPU and with fp8 GEMMs on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchscribe.audio.features import LogMel, pad_or_trim
from batchscribe.model.fused_encoder import FusedEncoder
from tests.marks import needs_cuda, needs_flashinfer


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module")
def tiny_encoder(tiny_en_dir):
    from batchscribe.api import Transcriber

    return Transcriber(str(tiny_en_dir), device="cpu").model.encoder


@pytest.fixture(scope="module")
def mel(utterances) -> torch.Tensor:
    audio = torch.from_numpy(np.stack([pad_or_trim(a) for _, a in utterances[:4]]))
    return LogMel(80)(audio)  # [4, 80, 3000]


def test_fused_encoder_equals_the_module_in_float32(tiny_encoder, mel) -> None:
    with torch.no_grad():
        ref = tiny_encoder(mel)
    out = FusedEncoder(tiny_encoder)(mel)
    assert out.shape == ref.shape == (4, 1500, 384)
    assert _rel(out, ref) < 1e-4
    assert torch.equal(tiny_encoder(mel), ref)  # the module's weights are untouched


def test_fp8_encoder_stays_close_and_layers_can_keep_float(tiny_encoder, mel) -> None:
    with torch.no_grad():
        ref = tiny_encoder(mel)
    errors = {dense: _rel(FusedEncoder(tiny_encoder, fp8=True, dense_layers=dense)(mel), ref)
              for dense in ((), (0,), (0, 1, 2, 3))}  # fmt: skip
    assert 0.005 < errors[()] < 0.12  # fp8's rounding, not a broken layer (that gives ~1)
    assert errors[(0,)] < errors[()]  # the first layer is the most sensitive (docs/GPU_NOTES.md)
    assert errors[(0, 1, 2, 3)] < 1e-4  # all layers dense: the fused float32 encoder


def test_an_attention_kernel_takes_the_qkv_output_in_place_of_sdpa(tiny_encoder, mel) -> None:
    """The contract an encoder attention kernel (attention/flashinfer_prefill.py) fills: qkv
    [windows x frames, 3 d] in, each window's unmasked attention [windows x frames, d] out, once per
    layer. A float64 softmax(q k^T / sqrt(D)) v written here gives the module's output."""
    calls = []

    def attention(qkv: torch.Tensor, windows: int) -> torch.Tensor:
        calls.append((tuple(qkv.shape), windows))
        m, three_d = qkv.shape
        heads = qkv.double().view(windows, m // windows, 3, 6, three_d // 18)  # tiny.en: 6 heads of 64
        q, k, v = (heads[:, :, i].transpose(1, 2) for i in range(3))  # [W, H, T, D]
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return (weights @ v).transpose(1, 2).reshape(m, three_d // 3).to(qkv.dtype)

    with torch.no_grad():
        ref = tiny_encoder(mel)
    out = FusedEncoder(tiny_encoder, attention=attention)(mel)
    assert calls == [((4 * 1500, 3 * 384), 4)] * 4  # one call per layer, with the window count
    assert _rel(out, ref) < 1e-4


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_encoder_on_the_gpu_is_close_to_the_module(tiny_encoder, mel, dtype) -> None:
    """Half precision on the GPU (Triton norms, cuBLASLt's GELU epilogue, fp8 GEMMs): within
    half-precision noise of the float32 module; fp8 within its CPU emulation's error."""
    import copy

    with torch.no_grad():
        ref = tiny_encoder(mel)
    emulated = _rel(FusedEncoder(tiny_encoder, fp8=True)(mel), ref)
    enc = copy.deepcopy(tiny_encoder).to(device="cuda", dtype=dtype)
    x = mel.to(device="cuda", dtype=dtype)
    with torch.no_grad():
        eager = _rel(enc(x).cpu(), ref)
    fused = _rel(FusedEncoder(enc)(x).cpu(), ref)
    fp8 = _rel(FusedEncoder(enc, fp8=True)(x).cpu(), ref)
    assert eager < 2e-2 and fused < max(2e-2, 1.5 * eager), (eager, fused)
    assert 0.5 * emulated < fp8 < 1.5 * emulated + 1e-2, (fp8, emulated)


@pytest.mark.gpu
@needs_cuda
@needs_flashinfer
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fa3_attention_in_the_fused_encoder_is_close_to_the_module(tiny_encoder, mel, dtype) -> None:
    """FlashInfer's FA3 prefill as the fused encoder's attention (the default on Hopper): as close
    to the float32 module as the SDPA-fused encoder, in bf16/fp16 and with fp8 GEMMs."""
    import copy

    from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention, fa3_supported

    if not fa3_supported(torch.device("cuda")):
        pytest.skip("FA3 runs on Hopper GPUs")
    with torch.no_grad():
        ref = tiny_encoder(mel)
    enc = copy.deepcopy(tiny_encoder).to(device="cuda", dtype=dtype)
    x = mel.to(device="cuda", dtype=dtype)
    fa3 = FlashInferEncoderAttention(torch.device("cuda"), dtype, 6, 64, 1500)
    sdpa = _rel(FusedEncoder(enc)(x).cpu(), ref)
    got = _rel(FusedEncoder(enc, attention=fa3)(x).cpu(), ref)
    assert got < max(2e-2, 1.5 * sdpa), (got, sdpa)
    fp8_sdpa = _rel(FusedEncoder(enc, fp8=True)(x).cpu(), ref)
    fp8_fa3 = _rel(FusedEncoder(enc, fp8=True, attention=fa3)(x).cpu(), ref)
    assert fp8_fa3 < 1.2 * fp8_sdpa + 1e-2, (fp8_fa3, fp8_sdpa)
