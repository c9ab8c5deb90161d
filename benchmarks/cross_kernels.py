"""Cross-attention kernels head to head: one decode step's cross-attention over a heads-first cache.

    python benchmarks/cross_kernels.py [--rows 512 256 128 64 32 16 4] [--heads 20] [--dtypes fp8 bf16 int4]

For each batch size and cache dtype it times, over `--layers` distinct caches (so the reads miss L2
as a real step's 32 layers do): FlashInfer's batch decode over one 1500-frame HND page per row (the
engine's `flashinfer_hnd`), the Triton kernel of `batchscribe.attention.triton_cross` under a sweep of
launch configurations, and SDPA (bf16 only). Each result is checked against SDPA in fp32 and printed
as microseconds per layer and the cache bytes read per second. Decides `auto`'s cross kernel and
`triton_cross.CrossConfig`'s defaults; figures go to docs/GPU_NOTES.md.
`--dtypes int4`: the 4-bit cache (`--cross-kv int4`: `batchscribe.attention.int4_cross`, packed
values and fp16 scales) under the same sweep, checked against SDPA over its dequantised cache, with the fp8 Triton
kernel on the same rows as the baseline (its TB/s there counts the int4 bytes: compare microseconds).
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

import common
from batchscribe.attention import int4_cross, triton_cross
from batchscribe.attention.triton_common import split_for
from kernel_timing import Candidates, flashinfer_decode

N_CTX, HEAD_DIM = 1500, 64
DTYPES = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "int4": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[512, 256, 128, 64, 32, 16, 4])
    p.add_argument("--heads", type=int, default=20)
    p.add_argument("--dtypes", nargs="+", default=["fp8", "bf16"], choices=list(DTYPES))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tensor-cores", action="store_true", help="also FlashInfer's tensor-core decode")
    args = p.parse_args()
    print(common.hardware(), "commit", common.commit())
    shapes = list(itertools.product((128, 256, 512), (4, 8), (2, 3)))
    for dtype_name, rows in itertools.product(args.dtypes, args.rows):
        if dtype_name == "int4":
            int4_case(rows, args, shapes)
            continue
        dtype = DTYPES[dtype_name]
        shape = (rows, args.heads, N_CTX, HEAD_DIM)
        ks = [torch.randn(shape, device="cuda").to(dtype) for _ in range(args.layers)]
        vs = [torch.randn(shape, device="cuda").to(dtype) for _ in range(args.layers)]
        q = torch.randn(rows, args.heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), ks[0].float(), vs[0].float()).squeeze(2)
        gb = 2 * rows * args.heads * N_CTX * HEAD_DIM * ks[0].element_size() / 1e9
        case = Candidates(ref, gb, args.layers, args.reps)
        print(f"== {dtype_name} rows {rows} heads {args.heads}: {gb * 1e3:.0f} MB per layer", flush=True)
        case.measure("flashinfer_hnd", flashinfer_decode(q, ks, vs, "HND", N_CTX))
        if args.tensor_cores:
            case.measure("flashinfer_hnd tensor cores", flashinfer_decode(q, ks, vs, "HND", N_CTX, tensor_cores=True))
        if dtype == torch.bfloat16:
            case.measure("sdpa", lambda i: F.scaled_dot_product_attention(q.unsqueeze(2), ks[i], vs[i]).squeeze(2))
        # How far to split a (row, head)'s frames matters only when rows x heads is small.
        spreads = (256, 1024, 4096) if rows * args.heads < 4096 else (1024,)
        for (b, w, s), m in itertools.product(shapes, spreads):
            cfg = triton_cross.CrossConfig(block_n=b, num_warps=w, num_stages=s, min_programs=m)
            split = split_for(rows, args.heads, N_CTX, cfg)
            name = f"triton b{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} m{cfg.min_programs} split{split}"
            case.measure(name, lambda i, cfg=cfg: triton_cross.cross_attention(q, ks[i], vs[i], cfg))
        print(case.best("flashinfer_hnd"), flush=True)
        ks.clear(), vs.clear()
        torch.cuda.empty_cache()


def int4_case(rows: int, args: argparse.Namespace, shapes: list[tuple[int, int, int]]) -> None:
    """The int4 kernel's sweep at `rows`, against the fp8 Triton kernel's default on the same rows."""
    shape = (rows, args.heads, N_CTX, HEAD_DIM)
    every = torch.arange(rows, device="cuda")

    def cache() -> torch.Tensor:
        held = int4_cross.allocate(rows, args.heads, N_CTX, HEAD_DIM, "cuda")
        int4_cross.store(held, torch.randn(rows, N_CTX, args.heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16), every)
        return held

    ks, vs = [cache() for _ in range(args.layers)], [cache() for _ in range(args.layers)]
    fp8_k = [torch.randn(shape, device="cuda").to(torch.float8_e4m3fn) for _ in range(args.layers)]
    fp8_v = [torch.randn(shape, device="cuda").to(torch.float8_e4m3fn) for _ in range(args.layers)]
    q = torch.randn(rows, args.heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k0, v0 = (int4_cross.rows(c[0], every, HEAD_DIM, torch.float32) for c in (ks, vs))
    ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), k0, v0).squeeze(2)
    del k0, v0
    gb = 2 * ks[0].numel() / 1e9
    case = Candidates(ref, gb, args.layers, args.reps)
    print(f"== int4 rows {rows} heads {args.heads}: {gb * 1e3:.0f} MB per layer (fp8: "
          f"{2 * fp8_k[0].numel() / 1e6:.0f} MB)", flush=True)  # fmt: skip
    fp8_ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), fp8_k[0].float(), fp8_v[0].float()).squeeze(2)
    fp8 = Candidates(fp8_ref, gb, args.layers, args.reps)
    fp8.measure("triton fp8 (default config)", lambda i: triton_cross.cross_attention(q, fp8_k[i], fp8_v[i]))
    case.results += fp8.results
    for b, w, s in shapes:
        cfg = triton_cross.CrossConfig(block_n=b, num_warps=w, num_stages=s)
        name = f"int4 b{b} w{w} s{s} split{split_for(rows, args.heads, N_CTX, cfg)}"
        case.measure(name, lambda i, cfg=cfg: int4_cross.cross_attention(q, ks[i], vs[i], cfg))
    print(case.best("triton fp8 (default config)"), flush=True)
    for held in (ks, vs, fp8_k, fp8_v):
        held.clear()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
