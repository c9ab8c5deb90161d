"""The decode step's projections at a step's row counts: cuBLAS (F.linear, as the step runs them)
against a Triton split-K GEMM.

    python benchmarks/decoder_gemms.py [--arch large-v3] [--rows 256 512] [--splits 1 2 4 8]

At M = 256 rows a projection with N = 1,280 outputs has ~20 output tiles for the GPU's 132 SMs, so
cuBLAS reads its weight with a sixth of the machine (profile_step.py: ~7 us each, ~0.9 ms of W2's
step). Splitting K over more programs spreads the read; the fp32 partial sums then need adding.
For each of a decoder layer's projections (q/k/v fused, out, cross q, cross out, fc1, fc2) and the
logits (vocabulary padded to 8), over `--layers` distinct weights (so each read misses L2 as a step's
layers do) replayed from one CUDA graph:
- `cublas`: F.linear with the bias;
- `splitK sS BMxBNxBK wW`: the partial GEMM, then a pass adding the partials and the bias;
- `... partials only`: the GEMM alone. In the engine the adding would move into the add_norm pass
  after out_proj and fc2, so this line bounds what that fusion could give.
Each candidate is checked against F.linear in fp32 (the partials-only lines are not: they return
no finished product) and printed as microseconds per call and the weight's bytes per second.
Decides whether the step's projections get a Triton form; figures go to docs/GPU_NOTES.md.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import common
from kernel_timing import Candidates, timed
from w2_large_v3 import ARCHS

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): tiles small enough to give N = 1,280 many programs.
CONFIGS = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3)]


@triton.jit
def _partial(X, W, P, M, N, K, K_SPLIT, stride_xm, stride_wn, stride_ps, stride_pm,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """P[split, m, n] = sum over split's K range of X[m, k] W[n, k] (fp32)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    start = split * K_SPLIT
    for k0 in range(start, start + K_SPLIT, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        # W's rows as stored (each contiguous in k), transposed in registers for the dot
        w = tl.load(W + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w))  # [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]
    tl.store(P + split * stride_ps + rm[:, None] * stride_pm + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))  # fmt: skip


@triton.jit
def _sum(P, B, Y, N, stride_ps, stride_pm, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Y[m, :] = bias + the SPLIT partials of row m, in Y's dtype."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < N
    acc = tl.load(B + cols, mask=live, other=0.0).to(tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(P + s * stride_ps + row * stride_pm + cols, mask=live, other=0.0)
    tl.store(Y + row * N + cols, acc.to(Y.dtype.element_ty), mask=live)


def split_k(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, split: int, config, partials: torch.Tensor,
            out: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """x [M, K] @ w [N, K]ᵀ + bias into out [M, N] (None: the partials [split, M, N] alone)."""
    block_m, block_n, block_k, warps, stages = config
    (m, k), n = x.shape, w.shape[0]
    k_split = math.ceil(k / split / block_k) * block_k
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), triton.cdiv(k, k_split))
    _partial[grid](x, w, partials, m, n, k, k_split, x.stride(0), w.stride(0), partials.stride(0),
                   partials.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                   num_warps=warps, num_stages=stages)  # fmt: skip
    if out is None:
        return partials
    _sum[(m, triton.cdiv(n, 1024))](partials, bias, out, n, partials.stride(0), partials.stride(1),
                                    SPLIT=grid[2], BLOCK=1024, num_warps=4)  # fmt: skip
    return out


def projections(arch: dict) -> list[tuple[str, int, int]]:
    """(name, N, K) of a decoder layer's projections as the step runs them, and the logits."""
    d, mlp = arch["d_model"], arch["decoder_ffn_dim"]
    vocab = arch["vocab_size"] + (-arch["vocab_size"] % 8)
    return [("qkv", 3 * d, d), ("out", d, d), ("cross q", d, d), ("cross out", d, d), ("fc1", mlp, d),
            ("fc2", d, mlp), ("logits", vocab, d)]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(ARCHS), default="large-v3")
    p.add_argument("--rows", type=int, nargs="+", default=[256, 512])
    p.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    arch, dtype = ARCHS[args.arch], torch.bfloat16
    print(common.hardware(), "commit", common.commit(), "arch", args.arch)
    totals: dict[tuple[int, str], float] = {}
    for rows in args.rows:
        for name, n, k in projections(arch):
            torch.manual_seed(0)
            x = torch.randn(rows, k, device="cuda", dtype=dtype)
            ws = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(args.layers)]
            bs = [torch.randn(n, device="cuda", dtype=dtype) * 0.02 for _ in range(args.layers)]
            ref = F.linear(x.float(), ws[0].float(), bs[0].float())
            gb = n * k * 2 / 1e9  # the weight's bytes: what the GEMM must read
            case = Candidates(ref, gb, args.layers, args.reps)
            print(f"== rows {rows} {name}: N {n} K {k}, {gb * 1e3:.1f} MB of weight", flush=True)
            case.measure("cublas", lambda i: F.linear(x, ws[i], bs[i]))
            out = torch.empty(rows, n, device="cuda", dtype=dtype)
            for split in args.splits:
                partials = torch.empty(split, rows, n, device="cuda", dtype=torch.float32)
                for cfg in CONFIGS:
                    label = f"splitK s{split} {cfg[0]}x{cfg[1]}x{cfg[2]} w{cfg[3]}"
                    case.measure(label, lambda i, s=split, c=cfg, pp=partials: split_k(x, ws[i], bs[i], s, c, pp, out))
                    if split > 1:
                        try:
                            us = timed(lambda i, s=split, c=cfg, pp=partials: split_k(x, ws[i], bs[i], s, c, pp, None),
                                       args.layers, args.reps)  # fmt: skip
                            print(f"  {label} partials only: {us:8.1f} us  {gb / us * 1e6 / 1e3:5.2f} TB/s")
                        except Exception as exc:  # as Candidates.measure: report, go on
                            print(f"  {label} partials only: failed ({type(exc).__name__})")
            print(case.best("cublas"), flush=True)
            times = {"cublas": next(t for t, c in case.results if c == "cublas"), "best": min(case.results)[0]}
            per_step = 1 if name == "logits" else arch["decoder_layers"]  # the logits run once a step
            for kind, us in times.items():
                totals[(rows, kind)] = totals.get((rows, kind), 0.0) + us * per_step
    for rows in args.rows:
        print(f"rows {rows}: a step's projections, cublas {totals[(rows, 'cublas')] / 1e3:.2f} ms, "
              f"the best candidate each {totals[(rows, 'best')] / 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
