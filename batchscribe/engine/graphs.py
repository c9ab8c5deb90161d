"""CUDA graphs: the decode step per decoder bucket, and the admission encoder per chunk size.

The SlotDecoder's step reads and writes only persistent tensors (the static caches and the per-slot
state), so capturing `_step(bucket)` once per bucket size and replaying it is the whole trick: the
host picks the smallest bucket that covers every occupied slot, and rows inside the bucket that are
free or finished are inert. One graph holds all the steps the host launches between two looks at
the finished flags, and then packs the snapshot table the host reads: one launch per look instead
of a dozen, each of which would wait to reacquire the GIL from the decode threads. Buckets are
captured largest first into one shared memory pool (as nano-vllm does), so the smaller graphs
reuse the largest graph's scratch memory.

Captures use `capture_error_mode="thread_local"`: the sampling graphs are captured on first use,
mid-run, while other threads of the process (decode threads, a caller's) may still call CUDA.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from dataclasses import dataclass

import torch

from batchscribe.constants import N_SAMPLES
from batchscribe.engine.decoding import SlotDecoder

log = logging.getLogger(__name__)


def default_buckets(n_slots: int) -> list[int]:
    """Powers of two up to 64, then steps of 64 up to n_slots (always included): the tail of a run
    pads to a small bucket; the steady state, with every slot busy, runs the largest."""
    buckets = [b for b in (1, 2, 4, 8, 16, 32) if b < n_slots]
    buckets += list(range(64, n_slots, 64))
    return sorted(set(buckets + [n_slots]))


def default_kv_buckets(n_text_ctx: int) -> list[int]:
    """Self-attention lengths to capture: a step attends over the smallest one that covers every
    row's position, so short transcripts do not read (masked) cache up to n_text_ctx."""
    return sorted({min(n_text_ctx, k) for k in (64, 160, 256, n_text_ctx)})


def slots_for_memory(free_bytes: int, bytes_per_slot: int, fraction: float = 0.6, cap: int = 512) -> int:
    """How many slots fit in a fraction of free memory, rounded down to a multiple of 8."""
    fit = int(free_bytes * fraction) // max(1, bytes_per_slot)
    return max(1, min(cap, fit - fit % 8 if fit >= 8 else fit))


@dataclass(frozen=True)
class CapturePlan:
    buckets: tuple[int, ...]
    capture_seconds: float
    pool_bytes: int


class GraphRunner:
    """Holds one captured look per (bucket, attention length): `steps` decode steps of a SlotDecoder
    on CUDA, then its snapshot pack.

    Greedy graphs are captured up front; the sampling variant (which adds the per-row noise over
    the whole vocabulary to every step) only when a window first decodes at a temperature > 0.
    """

    def __init__(self, decoder: SlotDecoder, buckets: list[int], steps: int = 1):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; the CPU path steps eagerly")
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        self.decoder = decoder
        self.steps = steps
        self.buckets = sorted(buckets)
        self.kv_buckets = decoder.kv_buckets or [decoder.n_ctx]
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = None  # one memory pool shared by every graph (replays never overlap)
        self.plan: CapturePlan | None = None

    def capture(self, sample: bool = False) -> CapturePlan:
        dec = self.decoder
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(dec.device)
        # Collect garbage now: an earlier engine's pinned buffers and events, freed by the cycle
        # collector in the middle of a capture, invalidate it (seen on the H200 when a benchmark
        # built a second engine in the same process).
        gc.collect()
        dec.backend.prepare(self.buckets[-1])
        _warm_up(dec, self.buckets[-1], self.kv_buckets[-1], sample, steps=2, pack=True)
        torch.cuda.synchronize(dec.device)
        for bucket in reversed(self.buckets):
            dec.backend.prepare(bucket)  # e.g. FlashInfer's plan: host work, never inside a capture
            for kv_len in reversed(self.kv_buckets):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    for _ in range(self.steps):
                        dec._step(bucket, kv_len, sample)
                    dec.pack_snapshot(bucket)
                self.pool = graph.pool()
                self.graphs[bucket, kv_len, sample] = graph
        torch.cuda.synchronize(dec.device)
        seconds = time.perf_counter() - start
        previous = self.plan.capture_seconds if self.plan else 0.0
        self.plan = CapturePlan(tuple(self.buckets), previous + seconds,
                                torch.cuda.memory_reserved(dec.device) - before)  # fmt: skip
        log.info("captured %d %s decode graphs of %d steps (rows %s x kv %s) in %.2f s",
                 len(self.buckets) * len(self.kv_buckets), "sampling" if sample else "greedy", self.steps,
                 self.buckets, self.kv_buckets, seconds)  # fmt: skip
        return self.plan

    def bucket_for(self, n_rows: int) -> int:
        return self.buckets[bisect_left(self.buckets, n_rows)]

    def replay(self, n_rows: int, kv_len: int, sample: bool) -> None:
        key = (self.bucket_for(n_rows), kv_len, sample)
        if key not in self.graphs:
            self.capture(sample)
        self.graphs[key].replay()



def one_step_seconds(decoder: SlotDecoder, bucket: int, repeats: int = 5) -> float:
    """GPU seconds of one greedy step of `bucket` rows over the shortest attention length, from a
    throwaway one-step graph (what the engine needs before it knows how many steps to capture).
    Stepping free slots is harmless: their rows are inert. A backend that skips rows which are not
    running (the Triton cross kernel) computes them all here, as a full bucket does."""
    dec = decoder
    kv_len = (dec.kv_buckets or [dec.n_ctx])[0]
    live = getattr(dec.backend, "live_rows", None)
    if live is not None:
        dec.backend.live_rows = None
    try:
        dec.backend.prepare(bucket)
        _warm_up(dec, bucket, kv_len, False, steps=1, pack=False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            dec._step(bucket, kv_len, False)
        seconds = replay_seconds(graph, repeats)
        del graph
    finally:
        if live is not None:
            dec.backend.live_rows = live
    return seconds


def _warm_up(dec: SlotDecoder, bucket: int, kv_len: int, sample: bool, steps: int, pack: bool) -> None:
    """Run what is about to be captured once outside the capture (cuBLAS handles, lazy kernels), on
    a side stream as torch asks."""
    stream = torch.cuda.Stream(dec.device)
    stream.wait_stream(torch.cuda.current_stream(dec.device))
    with torch.cuda.stream(stream):
        for _ in range(steps):
            dec._step(bucket, kv_len, sample)
        if pack:
            dec.pack_snapshot(bucket)
    torch.cuda.current_stream(dec.device).wait_stream(stream)


def replay_seconds(graph: torch.cuda.CUDAGraph, repeats: int) -> float:
    """GPU seconds per replay of a captured graph, timed with CUDA events after one untimed replay
    (the first uploads the graph)."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


class EncoderGraphs:
    """One captured admission chunk per size in ENCODER_CHUNKS: log-mel features, the encoder and
    the cross K/V projection into the chunk's slots, over static inputs.

    Eagerly, one chunk is a few hundred kernel launches; on the H200 their host time was the largest
    host cost of W1 (docs/GPU_NOTES.md), because every op waits to reacquire the GIL from the decode
    workers. A replay copies the chunk's padded audio and slot ids into the static inputs and
    launches the whole chunk at once.
    """

    def __init__(self, decoder: SlotDecoder):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; the CPU path encodes eagerly")
        self.decoder = decoder
        self.sizes = decoder.chunk_sizes  # largest first
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.audio: dict[int, torch.Tensor] = {}  # size -> [g, N_SAMPLES] float32 static input
        self.slot_ids: dict[int, torch.Tensor] = {}  # size -> [g] long static input
        self.capture_seconds = 0.0

    def capture(self) -> None:
        """Capture every chunk size, largest first into one pool (replays never overlap).
        The decoder's `warm_up_encoder` must have run: it builds the cuFFT plans and cuDNN graphs."""
        dec = self.decoder
        start = time.perf_counter()
        gc.collect()  # see GraphRunner.capture
        pool = None
        for size in self.sizes:
            self.audio[size] = torch.zeros(size, N_SAMPLES, dtype=torch.float32, device=dec.device)
            self.slot_ids[size] = torch.zeros(size, dtype=torch.long, device=dec.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                dec.encode_chunk(self.audio[size], self.slot_ids[size])
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(dec.device)
        self.capture_seconds = time.perf_counter() - start
        log.info("captured %d encoder graphs (windows %s) in %.2f s", len(self.sizes), self.sizes, self.capture_seconds)

    def replay(self, audio: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """audio: [g, N_SAMPLES] float32 with g in ENCODER_CHUNKS; slot_ids: [g] long (device)."""
        size = audio.shape[0]
        self.audio[size].copy_(audio)
        self.slot_ids[size].copy_(slot_ids)
        self.graphs[size].replay()
