"""The DTW fill of a batch of alignment windows, where their cost matrices already are.

`batchscribe.dtw` fills a batch one anti-diagonal at a time on the host: ~N + M numpy steps per
look, a few milliseconds per window. On CUDA the same fill is one Triton kernel: one program per
window, one lane per matrix row, the anti-diagonals in a loop inside the kernel (its cells do not
depend on each other; a barrier orders one diagonal's stores before the next one's loads). The
totals are float32 and each cell's sum is formed in float64 and rounded once, as openai's
`dtw_cpu` forms it, so paths and ties are the host's, bit for bit. Only the int8 trace goes back
to the host, which walks each window's path (`batchscribe.dtw.backtrace`).
"""

from __future__ import annotations

import numpy as np
import torch

from batchscribe import dtw

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the host fill runs instead
    triton = None


def skew(cost: torch.Tensor, shapes: list[tuple[int, int]]) -> torch.Tensor:
    """cost [B, N, M] (padding anywhere) -> float64 [B, N + M + 1, N + 1] with out[b, i + j + 2,
    i + 1] = cost[b, i, j] inside each window's own (n_b, m_b), +inf elsewhere (`dtw.skew`)."""
    batch, n, m = cost.shape
    rows = torch.arange(n, device=cost.device)[:, None].expand(n, m)
    cols = torch.arange(m, device=cost.device)[None, :].expand(n, m)
    limits = torch.tensor(shapes, device=cost.device)  # [B, 2]
    inside = (rows[None] < limits[:, 0, None, None]) & (cols[None] < limits[:, 1, None, None])
    out = torch.full((batch, n + m + 1, n + 1), float("inf"), dtype=torch.float64, device=cost.device)
    out[:, rows + cols + 2, rows + 1] = torch.where(inside, cost.double(), float("inf"))
    return out


if triton is not None:

    # The sizes change with every batch: left unspecialised, one compilation per lane count.
    @triton.jit(do_not_specialize=["DIAGONALS", "WIDTH"])
    def _fill(Cost, Total, Trace, DIAGONALS, WIDTH, BLOCK: tl.constexpr):
        window = tl.program_id(0).to(tl.int64)
        lane = tl.arange(0, BLOCK) + 1  # matrix row i = lane (row 0 is the boundary)
        real = lane < WIDTH
        base = window * DIAGONALS * WIDTH
        for d in range(2, DIAGONALS):
            prev, prev2 = base + (d - 1) * WIDTH, base + (d - 2) * WIDTH
            diag = tl.load(Total + prev2 + lane - 1, mask=real, other=float("inf"))
            up = tl.load(Total + prev + lane - 1, mask=real, other=float("inf"))
            left = tl.load(Total + prev + lane, mask=real, other=float("inf"))
            take_diag = (diag < up) & (diag < left)
            take_up = (up < diag) & (up < left) & (take_diag == 0)
            best = tl.where(take_diag, diag, tl.where(take_up, up, left))
            here = base + d * WIDTH + lane
            x = tl.load(Cost + here, mask=real, other=float("inf"))
            tl.store(Total + here, (x + best.to(tl.float64)).to(tl.float32), mask=real)
            tl.store(Trace + here, tl.where(take_diag, 0, tl.where(take_up, 1, 2)).to(tl.int8), mask=real)
            tl.debug_barrier()


def fill(skewed: torch.Tensor) -> np.ndarray:
    """The skewed trace of each window (`dtw.fill`), int8 [B, N + M + 1, N + 1] on the host."""
    if triton is None or skewed.device.type != "cuda" and not _interpreted():
        return dtw.fill(skewed.cpu().numpy())
    batch, diagonals, width = skewed.shape
    total = torch.full((batch, diagonals, width), float("inf"), dtype=torch.float32, device=skewed.device)
    total[:, 0, 0] = 0.0
    trace = torch.full((batch, diagonals, width), -1, dtype=torch.int8, device=skewed.device)
    block = lanes(width - 1)
    _fill[(batch,)](skewed.contiguous(), total, trace, diagonals, width, BLOCK=block, num_warps=max(1, min(8, block // 32)))
    return trace.cpu().numpy()


def lanes(rows: int) -> int:
    """The kernel's lane count for `rows` matrix rows: two sizes cover Whisper's windows (a short
    window's text, or up to its whole 448-token context), so at most two compilations."""
    return SHORT if rows <= SHORT else max(LONG, triton.next_power_of_2(rows))


SHORT, LONG = 64, 512


def warm_up(device: torch.device) -> None:
    """Compile the kernel for both lane counts now (start-up), not at a run's first long window."""
    for rows in (SHORT, LONG):
        paths(torch.zeros(1, rows, 2, dtype=torch.float64, device=device), [(rows, 2)])


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def paths(cost: torch.Tensor, shapes: list[tuple[int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each window's least-cost path through cost[b, :n_b, :m_b] (openai's dtw_cpu rule)."""
    if not shapes:
        return []
    trace = fill(skew(cost, shapes))
    return [dtw.backtrace(trace[b], n, m) for b, (n, m) in enumerate(shapes)]
