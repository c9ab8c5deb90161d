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


MATRIX_INTERPRETED = """
import torch
from batchscribe.engine.align_matrix import matrix_kernels, matrix_torch
ROWS, FRAMES = %r, %r
gen = torch.Generator().manual_seed(2)
qk = torch.randn(len(ROWS) + 2, 3, 16, 300, generator=gen) * 3  # 2 padding windows, a fixed size
# The lengths as columns of one table, as the alignment pass packs them (strided views).
table = torch.tensor([[0, r, f] for r, f in zip(ROWS, FRAMES)] + [[0, 3, 1]] * 2)
got = matrix_kernels(qk, table[:, 1], table[:, 2], 16, 300)
want = matrix_torch(qk, table[:, 1].contiguous(), table[:, 2].contiguous(), 16, 300)
assert got.shape == want.shape == (len(ROWS) + 2, 16, 300)
for b, (n, f) in enumerate(zip(ROWS, FRAMES)):
    torch.testing.assert_close(got[b, :n, :f], want[b, :n, :f], rtol=1e-5, atol=1e-5, equal_nan=True)
    alone = matrix_kernels(qk[b : b + 1], table[b : b + 1, 1], table[b : b + 1, 2], 16, 300)
    assert torch.equal(alone[0, :n, :f].nan_to_num(), got[b, :n, :f].nan_to_num()), b
print("ok")
""" % ([min(r, 16) for r in ROWS], [min(f, 300) for f in FRAMES])  # 16 rows, 300 frames: the interpreter is slow


def test_the_kernels_in_the_interpreter_equal_the_torch_ops(triton_interpreter) -> None:
    """CUDA's three kernels (softmax, standardising, median and head mean; run by Triton's
    interpreter) against the torch ops the CPU runs (checked against openai's steps above), and a
    window's values the same alone and in a batch."""
    pytest.importorskip("triton")
    assert triton_interpreter(MATRIX_INTERPRETED) == ["ok"]


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


def test_the_kernels_compile_for_hopper() -> None:
    """What the interpreter cannot check: the kernels' types, compiled by Triton's own compiler."""
    pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    from batchscribe.engine import align_matrix

    target = pytest.importorskip("triton.backends.compiler").GPUTarget("cuda", 90, 32)
    sizes = {"HEADS": "i32", "L": "i32", "A": "i32", "R": "i32", "F": "i32"}
    kernels = [
        (align_matrix._softmax_rows, {"X": "*fp32", "Out": "*fp32", "Ends": "*i64", "ROWS_PER_WINDOW": "i32",
                                      "A": "i32", "BLOCK": "constexpr"}, {"BLOCK": 2048}),
        (align_matrix._standardise, {"P": "*fp32", "Counts": "*i64", **sizes, "COLUMNS": "constexpr"}, {"COLUMNS": 64}),
        (align_matrix._median7_mean, {"P": "*fp32", "Out": "*fp32", "Ends": "*i64", **sizes, "BLOCK": "constexpr"},
         {"BLOCK": 512}),
    ]  # fmt: skip
    for fn, signature, constexprs in kernels:
        source = compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        assert compiler.compile(source, target=target).asm["cubin"], fn
