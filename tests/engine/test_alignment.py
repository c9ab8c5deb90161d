"""The alignment matrix of a batch of windows (engine/alignment.py `batch_matrix`) against
openai-whisper's find_alignment steps run on each window alone (softmax over its frames, standardised
over its tokens, timing.median_filter, mean over heads), and a window's values the same alone and
beside others (what makes a GPU run's words independent of which windows finish together)."""

from __future__ import annotations

import pytest
import torch

from batchscribe.engine.alignment import MEDIAN_WIDTH, batch_matrix

timing = pytest.importorskip("whisper.timing")
ROWS = [5, 3, 12, 30, 7, 4]  # a window has at least <|notimestamps|>, one token and <|endoftext|>
FRAMES = [40, 3, 200, 750, 1, 4]  # 3 and 1: too short to mirror; 750: every frame


def _openai(qk: torch.Tensor, rows: int, frames: int) -> torch.Tensor:
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
