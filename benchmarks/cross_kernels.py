"""Cross-attention kernels head to head: one decode step's cross-attention over a heads-first cache.

    python benchmarks/cross_kernels.py [--rows 512 256 128 64 32 16 4] [--heads 20] [--dtypes fp8 bf16]

For each batch size and cache dtype it times, over `--layers` distinct caches (so the reads miss L2
as a real step's 32 layers do): FlashInfer's batch decode over one 1500-frame HND page per row (the
engine's `flashinfer_hnd`), the Triton kernel of `batchscribe.model.triton_cross` under a sweep of
launch configurations, and SDPA (bf16 only). Each result is checked against SDPA in fp32 and printed
as microseconds per layer and the cache bytes read per second. Decides `auto`'s cross kernel and
`triton_cross.CrossConfig`'s defaults; figures go to docs/GPU_NOTES.md.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

import common
from batchscribe.engine.graphs import replay_seconds
from batchscribe.model import triton_cross

N_CTX, HEAD_DIM = 1500, 64
DTYPES = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}


def timed(fn, layers: int, reps: int) -> float:
    """Microseconds per call, cycling over the layers' caches, replayed from one CUDA graph as the
    engine's step is (so small batches are not timed as host launch overhead)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm up outside the capture
        for i in range(layers):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(layers):
            fn(i)
    return replay_seconds(graph, reps) * 1e6 / layers


def flashinfer_hnd(q, ks, vs, tensor_cores: bool):
    import flashinfer

    rows, heads = q.shape[0], q.shape[1]
    i32 = dict(dtype=torch.int32, device=q.device)
    indptr, indices, last = torch.arange(rows + 1, **i32), torch.arange(rows, **i32), torch.full((rows,), N_CTX, **i32)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=q.device), "HND", use_cuda_graph=True,
        use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )  # fmt: skip
    wrapper.plan(indptr.clone(), indices.clone(), last.clone(), heads, heads, HEAD_DIM, N_CTX,
                 q_data_type=q.dtype, kv_data_type=ks[0].dtype)  # fmt: skip
    return lambda i: wrapper.run(q, (ks[i], vs[i]))


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
        dtype = DTYPES[dtype_name]
        shape = (rows, args.heads, N_CTX, HEAD_DIM)
        ks = [torch.randn(shape, device="cuda").to(dtype) for _ in range(args.layers)]
        vs = [torch.randn(shape, device="cuda").to(dtype) for _ in range(args.layers)]
        q = torch.randn(rows, args.heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), ks[0].float(), vs[0].float()).squeeze(2)
        gb = 2 * rows * args.heads * N_CTX * HEAD_DIM * ks[0].element_size() / 1e9
        results = []

        def measure(name, fn):
            try:
                err = (fn(0).float() - ref).abs().max().item()
                us = timed(fn, args.layers, args.reps)
            except Exception as exc:  # a configuration that does not compile or run: report, go on
                print(f"  {name}: failed ({type(exc).__name__}: {str(exc)[:120]})")
                return
            results.append((us, name))
            print(f"  {name}: {us:8.1f} us  {gb / us * 1e6 / 1e3:5.2f} TB/s  max err {err:.2e}", flush=True)

        print(f"== {dtype_name} rows {rows} heads {args.heads}: {gb * 1e3:.0f} MB per layer", flush=True)
        measure("flashinfer_hnd", flashinfer_hnd(q, ks, vs, False))
        if args.tensor_cores:
            measure("flashinfer_hnd tensor cores", flashinfer_hnd(q, ks, vs, True))
        if dtype == torch.bfloat16:
            measure("sdpa", lambda i: F.scaled_dot_product_attention(q.unsqueeze(2), ks[i], vs[i]).squeeze(2))
        # How far to split a (row, head)'s frames matters only when rows x heads is small.
        spreads = (256, 1024, 4096) if rows * args.heads < 4096 else (1024,)
        for (b, w, s), m in itertools.product(shapes, spreads):
            cfg = triton_cross.CrossConfig(block_n=b, num_warps=w, num_stages=s, min_programs=m)
            split = triton_cross.split_for(rows, args.heads, N_CTX, cfg)
            name = f"triton b{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} m{cfg.min_programs} split{split}"
            measure(name, lambda i, cfg=cfg: triton_cross.cross_attention(q, ks[i], vs[i], cfg))
        results.sort()
        print(f"  best: {results[0][1]} {results[0][0]:.1f} us; flashinfer_hnd "
              f"{next(us for us, n in results if n == 'flashinfer_hnd'):.1f} us", flush=True)  # fmt: skip
        ks.clear(), vs.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
