"""Shared by the attention-kernel benchmarks (cross_kernels.py, self_kernels.py): timing a kernel
replayed from one CUDA graph over several layers' caches, printing each candidate against a
reference, and FlashInfer's batch decode planned over one page per row."""

from __future__ import annotations

from typing import Callable

import torch

from batchscribe.engine.graphs import replay_seconds


def timed(fn: Callable[[int], torch.Tensor], layers: int, reps: int) -> float:
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


class Candidates:
    """One case's candidates: each checked against `ref` (layer 0's output, fp32), timed, printed
    as microseconds per layer and the `gb` of K/V a layer reads per second; `best()` after."""

    def __init__(self, ref: torch.Tensor, gb: float, layers: int, reps: int):
        self.ref, self.gb, self.layers, self.reps = ref, gb, layers, reps
        self.results: list[tuple[float, str]] = []  # (us, name)

    def measure(self, name: str, fn: Callable[[int], torch.Tensor]) -> None:
        try:
            err = (fn(0).float() - self.ref).abs().max().item()
            us = timed(fn, self.layers, self.reps)
        except Exception as exc:  # a configuration that does not compile or run: report, go on
            print(f"  {name}: failed ({type(exc).__name__}: {str(exc)[:120]})")
            return
        self.results.append((us, name))
        print(f"  {name}: {us:8.1f} us  {self.gb / us * 1e6 / 1e3:5.2f} TB/s  max err {err:.2e}", flush=True)

    def best(self, baseline: str) -> str:
        """The fastest candidate and the `baseline` one's time, as a line."""
        us, name = min(self.results)
        base = next((t for t, n in self.results if n == baseline), float("nan"))
        return f"  best: {name} {us:.1f} us; {baseline} {base:.1f} us"


def flashinfer_decode(q, ks, vs, layout: str, page: int, lengths: torch.Tensor | None = None,
                      tensor_cores: bool = False) -> Callable[[int], torch.Tensor]:  # fmt: skip
    """FlashInfer's batch decode as the engine plans it (attention.flashinfer.FlashInferWorkspace.plan): one `page`-long
    page per row, planned full; `lengths` [B] (optional) then written into the last-page-length
    buffer the kernel reads, as `begin_step` does for self-attention."""
    import flashinfer

    rows, heads, head_dim = q.shape
    i32 = dict(dtype=torch.int32, device=q.device)
    indptr, indices, last = torch.arange(rows + 1, **i32), torch.arange(rows, **i32), torch.full((rows,), page, **i32)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=q.device), layout, use_cuda_graph=True,
        use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )  # fmt: skip
    wrapper.plan(indptr.clone(), indices.clone(), last.clone(), heads, heads, head_dim, page,
                 q_data_type=q.dtype, kv_data_type=ks[0].dtype)  # fmt: skip
    if lengths is not None:
        last.copy_(lengths)
    return lambda i: wrapper.run(q, (ks[i], vs[i]))
