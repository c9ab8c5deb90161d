"""The host DTW (batchscribe/dtw.py: `fill` and `backtrace`, reached through engine/dtw_device.paths
on CPU tensors) against openai-whisper's `dtw_cpu`, window by window, for a padded batch of windows
of different shapes (padding must never reach a window's own path), ties included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchscribe.engine import dtw_device

SHAPES = [(1, 1), (3, 7), (12, 40), (40, 12), (25, 300), (2, 1), (1, 5), (70, 200)]


def padded(seed: int, quantise: bool) -> tuple[list[np.ndarray], torch.Tensor]:
    """Random costs (rounded ones make ties, which must break as openai's do), and the same padded
    into one batch with a value a path must never take."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=s) for s in SHAPES]
    xs = [np.round(x) for x in xs] if quantise else xs
    batch = torch.full((len(xs), max(s[0] for s in SHAPES), max(s[1] for s in SHAPES)), 5.0, dtype=torch.float64)
    for b, x in enumerate(xs):
        batch[b, : x.shape[0], : x.shape[1]] = torch.from_numpy(x)
    return xs, batch


@pytest.mark.parametrize("quantise", [False, True])
def test_a_padded_batch_equals_openai_window_by_window(quantise: bool) -> None:
    timing = pytest.importorskip("whisper.timing")  # inside: the GPU tests import this module's batch
    xs, batch = padded(2, quantise)
    for x, (rows, cols) in zip(xs, dtw_device.paths(batch, SHAPES)):
        np.testing.assert_array_equal(np.stack([rows, cols]), timing.dtw_cpu(x))
    assert dtw_device.paths(batch[:0], []) == []
