"""The alignment matrix of a batch of windows (engine/align_matrix.py `batch_matrix`) against
openai-whisper's find_alignment steps run on each window alone (softmax over its frames, standardised
over its tokens, timing.median_filter, mean over heads), and a window's values the same alone and
beside others (what makes a GPU run's words independent of which windows finish together)."""

from __future__ import annotations

import pytest
import torch

from batchscribe.engine.align_matrix import MEDIAN_WIDTH, batch_matrix
from tests.marks import needs_cuda

ROWS = [5, 3, 12, 30, 7, 4]  # a window has at least <|notimestamps|>, one token and <|endoftext|>
FRAMES = [40, 3, 200, 750, 1, 4]  # 3 and 1: too short to mirror; 750: every frame


def _openai(qk: torch.Tensor, rows: int, frames: int) -> torch.Tensor:
    timing = pytest.importorskip("whisper.timing")
    weights = qk[:, :rows, :frames].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    return timing.median_filter((weights - mean) / std, MEDIAN_WIDTH).mean(dim=0)


def test_each_window_equals_openais_steps() -> None:
    qk = torch.randn(len(ROWS) + 2, 3, 32, 750, generator=torch.Generator().manual_seed(0))  # 2 padding windows
    got = batch_matrix(qk, ROWS, FRAMES)
    assert got.shape == (len(ROWS), max(ROWS), max(FRAMES))
    for b, (rows, frames) in enumerate(zip(ROWS, FRAMES)):
        torch.testing.assert_close(got[b, :rows, :frames], _openai(qk[b], rows, frames), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)  # one frame: openai's std is 0 too


def test_a_window_is_the_same_alone_and_in_a_batch() -> None:
    qk = torch.randn(len(ROWS), 3, 32, 750, generator=torch.Generator().manual_seed(1))
    together = batch_matrix(qk, ROWS, FRAMES, budget=1 << 20)  # the median in several parts
    for b, (rows, frames) in enumerate(zip(ROWS, FRAMES)):
        alone = batch_matrix(qk[b : b + 1], [rows], [frames])
        torch.testing.assert_close(alone[0, :rows, :frames], together[b, :rows, :frames], rtol=0, atol=0,
                                   equal_nan=True)  # fmt: skip


MEDIAN_INTERPRETED = """
import torch
from batchscribe.engine.align_matrix import median_kernel, median_torch
x = torch.randn(6, 3, 5, 40, generator=torch.Generator().manual_seed(2))
ends = torch.tensor([40, 3, 1, 17, 4, 9])
table = torch.stack([torch.zeros(6, dtype=torch.long), ends], dim=1)  # ends as a strided column
got, want = median_kernel(x, table[:, 1]), median_torch(x, ends)
for b, end in enumerate(ends.tolist()):
    assert torch.equal(got[b, ..., :end], want[b, ..., :end]), b
print("ok")
"""


def test_the_median_kernel_in_the_interpreter_equals_the_torch_network(triton_interpreter) -> None:
    """The Triton median (CUDA's) and the torch network (the CPU's, checked against openai's
    median_filter above) give the same values over each window's frames."""
    pytest.importorskip("triton")
    assert triton_interpreter(MEDIAN_INTERPRETED) == ["ok"]


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_the_matrix_equals_the_cpus() -> None:
    """The CUDA path (device-tensor lengths at a fixed size, the Triton median) against the CPU's."""
    qk = torch.randn(len(ROWS) + 2, 3, 32, 750, generator=torch.Generator().manual_seed(3))
    cpu = batch_matrix(qk, ROWS, FRAMES)
    # The lengths as columns of one table, as the alignment pass packs them (strided views).
    table = torch.tensor([[0, r, f] for r, f in zip(ROWS, FRAMES)], device="cuda")
    gpu = batch_matrix(qk.cuda(), table[:, 1], table[:, 2], size=(32, 750)).cpu()
    for b, (n, f) in enumerate(zip(ROWS, FRAMES)):
        torch.testing.assert_close(gpu[b, :n, :f], cpu[b, :n, :f], rtol=1e-4, atol=1e-4, equal_nan=True)


def test_the_median_kernel_compiles_for_hopper() -> None:
    """What the interpreter cannot check: the kernel's types, compiled by Triton's own compiler."""
    pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    from batchscribe.engine import align_matrix

    target = pytest.importorskip("triton.backends.compiler").GPUTarget("cuda", 90, 32)
    signature = {"X": "*fp32", "Out": "*fp32", "Ends": "*i64", "ROWS_PER_WINDOW": "i32", "F": "i32", "BLOCK": "constexpr"}
    source = compiler.ASTSource(fn=align_matrix._median7, signature=signature, constexprs={"BLOCK": 512})
    assert compiler.compile(source, target=target).asm["cubin"]
