"""The DTW fill of a batch of alignment windows, where their cost matrices already are.

`batchscribe.dtw` fills a batch one anti-diagonal at a time on the host: ~N + M numpy steps per
look, a few milliseconds per window. On CUDA the same fill is one Triton kernel: one program per
window, one lane per matrix row, the anti-diagonals in a loop inside the kernel (its cells do not
depend on each other). The last two diagonals' totals stay in registers, each lane reading the
row above's by a lane shift (`tl.gather`), so a diagonal waits on no memory round trip (with the
totals in global memory it waited on one and a barrier per diagonal: docs/GPU_NOTES.md).
The totals are float32 and each cell's sum is formed in float64 and rounded once, as openai's
`dtw_cpu` forms it, so paths and ties are the host's, bit for bit. The same program then walks its
window's path back from the last cell (one scalar step at a time, every window at once), and only
the paths come back to the host.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from batchscribe import dtw

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the host fill runs instead
    triton = None


def skew(cost: torch.Tensor, shapes: torch.Tensor | list[tuple[int, int]]) -> torch.Tensor:
    """cost [B, N, M] (padding anywhere) -> float64 [B, N + M + 1, N + 1] with out[b, i + j + 2,
    i + 1] = cost[b, i, j] inside each window's own (n_b, m_b), +inf elsewhere. `shapes`: [B, 2]
    (a device tensor keeps it free of host transfers, so it can be captured in a graph)."""
    batch, n, m = cost.shape
    rows = torch.arange(n, device=cost.device)[:, None].expand(n, m)
    cols = torch.arange(m, device=cost.device)[None, :].expand(n, m)
    limits = torch.as_tensor(shapes, device=cost.device)  # [B, 2]
    inside = (rows[None] < limits[:, 0, None, None]) & (cols[None] < limits[:, 1, None, None])
    out = torch.full((batch, n + m + 1, n + 1), float("inf"), dtype=torch.float64, device=cost.device)
    out[:, rows + cols + 2, rows + 1] = torch.where(inside, cost.double(), float("inf"))
    return out


if triton is not None:

    # The sizes change with every batch: left unspecialised, one compilation per lane count.
    @triton.jit(do_not_specialize=["DIAGONALS", "WIDTH", "STEPS"])
    def _dtw(Cost, Trace, Shapes, PathRow, PathCol, Steps, DIAGONALS, WIDTH, STEPS, BLOCK: tl.constexpr):
        window = tl.program_id(0).to(tl.int64)
        at = tl.arange(0, BLOCK)
        lane = at + 1  # matrix row i = lane (row 0 is the boundary)
        real = lane < WIDTH
        above = tl.maximum(at - 1, 0)  # where lane - 1 is held (lane 1's row above is the boundary)
        base = window * DIAGONALS * WIDTH
        n = tl.load(Shapes + 2 * window)
        m = tl.load(Shapes + 2 * window + 1)
        # Totals of diagonals d - 2 and d - 1 at lanes 1..BLOCK: +inf on diagonals 0 and 1, and past
        # WIDTH. The boundary row 0 holds 0 on diagonal 0 only.
        before = tl.full([BLOCK], float("inf"), tl.float32)
        last = tl.full([BLOCK], float("inf"), tl.float32)
        # Only the window's own diagonals: its last cell (n - 1, m - 1) is on diagonal n + m, and a
        # batch padded to a fixed size would otherwise walk every window through the largest's.
        for d in range(2, n + m + 1):
            diag = tl.where(at == 0, tl.where(d == 2, 0.0, float("inf")), tl.gather(before, above, 0))
            up = tl.where(at == 0, float("inf"), tl.gather(last, above, 0))
            left = last
            take_diag = (diag < up) & (diag < left)
            take_up = (up < diag) & (up < left) & (take_diag == 0)
            best = tl.where(take_diag, diag, tl.where(take_up, up, left))
            here = base + d * WIDTH + lane
            x = tl.load(Cost + here, mask=real, other=float("inf"))
            before = last
            last = tl.where(real, (x + best.to(tl.float64)).to(tl.float32), float("inf"))
            tl.store(Trace + here, tl.where(take_diag, 0, tl.where(take_up, 1, 2)).to(tl.int8), mask=real)
        tl.debug_barrier()  # the walk's scalar loads read other lanes' trace stores
        # The walk back from the window's last cell (`dtw.backtrace`), last step first; row 0 and
        # column 0 of the full matrix lead left and up.
        i = n.to(tl.int64)
        j = m.to(tl.int64)
        k = tl.program_id(0) * 0  # a tensor from the start: older Tritons refuse to reassign a constant in a loop
        while (i > 0) | (j > 0):
            tl.store(PathRow + window * STEPS + k, (i - 1).to(tl.int32))
            tl.store(PathCol + window * STEPS + k, (j - 1).to(tl.int32))
            move = tl.load(Trace + base + (i + j) * WIDTH + i, mask=(i > 0) & (j > 0), other=0).to(tl.int32)
            move = tl.where(i == 0, 2, tl.where(j == 0, 1, move))
            i -= (move != 2).to(tl.int64)  # diagonal or up
            j -= (move != 1).to(tl.int64)  # diagonal or left
            k += 1
        tl.store(Steps + window, k)


def paths(cost: torch.Tensor, shapes: list[tuple[int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each window's least-cost path through cost[b, :n_b, :m_b] (openai's dtw_cpu rule): the fill
    and the walk back on the device (Triton), or on the host (`batchscribe.dtw`)."""
    if not shapes:
        return []
    skewed = skew(cost, shapes)
    if not on_device(skewed.device):
        trace = dtw.fill(skewed.cpu().numpy())
        return [dtw.backtrace(trace[b], n, m) for b, (n, m) in enumerate(shapes)]
    both, counts = launch(skewed, torch.tensor(shapes, dtype=torch.int32).to(skewed.device))
    return unpack(both.cpu().numpy(), counts.cpu().numpy())  # one transfer each


def on_device(device: torch.device) -> bool:
    """Whether the kernel runs for tensors on `device` (CUDA, or any under Triton's interpreter)."""
    return triton is not None and (device.type == "cuda" or _interpreted())


def launch(skewed: torch.Tensor, shapes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel over skew's output [B, D, W] for windows of `shapes` [B, 2] int32 (on the same
    device): each path last step first, rows and columns in one tensor [2, B, D - 1] int32 (one
    copy to the host), and its length [B] int32. Only queues work (no host transfer), so a CUDA
    graph can hold it."""
    batch, diagonals, width = skewed.shape
    dev = skewed.device
    shapes = shapes.contiguous()  # read by flat index (a column of a wider table would not be)
    trace = torch.full((batch, diagonals, width), -1, dtype=torch.int8, device=dev)
    steps = diagonals - 1  # a path has at most N + M steps
    both = torch.empty(2, batch, steps, dtype=torch.int32, device=dev)  # rows, cols: each a contiguous [B, steps]
    counts = torch.empty(batch, dtype=torch.int32, device=dev)
    block = lanes(width - 1)
    _dtw[(batch,)](skewed, trace, shapes, both[0], both[1], counts, diagonals, width, steps,
                   BLOCK=block, num_warps=max(1, min(8, block // 32)))  # fmt: skip
    return both, counts


def unpack(both: np.ndarray, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """launch's outputs on the host ([2, B, steps], [B]) -> each window's (rows, cols), first step first."""
    return [(both[0, b, :c][::-1].astype(np.int64), both[1, b, :c][::-1].astype(np.int64))
            for b, c in enumerate(counts.tolist())]  # fmt: skip


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
    return os.environ.get("TRITON_INTERPRET") == "1"
