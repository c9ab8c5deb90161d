"""openai-whisper find_alignment's attention matrix for a batch of windows at once: softmax over each
window's real frames, standardised over its tokens, median-filtered along time (width 7, mirrored at
the window's own last frame), averaged over the alignment heads.

The median is a selection network of 13 compare-exchanges (min and max only, so exactly the middle
value a sort gives). Elsewhere than CUDA every step is torch, the median that network over 7 shifted
views. On CUDA three Triton kernels do it: each row's softmax over its window's frames; per head
and block of columns, the mean and deviation over the window's rows and the standardised values;
per row and block of columns, the median of every head (7 taps each) and their mean: three passes
over the [B, heads, L, 1500] float32 scores where torch's ops took a dozen (docs/GPU_NOTES.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchscribe.engine.dtw_device import on_device

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the torch network runs instead
    triton = None

MEDIAN_WIDTH = 7  # openai find_alignment's medfilt_width
# The median of 7: after these compare-exchanges (low index gets the minimum) position 3 holds it.
MEDIAN7 = ((0, 5), (0, 3), (1, 6), (2, 4), (0, 1), (3, 5), (2, 6), (2, 3), (3, 6), (4, 5), (1, 4), (1, 3), (3, 4))


def batch_matrix(qk: torch.Tensor, rows: Sequence[int] | torch.Tensor, frames: Sequence[int] | torch.Tensor,
                 size: tuple[int, int] | None = None, budget: int = 1 << 28) -> torch.Tensor:  # fmt: skip
    """openai find_alignment's matrix for many windows in one set of operations: for window b,
    softmax over its frames of qk[b, :, :rows[b], :frames[b]], standardised over its rows, median-
    filtered along time (mirrored at its own last frame), averaged over the heads.

    qk: [B' >= B, heads, L, A] float32 -> [B, r, f] with (r, f) = `size` (default: the largest
    rows and frames), each window's values in its own (rows[b], frames[b]) corner. `rows` and
    `frames` may be device tensors (then `size` is needed): no host transfer, so a CUDA graph can
    hold the whole function. Every reduction runs over the whole L or A with the window's own mask,
    so at a fixed shape a window's values do not depend on the others'. The torch median runs
    `budget` bytes of windows at a time."""
    n, dev = len(rows), qk.device
    counts = torch.as_tensor(rows, device=dev)
    ends = torch.as_tensor(frames, device=dev)
    r, f = size if size is not None else (max(rows), max(frames))
    if on_device(dev):  # where the DTW kernel runs, these do
        return matrix_kernels(qk[:n], counts, ends, r, f)
    return matrix_torch(qk[:n], counts, ends, r, f, budget)


def matrix_torch(qk: torch.Tensor, counts: torch.Tensor, ends: torch.Tensor, r: int, f: int,
                 budget: int = 1 << 28) -> torch.Tensor:  # fmt: skip
    """batch_matrix in torch ops: qk [B, heads, L, A] float32, counts and ends [B] -> [B, r, f]."""
    n, (heads, length, audio), dev = qk.shape[0], qk.shape[1:], qk.device
    cols = torch.arange(audio, device=dev)[None, :] < ends[:, None]  # [B, A]
    # In place where the values allow it: at the fixed shape each [B, H, L, A] copy is large.
    x = qk.masked_fill(~cols[:, None, None, :], float("-inf")).softmax(dim=-1)  # [B, H, L, A]
    live = (torch.arange(length, device=dev)[None, :] < counts[:, None]).to(x.dtype)[:, None, :, None]
    denominator = counts.to(x.dtype)[:, None, None, None]
    mean = (x * live).sum(dim=-2, keepdim=True) / denominator
    std = (x - mean).mul_(live).pow_(2).sum(dim=-2, keepdim=True).div_(denominator).sqrt_()
    x = x.sub_(mean).div_(std)[:, :, :r, :f]
    step = max(1, budget // (heads * r * f * MEDIAN_WIDTH * 4))
    out = torch.empty(n, r, f, dtype=x.dtype, device=dev)
    for a in range(0, n, step):
        out[a : a + step] = median_torch(x[a : a + step], ends[a : a + step]).mean(dim=1)
    return out


def mirrored(t: torch.Tensor, ends: torch.Tensor, f: int) -> torch.Tensor:
    """Where tap position t (may be < 0 or >= end) reads for a window ending at `ends`: t, -t before
    the start, 2 (end - 1) - t after the end (scipy's and openai's 'reflect'), inside [0, f)."""
    return torch.where(t < 0, -t, torch.where(t >= ends, 2 * (ends - 1) - t, t)).clamp(0, f - 1)


def median_torch(x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """x [B, H, r, f] -> its width-7 median along f, window b mirrored at ends[b]; a window of at
    most 3 frames (too short to mirror, as openai leaves it) unchanged."""
    half, f = MEDIAN_WIDTH // 2, x.shape[-1]
    t = torch.arange(f + 2 * half, device=x.device)[None, :] - half
    index = mirrored(t, ends[:, None], f)  # [B, f + 6]
    padded = x.gather(-1, index[:, None, None, :].expand(*x.shape[:3], index.shape[-1]))
    p = [padded[..., k : k + f] for k in range(MEDIAN_WIDTH)]
    for a, b in MEDIAN7:
        p[a], p[b] = torch.minimum(p[a], p[b]), torch.maximum(p[a], p[b])
    return torch.where((ends <= half)[:, None, None, None], x, p[3])


def matrix_kernels(qk: torch.Tensor, counts: torch.Tensor, ends: torch.Tensor, r: int, f: int) -> torch.Tensor:
    """batch_matrix by three Triton kernels: qk [B, heads, L, A] float32, counts and ends [B] on its
    device -> [B, r, f]. Only queues work (graph-capturable)."""
    qk, counts, ends = qk.contiguous(), counts.contiguous(), ends.contiguous()
    batch, heads, length, audio = qk.shape
    probs = torch.empty_like(qk)
    _softmax_rows[(batch * heads * length,)](qk, probs, ends, heads * length, audio,
                                             BLOCK=triton.next_power_of_2(audio), num_warps=8)  # fmt: skip
    columns = 64
    _standardise[(batch * heads, triton.cdiv(f, columns))](probs, counts, heads, length, audio, r, f,
                                                            COLUMNS=columns, num_warps=2)  # fmt: skip
    out = torch.empty(batch, r, f, dtype=qk.dtype, device=qk.device)
    block = 512
    _median7_mean[(batch * r, triton.cdiv(f, block))](probs, out, ends, heads, length, audio, r, f,
                                                      BLOCK=block, num_warps=4)  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _tap(row, t, k, end, F):
        at = t + k - 3
        at = tl.where(at < 0, -at, tl.where(at >= end, 2 * (end - 1) - at, at))
        return tl.load(row + tl.minimum(tl.maximum(at, 0), F - 1), mask=t < F, other=0.0)

    @triton.jit
    def _swap(a, b):
        return tl.minimum(a, b), tl.maximum(a, b)

    # The sizes change with the batch's shape: left unspecialised, one compilation each.
    @triton.jit(do_not_specialize=["ROWS_PER_WINDOW", "A"])
    def _softmax_rows(X, Out, Ends, ROWS_PER_WINDOW, A, BLOCK: tl.constexpr):
        """One row of one head: softmax over the window's frames [0, end); 0 beyond them."""
        row = tl.program_id(0).to(tl.int64)
        end = tl.load(Ends + row // ROWS_PER_WINDOW).to(tl.int32)
        cols = tl.arange(0, BLOCK)
        x = tl.load(X + row * A + cols, mask=cols < end, other=float("-inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(Out + row * A + cols, e / tl.sum(e, axis=0), mask=cols < A)

    @triton.jit(do_not_specialize=["HEADS", "L", "A", "R", "F"])
    def _standardise(P, Counts, HEADS, L, A, R, F, COLUMNS: tl.constexpr):
        """One head of one window, COLUMNS columns: mean and deviation over the window's rows
        [0, count) (population, as openai's std_mean(unbiased=False)), then rows [0, R) standardised
        in place."""
        pair = tl.program_id(0).to(tl.int64)  # window * HEADS + head
        count = tl.load(Counts + pair // HEADS).to(tl.int32)
        cols = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
        live = cols < F
        src = P + pair * L * A + cols
        total = tl.zeros([COLUMNS], tl.float32)
        for t in range(0, count):
            total += tl.load(src + t * A, mask=live, other=0.0)
        mean = total / count
        spread = tl.zeros([COLUMNS], tl.float32)
        for t in range(0, count):
            d = tl.load(src + t * A, mask=live, other=0.0) - mean
            spread += d * d
        std = tl.sqrt(spread / count)
        for t in range(0, R):
            x = tl.load(src + t * A, mask=live, other=0.0)
            tl.store(src + t * A, (x - mean) / std, mask=live)

    @triton.jit
    def _median_row(row, t, end, F):
        """Row `row`'s width-7 median at columns t, mirrored at `end` (unchanged where end <= 3)."""
        p0, p1, p2 = _tap(row, t, 0, end, F), _tap(row, t, 1, end, F), _tap(row, t, 2, end, F)
        p3, p4, p5, p6 = _tap(row, t, 3, end, F), _tap(row, t, 4, end, F), _tap(row, t, 5, end, F), _tap(row, t, 6, end, F)
        # MEDIAN7, in order.
        p0, p5 = _swap(p0, p5)
        p0, p3 = _swap(p0, p3)
        p1, p6 = _swap(p1, p6)
        p2, p4 = _swap(p2, p4)
        p0, p1 = _swap(p0, p1)
        p3, p5 = _swap(p3, p5)
        p2, p6 = _swap(p2, p6)
        p2, p3 = _swap(p2, p3)
        p3, p6 = _swap(p3, p6)
        p4, p5 = _swap(p4, p5)
        p1, p4 = _swap(p1, p4)
        p1, p3 = _swap(p1, p3)
        p3, p4 = _swap(p3, p4)
        here = tl.load(row + t, mask=t < F, other=0.0)
        return tl.where(end <= 3, here, p3)

    @triton.jit(do_not_specialize=["HEADS", "L", "A", "R", "F"])
    def _median7_mean(P, Out, Ends, HEADS, L, A, R, F, BLOCK: tl.constexpr):
        """One row t < R of one window, BLOCK columns: each head's median, then their mean."""
        at = tl.program_id(0).to(tl.int64)  # window * R + t
        window, t = at // R, at % R
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        end = tl.load(Ends + window).to(tl.int32)
        total = tl.zeros([BLOCK], tl.float32)
        for h in range(0, HEADS):
            total += _median_row(P + ((window * HEADS + h) * L + t) * A, cols, end, F)
        tl.store(Out + at * F + cols, total / HEADS, mask=cols < F)
