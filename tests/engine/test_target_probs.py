"""One token's probability per row (engine/target_probs.py) against torch's softmax over the whole
vocabulary: the Triton kernel in the interpreter and on CUDA (in and out of a graph), the torch path."""

from __future__ import annotations

import pytest
import torch

from batchscribe.engine.target_probs import target_probs
from tests.marks import needs_cuda


def _case(rows: int, vocab: int, dtype: torch.dtype, seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(dtype)
    logits[0, 7] = 30.0  # one row nearly certain of its target
    target = torch.randint(0, vocab, (rows,), generator=gen)
    target[0] = 7
    return logits.to(device), target.to(device)


def _softmax(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(dim=-1).gather(1, target[:, None])[:, 0]


def test_the_torch_path_equals_a_float64_softmax() -> None:
    """bfloat16 logits, probabilities formed in float32: within float32's rounding of float64's."""
    logits, target = _case(9, 1000, torch.bfloat16, 0)
    got = target_probs(logits, target)
    assert got.dtype == torch.float32 and got.shape == (9,)
    want = logits.double().log_softmax(dim=-1).gather(1, target[:, None])[:, 0].exp()
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-12)
    assert got[0] > 0.99


KERNEL_INTERPRETED = """
import torch
from batchscribe.engine.target_probs import BLOCK, target_probs
gen = torch.Generator().manual_seed(1)
for vocab in (BLOCK - 3, 2 * BLOCK + 5, 51864):  # a short tail, lanes that see only padding
    logits = (torch.randn(5, vocab, generator=gen) * 4).to(torch.bfloat16)
    logits[1, -1] = 40.0  # the maximum in the last, partly masked block
    target = torch.tensor([0, vocab - 1, 3, vocab // 2, 11])
    got = target_probs(logits, target)
    want = logits.float().softmax(dim=-1).gather(1, target[:, None])[:, 0]
    assert got.dtype == torch.float32 and torch.isfinite(got).all(), got
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)
    assert got[1] > 0.99, got
print("ok")
"""


def test_the_kernel_in_the_interpreter_equals_the_softmax(triton_interpreter) -> None:
    pytest.importorskip("triton")
    assert triton_interpreter(KERNEL_INTERPRETED) == ["ok"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_on_cuda_in_and_out_of_a_graph(dtype: torch.dtype) -> None:
    logits, target = _case(1024, 51864, dtype, 2, "cuda")
    want = _softmax(logits, target)
    torch.testing.assert_close(target_probs(logits, target), want, rtol=2e-6, atol=1e-9)
    target_probs(logits, target)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = target_probs(logits, target)
    fresh, fresh_target = _case(1024, 51864, dtype, 3, "cuda")
    logits.copy_(fresh)
    target.copy_(fresh_target)
    graph.replay()
    torch.testing.assert_close(captured, _softmax(fresh, fresh_target), rtol=2e-6, atol=1e-9)
