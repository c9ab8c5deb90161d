"""Dynamic time warping for word timestamps on the host: openai-whisper's `dtw_cpu` rule, for many
windows at once.

Each cell of a cost matrix [N, M] takes the cheapest of its diagonal, upper and left neighbours'
totals, preferring the left one on ties (openai's order of comparisons), totals kept in float32 as
openai keeps them, so ties break alike. The path is then traced back from the last cell.

One window's matrix is filled one anti-diagonal at a time (its cells do not depend on each other).
A batch of windows is filled together: the matrices are padded to the largest, the anti-diagonals
laid out as rows ("skewed", `engine/dtw_device.skew`), so each step is a handful of array
operations over every window and every row. A padded cell never feeds a real one (a cell reads only
smaller indices), so each window's path is its own. `engine/dtw_device.py` lays the batch out and
runs the same fill and walk as one kernel on the GPU, or these two on the host.
"""

from __future__ import annotations


import numpy as np

LEFT, UP, DIAG = 2, 1, 0  # the trace's moves, as openai's


def fill(skewed: np.ndarray) -> np.ndarray:
    """The trace of every window, skewed as its costs: int8 [B, N + M + 1, N + 1]."""
    batch, diagonals, width = skewed.shape
    total = np.full((batch, diagonals, width), np.inf, dtype=np.float32)
    total[:, 0, 0] = 0.0
    trace = np.full((batch, diagonals, width), -1, dtype=np.int8)
    for d in range(2, diagonals):
        diag, up, left = total[:, d - 2, :-1], total[:, d - 1, :-1], total[:, d - 1, 1:]
        take_diag = (diag < up) & (diag < left)
        take_up = ~take_diag & (up < diag) & (up < left)
        best = np.where(take_diag, diag, np.where(take_up, up, left))
        total[:, d, 1:] = skewed[:, d, 1:] + best.astype(np.float64)
        trace[:, d, 1:] = np.where(take_diag, DIAG, np.where(take_up, UP, LEFT))
    return trace


def backtrace(trace: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """One window's path from its skewed trace [N' + M' + 1, N' + 1] (N' >= n, M' >= m) -> (row
    indices, column indices), first cell first. Row 0 and column 0 of the full matrix lead left
    and up, as openai's trace."""
    moves = trace.tolist()  # Python lists: the walk is ~N + M scalar reads
    i, j = n, m
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        move = LEFT if i == 0 else UP if j == 0 else moves[i + j][i]
        if move == DIAG:
            i, j = i - 1, j - 1
        elif move == UP:
            i -= 1
        elif move == LEFT:
            j -= 1
        else:
            raise AssertionError(f"DTW trace has no step at ({i}, {j})")
    steps = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return steps[:, 0], steps[:, 1]
