"""The decode step's projections at a step's row counts: cuBLAS (F.linear, then the Triton residual add
and layer norm, as the step ran them before model/split_k.py) against split_k's split-K GEMM, whose
partial sums the add and norm take.

    python benchmarks/decoder_gemms.py [--arch large-v3] [--rows 256 512] [--splits 2 4 5 6 8]

At M = 256 rows a projection with N = 1,280 outputs gives cuBLAS few output tiles for the GPU's 132
SMs, so it reads its weight with a fraction of the machine (profile_step.py: ~7 us each, ~0.9 ms of
W2's step). For each of a decoder layer's projections (q/k/v fused, out, cross q, cross out, fc1,
fc2) and the logits (vocabulary padded to 8), over `--layers` distinct weights (so each read misses
L2 as a step's layers do) replayed from one CUDA graph:
- `cublas`: F.linear with the bias (for out, cross out and fc2: then encoder_ops.add_norm);
- `split_k.plan`: what the step now runs (split_k.plan's choice, or cuBLAS where it declines);
- `splitK sS BMxBNxBK wW`: split_k with that plan (for out, cross out, fc2: project_add_norm; else
  project).
Each candidate is checked against float32 (the normed output where there is one) and printed as
microseconds per call and the weight's bytes per second. Decides split_k's MAX_TILES,
TARGET_PROGRAMS and tiles; figures go to docs/GPU_NOTES.md.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import common
from batchscribe.model import encoder_ops, split_k
from kernel_timing import Candidates
from w2_large_v3 import ARCHS

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): tiles small enough to give N = 1,280 many programs.
CONFIGS = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 128, 4, 3)]
NORMED = ("out", "cross out", "fc2")  # followed by the residual add and layer norm in the step


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
    p.add_argument("--splits", type=int, nargs="+", default=[2, 4, 5, 6, 8])
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
            lins = [torch.nn.Linear(k, n, device="cuda", dtype=dtype) for _ in range(args.layers)]
            norm = torch.nn.LayerNorm(n, device="cuda", dtype=dtype)
            r = torch.randn(rows, n, device="cuda", dtype=dtype)
            normed = name in NORMED
            ref = F.linear(x.float(), lins[0].weight.float(), lins[0].bias.float())
            if normed:
                ref = F.layer_norm(ref + r.float(), (n,), norm.weight.float(), norm.bias.float(), norm.eps)
            gb = n * k * 2 / 1e9  # the weight's bytes: what the GEMM must read
            case = Candidates(ref, gb, args.layers, args.reps)
            chosen = split_k.plan(x, lins[0])
            print(f"== rows {rows} {name}: N {n} K {k}, {gb * 1e3:.1f} MB of weight; plan {chosen}", flush=True)

            def run(i: int, plan) -> torch.Tensor:
                if normed:
                    if plan is None:  # the step before split_k: cuBLAS, then the Triton add and norm
                        y = lins[i](x)
                        return encoder_ops.add_norm(y, r, None, norm, fp8=False)[0]
                    return split_k.project_add_norm(lins[i], x, r, norm, plan)[1]
                return lins[i](x) if plan is None else split_k.project(lins[i], x, plan)

            case.measure("cublas", lambda i: run(i, None))
            if chosen is not None:
                case.measure("split_k.plan", lambda i: run(i, chosen))
            for split in args.splits:
                for cfg in CONFIGS:
                    plan = split_k.Plan(split, *cfg)
                    label = f"splitK s{split} {cfg[0]}x{cfg[1]}x{cfg[2]} w{cfg[3]} st{cfg[4]}"
                    case.measure(label, lambda i, pl=plan: run(i, pl))
            print(case.best("cublas"), flush=True)
            times = {"cublas": next(t for t, c in case.results if c == "cublas"), "best": min(case.results)[0],
                     "plan": next((t for t, c in case.results if c == "split_k.plan"), None)}  # fmt: skip
            times["plan"] = times["plan"] or times["cublas"]
            per_step = 1 if name == "logits" else arch["decoder_layers"]  # the logits run once a step
            for kind, us in times.items():
                totals[(rows, kind)] = totals.get((rows, kind), 0.0) + us * per_step
    for rows in args.rows:
        print(f"rows {rows}: a step's projections (with the three add+norms), cublas "
              f"{totals[(rows, 'cublas')] / 1e3:.2f} ms, split_k.plan {totals[(rows, 'plan')] / 1e3:.2f} ms, "
              f"the best candidate each {totals[(rows, 'best')] / 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
