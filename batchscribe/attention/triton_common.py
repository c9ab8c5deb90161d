"""What the Triton decode-attention kernels share: one online-softmax block, the partial-result
store, and the merge of split partial softmaxes (flash-decoding).

Both kernels (`triton_cross`, `triton_self`) run one program per (row, head[, split]) with an fp32
online softmax in log2 units. When a (row, head)'s keys are split over several programs, each
stores its unnormalised output and (max, sum), and `merge_splits` combines them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the registry never picks a Triton kernel there
    triton = None

LOG2E = 1.4426950408889634


def triton_available() -> bool:
    return triton is not None


@dataclass(frozen=True)
class LaunchShape:
    """How a kernel is launched; each kernel's defaults were chosen by measurement."""

    block_n: int  # keys per loop iteration
    num_warps: int
    min_programs: int = 1024  # split the keys until rows x heads x splits reaches this
    max_split: int = 8


def check_caches(kernel: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """What both kernels assume of their inputs: triton present, K and V alike, head_dim contiguous."""
    if triton is None:
        raise RuntimeError(f"the triton {kernel} kernel needs the triton package (it ships with CUDA torch)")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with contiguous head_dim")


if triton is not None:

    @triton.jit
    def online_softmax_block(K, V, offs, live, q, m_i, l_i, acc):
        """One block of an online softmax: the keys and values at `offs` ([N, D] offsets) where
        `live` ([N]), against q ([D], fp32, log2 units). Returns the running maximum, sum and
        unnormalised output [D], updated."""
        k = tl.load(K + offs, mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.where(live, tl.sum(k * q[None, :], 1), float("-inf"))  # [N]
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        v = tl.load(V + offs, mask=live[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        return m_new, l_i, acc

    @triton.jit
    def frame_range(Live, row, part, n_ctx, CHUNK: tl.constexpr, HAS_LIVE: tl.constexpr):
        """The frames [start, stop) split `part` of `row` reads: its CHUNK, or one frame where the
        row's output nobody reads (finished, free), so its online softmax stays finite (no 0 / 0)
        while it reads next to nothing."""
        start = part * CHUNK
        stop = tl.minimum(start + CHUNK, n_ctx)
        if HAS_LIVE:
            stop = tl.where(tl.load(Live + row).to(tl.int32) != 0, stop, start + 1)
        return start, stop

    @triton.jit
    def store_partial(O, Acc, ML, row, head, part, m_i, l_i, acc, stride_ob, stride_oh,
                      HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
        """A program's result: the output when it saw the whole row, else its partial softmax in
        the layout `_merge` reads ([B, H, SPLIT, D] and [B, H, SPLIT, 2]; a split that saw nothing
        leaves m = -inf, l = 0: weight 0)."""
        d = tl.arange(0, HEAD_DIM)
        if SPLIT == 1:
            tl.store(O + row * stride_ob + head * stride_oh + d, (acc / l_i).to(O.dtype.element_ty))
        else:
            slot = (row * tl.num_programs(1) + head) * SPLIT + part
            tl.store(Acc + slot * HEAD_DIM + d, acc)
            tl.store(ML + slot * 2, m_i)
            tl.store(ML + slot * 2 + 1, l_i)

    @triton.jit
    def _merge(
        Acc, ML, O, stride_ob, stride_oh,
        HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        d = tl.arange(0, HEAD_DIM)
        s = tl.arange(0, SPLIT_P2)
        live = s < SPLIT
        first = (row * tl.num_programs(1) + head) * SPLIT
        m = tl.load(ML + (first + s) * 2, mask=live, other=float("-inf"))
        l = tl.load(ML + (first + s) * 2 + 1, mask=live, other=0.0)
        w = tl.exp2(m - tl.max(m, 0))  # [SPLIT_P2]; a split that saw no key has m = -inf: weight 0
        acc = tl.load(Acc + (first + s)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0)
        out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
        tl.store(O + row * stride_ob + head * stride_oh + d, out.to(O.dtype.element_ty))


def split_for(n_rows: int, n_head: int, n_ctx: int, config: LaunchShape) -> int:
    """How many programs share one (row, head)'s keys: enough programs to fill the GPU, but each
    split keeps at least two loop iterations."""
    want = math.ceil(config.min_programs / (n_rows * n_head))
    most = max(1, n_ctx // (2 * config.block_n))
    return max(1, min(want, config.max_split, most))


def split_buffers(out: torch.Tensor, n_ctx: int, config: LaunchShape) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(split, chunk, acc, ml) for an output out [B, H, D] over n_ctx keys: the split count after
    rounding each split's chunk up to whole blocks, and the partial buffers (`out` stands in when
    unsplit: the kernel does not touch them then)."""
    n_rows, n_head, head_dim = out.shape
    split = split_for(n_rows, n_head, n_ctx, config)
    chunk = math.ceil(math.ceil(n_ctx / split) / config.block_n) * config.block_n
    split = math.ceil(n_ctx / chunk)  # rounding the chunk up can leave fewer, fuller splits
    if split == 1:
        return split, chunk, out, out
    acc = torch.empty((n_rows, n_head, split, head_dim), dtype=torch.float32, device=out.device)
    ml = torch.empty((n_rows, n_head, split, 2), dtype=torch.float32, device=out.device)
    return split, chunk, acc, ml


def merge_splits(acc: torch.Tensor, ml: torch.Tensor, out: torch.Tensor, split: int) -> None:
    """Combine the partial softmaxes of `split` programs per (row, head) into out [B, H, D].
    acc: [B, H, split, D] float32 unnormalised outputs; ml: [B, H, split, 2] float32 (max, sum)."""
    n_rows, n_head, head_dim = out.shape
    _merge[(n_rows, n_head)](
        acc, ml, out, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split), num_warps=1,
    )  # fmt: skip
