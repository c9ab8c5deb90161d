"""Self-attention kernels head to head: one decode step's self-attention over the per-slot caches.

    python benchmarks/self_kernels.py [--rows 512 256 64 8] [--heads 20] [--positions 4 68 200 440]

For each batch size and position (every row at that position, so each attends to position + 1 of
the cache's 448 entries; plus "mixed": uniform over 0..447) it times, over `--layers` distinct
caches (so the reads miss L2 as a real step's layers do) and replayed from one CUDA graph as the
engine's step is: FlashInfer's batch decode over one 448-position page per slot (the engine's
`flashinfer` self kernel), `batchscribe.model.triton_self` under a sweep of launch shapes, and SDPA
with the length mask over the whole cache. Each result is checked against SDPA in fp32 and printed
as microseconds per layer and the bytes of K/V the rows' lengths cover per second. Decides `auto`'s
self-attention kernel; figures go to docs/GPU_NOTES.md.
"""

from __future__ import annotations

import argparse
import itertools

import torch

import common
from batchscribe.engine.graphs import replay_seconds
from batchscribe.model import triton_self
from batchscribe.model.attention import SdpaBackend

N_CTX, HEAD_DIM = 448, 64


def timed(fn, layers: int, reps: int) -> float:
    """Microseconds per call, cycling over the layers' caches, replayed from one CUDA graph."""
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


def flashinfer_self(q, ks, vs, positions):
    """The engine's planning (FlashInferBackend.prepare): one page of N_CTX per slot, planned full,
    each row's length written into the last-page-length buffer."""
    import flashinfer

    rows, heads = q.shape[0], q.shape[1]
    i32 = dict(dtype=torch.int32, device=q.device)
    indptr, indices, last = torch.arange(rows + 1, **i32), torch.arange(rows, **i32), torch.full((rows,), N_CTX, **i32)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=q.device), "NHD", use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last,
    )  # fmt: skip
    wrapper.plan(indptr.clone(), indices.clone(), last.clone(), heads, heads, HEAD_DIM, N_CTX,
                 q_data_type=q.dtype, kv_data_type=ks[0].dtype)  # fmt: skip
    last.copy_(positions + 1)
    return lambda i: wrapper.run(q, (ks[i], vs[i]))


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

        print(f"== rows {rows} heads {args.heads} position {pos}: {gb * 1e3:.1f} MB per layer", flush=True)
        measure("flashinfer", flashinfer_self(q, ks, vs, positions))
        measure("sdpa", lambda i: sdpa.self_attention(q, ks[i], vs[i], None, positions, None))
        # The default (which splits the positions of small batches), the same never splitting, then
        # a sweep of launch shapes (split as the default would).
        configs = {"triton default": triton_self.SelfConfig(), "triton no split": triton_self.SelfConfig(min_programs=1)}
        for b, w in itertools.product((16, 32, 64, 128), args.warps):
            configs[f"triton b{b} w{w}"] = triton_self.SelfConfig(block_n=b, num_warps=w)
        for name, cfg in configs.items():
            split = triton_self.split_for(rows, args.heads, N_CTX, cfg)
            measure(f"{name} split{split}", lambda i, cfg=cfg: triton_self.self_attention(q, ks[i], vs[i], lengths, cfg))
        results.sort()
        print(f"  best: {results[0][1]} {results[0][0]:.1f} us; flashinfer "
              f"{next((us for us, n in results if n == 'flashinfer'), float('nan')):.1f} us", flush=True)  # fmt: skip
        ks.clear(), vs.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
