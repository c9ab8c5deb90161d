"""Self-attention kernels head to head: one decode step's self-attention over the per-slot caches.

    python benchmarks/self_kernels.py [--rows 512 256 64 8] [--heads 20] [--positions 4 68 200 440]

For each batch size and position (every row at that position, so each attends to position + 1 of
the cache's 448 entries; plus "mixed": uniform over 0..447) it times, over `--layers` distinct
caches (so the reads miss L2 as a real step's layers do) and replayed from one CUDA graph as the
engine's step is: FlashInfer's batch decode over one 448-position page per slot (the engine's
`flashinfer` self kernel), `batchscribe.attention.triton_self` under a sweep of launch shapes, and SDPA
with the length mask over the whole cache. Each result is checked against SDPA in fp32 and printed
as microseconds per layer and the bytes of K/V the rows' lengths cover per second. Decides `auto`'s
self-attention kernel; figures go to docs/GPU_NOTES.md.
"""

from __future__ import annotations

import argparse
import itertools

import torch

import common
from batchscribe.attention import triton_self
from batchscribe.attention.triton_common import split_for
from batchscribe.attention.sdpa import SdpaBackend
from kernel_timing import Candidates, flashinfer_decode

N_CTX, HEAD_DIM = 448, 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[512, 256, 64, 8])
    p.add_argument("--heads", type=int, default=20)
    p.add_argument("--positions", nargs="+", default=["4", "68", "200", "440", "mixed"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args()
    print(common.hardware(), "commit", common.commit())
    sdpa = SdpaBackend()
    for rows, pos in itertools.product(args.rows, args.positions):
        shape = (rows, N_CTX, args.heads, HEAD_DIM)
        ks = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(args.layers)]
        vs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(args.layers)]
        q = torch.randn(rows, args.heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        if pos == "mixed":
            positions = torch.randint(0, N_CTX, (rows,), device="cuda")
        else:
            positions = torch.full((rows,), int(pos), device="cuda")
        lengths = positions + 1
        ref = sdpa.self_attention(q.float(), ks[0].float(), vs[0].float(), None, positions, None)
        gb = 2 * int(lengths.sum()) * args.heads * HEAD_DIM * 2 / 1e9
        case = Candidates(ref, gb, args.layers, args.reps)
        print(f"== rows {rows} heads {args.heads} position {pos}: {gb * 1e3:.1f} MB per layer", flush=True)
        # The engine's planning (attention.flashinfer.FlashInferSelf): one N_CTX page per slot, each row's length written.
        case.measure("flashinfer", flashinfer_decode(q, ks, vs, "NHD", N_CTX, lengths))
        case.measure("sdpa", lambda i: sdpa.self_attention(q, ks[i], vs[i], None, positions, None))
        # The default (which splits the positions of small batches), the same never splitting, then
        # a sweep of launch shapes (split as the default would).
        configs = {"triton default": triton_self.SelfConfig(), "triton no split": triton_self.SelfConfig(min_programs=1)}
        for b, w in itertools.product((16, 32, 64, 128), args.warps):
            configs[f"triton b{b} w{w}"] = triton_self.SelfConfig(block_n=b, num_warps=w)
        for name, cfg in configs.items():
            split = split_for(rows, args.heads, N_CTX, cfg)
            case.measure(f"{name} split{split}", lambda i, cfg=cfg: triton_self.self_attention(q, ks[i], vs[i], lengths, cfg))
        print(case.best("flashinfer"), flush=True)
        ks.clear(), vs.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
