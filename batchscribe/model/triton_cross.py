"""Cross-attention of one query per row over a heads-first cross cache, as a Triton kernel.

Decode-time cross-attention is a pure bandwidth problem: every step, each (row, head) reads its
1500 encoder frames of K and V once (a large-v3 row: 32 layers x 2 x 1500 x 1280 values) and does
two dot products per frame. With the cache laid out heads first (`DecoderCache.cross_hnd`,
[n_slots, n_head, n_audio_ctx, head_dim]) each (row, head)'s K and V are contiguous runs, so one
program streams them with wide loads and an online softmax, in fp32, from bf16/fp16 or fp8 (e4m3,
scale 1.0) caches alike. Small batches split the frames over several programs (flash-decoding) and a
second kernel merges the partial softmaxes, so a bucket of a few rows still spreads over the SMs.
Given the decoder's `running` flags, rows that have finished (or hold no window) read next to
nothing: a bucket keeps stepping them until the next admission, ~25 % of W1's row-steps.

Row i of a step is slot i (the engine steps rows [0, bucket)). Nothing here syncs with the host or
allocates outside the caller's stream, so a step that calls it can be captured in a CUDA graph once
`compile_for` has run it eagerly for that batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from batchscribe.model.triton_self import SelfConfig

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: nothing here is reachable without CUDA
    triton = None

LOG2E = 1.4426950408889634


def triton_available() -> bool:
    return triton is not None


@dataclass(frozen=True)
class CrossConfig:
    """Launch shape, chosen by measurement on the H200 (benchmarks/cross_kernels.py, under CUDA graphs;
    docs/GPU_NOTES.md): 256-frame blocks read fp8 at 3.9-4.0 TB/s for 256-512 rows, where 128-frame
    blocks managed 2.9; how far small batches split mattered little (within 10 %)."""

    block_n: int = 256  # frames per loop iteration
    num_warps: int = 4
    num_stages: int = 2
    min_programs: int = 1024  # split the frames until rows x heads x splits reaches this
    max_split: int = 8


if triton is not None:

    @triton.jit
    def online_softmax_block(K, V, offs, live, q, m_i, l_i, acc):
        """One block of an online softmax (shared with triton_self): the keys and values at `offs`
        ([N, D] offsets) where `live` ([N]), against q ([D], fp32, log2 units). Returns the running
        maximum, sum and unnormalised output [D], updated."""
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
    def store_partial(O, Acc, ML, row, head, part, m_i, l_i, acc, stride_ob, stride_oh,
                      HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
        """A program's result (shared with triton_self): the output when it saw the whole row,
        else its partial softmax in the layout `_cross_merge` reads ([B, H, SPLIT, D] and
        [B, H, SPLIT, 2]; a split that saw nothing leaves m = -inf, l = 0: weight 0)."""
        d = tl.arange(0, HEAD_DIM)
        if SPLIT == 1:
            tl.store(O + row * stride_ob + head * stride_oh + d, (acc / l_i).to(O.dtype.element_ty))
        else:
            slot = (row * tl.num_programs(1) + head) * SPLIT + part
            tl.store(Acc + slot * HEAD_DIM + d, acc)
            tl.store(ML + slot * 2, m_i)
            tl.store(ML + slot * 2 + 1, l_i)

    @triton.jit
    def _cross_partial(
        Q, K, V, O, Acc, ML, Live,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_ob, stride_oh,
        n_ctx, scale,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
        HAS_LIVE: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        part = tl.program_id(2)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale  # [D], log2 units
        base = row.to(tl.int64) * stride_kb + head * stride_kh
        start = part * CHUNK
        stop = tl.minimum(start + CHUNK, n_ctx)
        if HAS_LIVE:  # a row whose output nobody reads (finished, free): one frame per split, so
            # its online softmax stays finite (no 0 / 0) while it reads next to nothing
            stop = tl.where(tl.load(Live + row).to(tl.int32) != 0, stop, start + 1)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.zeros([], tl.float32)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        for n0 in range(0, CHUNK, BLOCK_N):  # a trip count known at compile time; the mask ends it
            n = start + n0 + tl.arange(0, BLOCK_N)
            live = n < stop
            offs = base + n[:, None] * stride_kn + d[None, :]  # [BLOCK_N, D]
            m_i, l_i, acc = online_softmax_block(K, V, offs, live, q, m_i, l_i, acc)
        store_partial(O, Acc, ML, row, head, part, m_i, l_i, acc, stride_ob, stride_oh, HEAD_DIM, SPLIT)

    @triton.jit
    def _cross_merge(
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
        w = tl.exp2(m - tl.max(m, 0))  # [SPLIT_P2]; a split that saw no frame has m = -inf: weight 0
        acc = tl.load(Acc + (first + s)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0)
        out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
        tl.store(O + row * stride_ob + head * stride_oh + d, out.to(O.dtype.element_ty))


def split_for(n_rows: int, n_head: int, n_ctx: int, config: CrossConfig | SelfConfig) -> int:
    """How many programs share one (row, head)'s frames (or positions): enough programs to fill the
    GPU, but each split keeps at least two loop iterations."""
    want = math.ceil(config.min_programs / (n_rows * n_head))
    most = max(1, n_ctx // (2 * config.block_n))
    return max(1, min(want, config.max_split, most))


def cross_attention(
    q: torch.Tensor,  # [B, n_head, head_dim], fp16/bf16
    k_cache: torch.Tensor,  # [n_slots >= B, n_head, n_ctx, head_dim], fp16/bf16/fp8 (scale 1.0)
    v_cache: torch.Tensor,  # same shape and strides as k_cache
    config: CrossConfig = CrossConfig(),
    live: torch.Tensor | None = None,  # [n_slots >= B] bool: rows whose output is used; None: all
) -> torch.Tensor:  # [B, n_head, head_dim], q's dtype
    """softmax(q kᵀ / sqrt(head_dim)) v for row i over slot i's frames. Rows with `live[i]` False
    read one frame per split and get a finite value nobody uses: finished and free slots stepped in
    a bucket cost (almost) no bandwidth."""
    if triton is None:
        raise RuntimeError("the triton cross-attention kernel needs the triton package (it ships with CUDA torch)")
    n_rows, n_head, head_dim = q.shape
    n_ctx = k_cache.shape[2]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with contiguous head_dim")
    out = torch.empty_like(q)
    split = split_for(n_rows, n_head, n_ctx, config)
    chunk = math.ceil(math.ceil(n_ctx / split) / config.block_n) * config.block_n
    split = math.ceil(n_ctx / chunk)  # rounding the chunk up can leave fewer, fuller splits
    if split > 1:
        acc = torch.empty((n_rows, n_head, split, head_dim), dtype=torch.float32, device=q.device)
        ml = torch.empty((n_rows, n_head, split, 2), dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unused by the kernel when SPLIT == 1
    scale = LOG2E / math.sqrt(head_dim)
    _cross_partial[(n_rows, n_head, split)](
        q, k_cache, v_cache, out, acc, ml, out if live is None else live,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), n_ctx, scale,
        HEAD_DIM=head_dim, BLOCK_N=config.block_n, SPLIT=split, CHUNK=chunk, HAS_LIVE=live is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if split > 1:
        merge_splits(acc, ml, out, split)
    return out


def merge_splits(acc: torch.Tensor, ml: torch.Tensor, out: torch.Tensor, split: int) -> None:
    """Combine the partial softmaxes of `split` programs per (row, head) into out [B, H, D].
    acc: [B, H, split, D] float32 unnormalised outputs; ml: [B, H, split, 2] float32 (max, sum)."""
    n_rows, n_head, head_dim = out.shape
    _cross_merge[(n_rows, n_head)](
        acc, ml, out, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split), num_warps=1,
    )  # fmt: skip
