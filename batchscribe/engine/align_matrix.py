"""openai-whisper find_alignment's attention matrix for a batch of windows at once: softmax over each
window's real frames, standardised over its tokens, median-filtered along time (width 7, mirrored at
the window's own last frame), averaged over the alignment heads.

The median is a selection network of 13 compare-exchanges (min and max only, so exactly the middle
value a sort gives). On CUDA it is one Triton kernel over every row (each output reads its 7 taps
once); elsewhere the same network over 7 shifted views in torch.
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
    n, (heads, length, audio) = len(rows), qk.shape[1:]
    dev = qk.device
    counts = torch.as_tensor(rows, device=dev)
    ends = torch.as_tensor(frames, device=dev).contiguous()  # the kernel indexes it as one run
    r, f = size if size is not None else (max(rows), max(frames))
    cols = torch.arange(audio, device=dev)[None, :] < ends[:, None]  # [B, A]
    # In place where the values allow it: at the fixed shape each [B, H, L, A] copy is large.
    x = qk[:n].masked_fill(~cols[:, None, None, :], float("-inf")).softmax(dim=-1)  # [B, H, L, A]
    live = (torch.arange(length, device=dev)[None, :] < counts[:, None]).to(x.dtype)[:, None, :, None]
    denominator = counts.to(x.dtype)[:, None, None, None]
    mean = (x * live).sum(dim=-2, keepdim=True) / denominator
    std = (x - mean).mul_(live).pow_(2).sum(dim=-2, keepdim=True).div_(denominator).sqrt_()
    x = x.sub_(mean).div_(std)[:, :, :r, :f]
    if on_device(dev):  # where the DTW kernel runs, the median kernel does
        return median_kernel(x, ends).mean(dim=1)
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


def median_kernel(x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """median_torch by one Triton kernel: x [B, H, r, f] float32, ends [B] (on x's device)."""
    x, ends = x.contiguous(), ends.contiguous()  # read by flat index
    batch, heads, r, f = x.shape
    out = torch.empty_like(x)
    block = 512
    _median7[(batch * heads * r, triton.cdiv(f, block))](x, out, ends, heads * r, f, BLOCK=block, num_warps=4)
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

    # The sizes change with the batch's shape: left unspecialised, one compilation.
    @triton.jit(do_not_specialize=["ROWS_PER_WINDOW", "F"])
    def _median7(X, Out, Ends, ROWS_PER_WINDOW, F, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        end = tl.load(Ends + row // ROWS_PER_WINDOW).to(tl.int32)
        src = X + row * F
        p0, p1, p2 = _tap(src, t, 0, end, F), _tap(src, t, 1, end, F), _tap(src, t, 2, end, F)
        p3, p4, p5, p6 = _tap(src, t, 3, end, F), _tap(src, t, 4, end, F), _tap(src, t, 5, end, F), _tap(src, t, 6, end, F)
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
        here = tl.load(src + t, mask=t < F, other=0.0)
        tl.store(Out + row * F + t, tl.where(end <= 3, here, p3), mask=t < F)
