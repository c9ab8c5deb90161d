"""The encoder's FA3 attention (attention/flashinfer_prefill): refused off Hopper before flashinfer
is imported, and (on a Hopper GPU) equal to SDPA over each window, eagerly and in a CUDA graph."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention, fa3_supported
from tests.marks import needs_cuda, needs_flashinfer


def test_fa3_encoder_attention_refuses_the_cpu() -> None:
    # The device check comes before flashinfer is imported: this runs (and can fail) without it.
    assert not fa3_supported(torch.device("cpu"))
    message = ("FlashInfer's FA3 prefill runs on Hopper GPUs (compute capability 9.x), not cpu; "
               "use the sdpa encoder kernel")  # fmt: skip
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FlashInferEncoderAttention(torch.device("cpu"), torch.float16, 6, 64, 1500)


def _reference(qkv: torch.Tensor, windows: int, n_head: int) -> torch.Tensor:
    """Each window's unmasked attention in float32 (SDPA's math), [M, d]."""
    m, three_d = qkv.shape
    heads = qkv.float().view(windows, m // windows, 3, n_head, three_d // (3 * n_head))
    q, k, v = (heads[:, :, i].transpose(1, 2) for i in range(3))  # [W, H, T, D]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(m, three_d // 3)


@pytest.mark.gpu
@needs_cuda
@needs_flashinfer
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head", [6, 20])
def test_fa3_encoder_attention_equals_sdpa_eagerly_and_in_a_graph(dtype, n_head) -> None:
    cuda = torch.device("cuda")
    if not fa3_supported(cuda):
        pytest.skip("FA3 runs on Hopper GPUs")
    frames, head_dim = 1500, 64
    attention = FlashInferEncoderAttention(cuda, dtype, n_head, head_dim, frames)
    torch.manual_seed(n_head)
    for windows in (1, 3, 16):
        d = n_head * head_dim
        # q, k and v of one QKV GEMM output, scaled like real activations (softmax not flat)
        qkv = (torch.randn(windows * frames, 3 * d, device=cuda) * 2).to(dtype)
        ref = _reference(qkv, windows, n_head)
        eager = attention(qkv, windows)
        assert eager.shape == (windows * frames, d) and eager.dtype == dtype
        tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
        assert float((eager.float() - ref).norm() / ref.norm()) < tol

        static_in = qkv.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = attention(static_in, windows)
        fresh = (torch.randn_like(qkv, dtype=torch.float32) * 2).to(dtype)  # new inputs: the replay reads them
        static_in.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, attention(fresh, windows))  # replay equals eager, bit for bit


@pytest.mark.gpu
@needs_cuda
@needs_flashinfer
def test_an_unplanned_chunk_size_is_refused_inside_a_capture() -> None:
    cuda = torch.device("cuda")
    if not fa3_supported(cuda):
        pytest.skip("FA3 runs on Hopper GPUs")
    attention = FlashInferEncoderAttention(cuda, torch.float16, 6, 64, 1500)
    qkv = torch.randn(2 * 1500, 3 * 384, device=cuda, dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="chunks of 2 windows were not planned before the capture"):
        with torch.cuda.graph(graph):
            attention(qkv, 2)
