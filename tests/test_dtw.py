"""DTW (batchscribe/dtw.py) against openai-whisper's `dtw_cpu`: one window, and many windows of
different shapes filled together (padding must never reach a window's own path)."""

from __future__ import annotations

import numpy as np
import pytest

from batchscribe.dtw import dtw, dtw_batch

timing = pytest.importorskip("whisper.timing")
SHAPES = [(1, 1), (3, 7), (12, 40), (40, 12), (25, 300), (2, 1), (1, 5)]


def matrices(seed: int, quantise: bool) -> list[np.ndarray]:
    """Random costs; rounded ones make ties, which must break as openai's do."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=s) for s in SHAPES]
    return [np.round(x) for x in xs] if quantise else xs


@pytest.mark.parametrize("quantise", [False, True])
def test_dtw_equals_openai(quantise: bool) -> None:
    for x in matrices(1, quantise):
        np.testing.assert_array_equal(np.stack(dtw(x)), timing.dtw_cpu(x.astype(np.float64)))


@pytest.mark.parametrize("quantise", [False, True])
def test_a_batch_equals_openai_window_by_window(quantise: bool) -> None:
    xs = matrices(2, quantise)
    for x, (rows, cols) in zip(xs, dtw_batch(xs)):
        np.testing.assert_array_equal(np.stack([rows, cols]), timing.dtw_cpu(x.astype(np.float64)))
    assert dtw_batch([]) == []
