"""CUDA graphs over static buffers: a look's decode steps per row bucket, the admission encoder
per chunk size, and packed passes per length (the word-timestamp alignment pass per token bucket,
a batch-invariant engine's prompt prefill at its one shape). Only this module captures.

A look (step.Look) reads and writes only persistent tensors (the static caches and the slot state),
so capturing it once per bucket and replaying it is the whole trick: the engine picks the smallest
bucket that covers every occupied slot, and rows inside the bucket that are free or finished are
inert. One graph holds all the steps between two looks plus the snapshot pack: one launch per look
instead of dozens, each of which would wait to reacquire the GIL from the decode threads. Buckets
are captured largest first into one shared memory pool (as nano-vllm does), so smaller graphs reuse
the largest graph's scratch memory.

Captures use `capture_error_mode="thread_local"`: the sampling graphs are captured on first use,
mid-run, while other threads of the process (decode threads, a caller's) may still call CUDA.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from batchscribe.constants import N_SAMPLES
from batchscribe.engine.sizing import bucket_for

log = logging.getLogger(__name__)

WARM_UP_STEPS = 2


class LookLike(Protocol):
    """What StepGraphs captures (step.Look): `steps` decode steps, then the snapshot pack."""

    steps: int

    def __call__(self, n_rows: int, kv_len: int, sample: bool) -> None: ...

    def step(self, n_rows: int, kv_len: int, sample: bool) -> None: ...

    def pack(self, n_rows: int) -> None: ...

    def prepare(self, n_rows: int) -> None:
        """Host work for a bucket (the attention backend's plans and compiles), before a capture."""
        ...


@dataclass(frozen=True)
class CapturePlan:
    buckets: tuple[int, ...]
    capture_seconds: float
    pool_bytes: int


class StepGraphs:
    """One captured look per (row bucket, self-attention length bucket, sampling or not).

    Greedy graphs are captured up front; the sampling variant (which adds per-row noise over the
    whole vocabulary to every step) only when a window first decodes at a temperature above 0.
    """

    def __init__(self, look: LookLike, buckets: Sequence[int], kv_buckets: Sequence[int], device: torch.device):
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; the CPU path steps eagerly")
        self.look, self.device, self.steps = look, device, look.steps
        self.buckets, self.kv_buckets = sorted(buckets), sorted(kv_buckets)
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = None  # one memory pool shared by every graph (replays never overlap)
        self.plan: CapturePlan | None = None

    def capture(self, sample: bool = False) -> CapturePlan:
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(self.device)
        # Collect garbage now: an earlier engine's pinned buffers and events, freed by the cycle
        # collector in the middle of a capture, invalidate it.
        gc.collect()
        self.look.prepare(self.buckets[-1])
        warm_up(lambda: self._warm_up_steps(self.buckets[-1], self.kv_buckets[-1], sample), self.device)
        torch.cuda.synchronize(self.device)
        for bucket in reversed(self.buckets):
            self.look.prepare(bucket)  # e.g. FlashInfer's plan: host work, never inside a capture
            for kv_len in reversed(self.kv_buckets):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    self.look(bucket, kv_len, sample)
                self.pool = graph.pool()
                self.graphs[bucket, kv_len, sample] = graph
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        previous = self.plan.capture_seconds if self.plan else 0.0
        self.plan = CapturePlan(tuple(self.buckets), previous + seconds,
                                torch.cuda.memory_reserved(self.device) - before)  # fmt: skip
        log.info("captured %d %s decode graphs of %d steps (rows %s x kv %s) in %.2f s",
                 len(self.buckets) * len(self.kv_buckets), "sampling" if sample else "greedy", self.steps,
                 self.buckets, self.kv_buckets, seconds)  # fmt: skip
        return self.plan

    def _warm_up_steps(self, bucket: int, kv_len: int, sample: bool) -> None:
        # NOTE: these steps run for real. At build time every row is free (inert); a sampling
        # capture mid-run moves the running rows WARM_UP_STEPS steps early: the steps they would
        # take anyway, which replay() reports so the caller's position bounds count them.
        for _ in range(WARM_UP_STEPS):
            self.look.step(bucket, kv_len, sample)
        self.look.pack(bucket)

    def replay(self, n_rows: int, kv_len: int, sample: bool) -> int:
        """The look for rows [0, n_rows), padded to its bucket (NOTE: the graph packs `bucket` rows).
        Returns the steps every row of the largest bucket took beyond the look's: WARM_UP_STEPS when
        this variant had to be captured first, else 0."""
        key = (bucket_for(self.buckets, n_rows), kv_len, sample)
        extra = 0
        if key not in self.graphs:
            self.capture(sample)
            extra = WARM_UP_STEPS
        self.graphs[key].replay()
        return extra


class EncoderGraphs:
    """One captured admission chunk per size: `encode(audio, slot_ids)` over static inputs.

    Eagerly, one chunk is a few hundred kernel launches, each of which waits to reacquire the GIL
    from the decode workers. A replay copies the chunk's padded audio and slot ids into the static
    inputs and launches the whole chunk at once.
    """

    def __init__(self, encode: Callable[[torch.Tensor, torch.Tensor], None], sizes: Sequence[int],
                 device: torch.device):  # fmt: skip
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; the CPU path encodes eagerly")
        self.encode, self.sizes, self.device = encode, list(sizes), device  # sizes: largest first
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.audio: dict[int, torch.Tensor] = {}  # size -> [g, N_SAMPLES] float32 static input
        self.slot_ids: dict[int, torch.Tensor] = {}  # size -> [g] long static input
        self.capture_seconds = 0.0

    def capture(self) -> None:
        """Capture every size, largest first into one pool. The encoder must have run once at each
        size (WindowEncoder.warm_up): that builds the cuFFT plans and cuDNN graphs."""
        start = time.perf_counter()
        gc.collect()  # see StepGraphs.capture
        pool = None
        for size in self.sizes:
            self.audio[size] = torch.zeros(size, N_SAMPLES, dtype=torch.float32, device=self.device)
            self.slot_ids[size] = torch.zeros(size, dtype=torch.long, device=self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.encode(self.audio[size], self.slot_ids[size])
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        log.info("captured %d encoder graphs (windows %s) in %.2f s", len(self.sizes), self.sizes, self.capture_seconds)

    def replay(self, audio: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """audio: [g, N_SAMPLES] float32 with g one of the captured sizes; slot_ids: [g] long (device)."""
        size = audio.shape[0]
        self.audio[size].copy_(audio)
        self.slot_ids[size].copy_(slot_ids)
        self.graphs[size].replay()


def one_step_seconds(look: LookLike, bucket: int, kv_len: int, device: torch.device, repeats: int = 5) -> float:
    """GPU seconds of one greedy step of `bucket` rows, from a throwaway one-step graph (what the
    engine needs before it knows how many steps to capture)."""
    look.prepare(bucket)
    warm_up(lambda: look.step(bucket, kv_len, False), device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        look.step(bucket, kv_len, False)
    return replay_seconds(graph, repeats)


def warm_up(fn: Callable[[], None], device: torch.device) -> None:
    """Run what is about to be captured once outside the capture (cuBLAS handles, lazy kernels,
    Triton compilation), on a side stream as torch asks."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)


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


class PassGraphs:
    """A pass over one packed input row per window (the alignment pass: engine/alignment.py; the
    batch-invariant prompt prefill: engine/prefill.py), captured per row length, over one static
    input each, into one memory pool (replays never overlap). `forward(packed [B, fields + L] long
    on the device, size)` only queues work; `what` names the pass in the log.

    NOTE: a length's static input and outputs are rewritten by its next replay. The caller queues
    its copies of the outputs right behind each replay, so stream order keeps them ahead of it.
    The capture's warm-up runs `forward` once on the real input: a pass that writes (the prefill)
    must write the same thing when run twice."""

    def __init__(self, forward: Callable, device: torch.device, fields: int, what: str = "the alignment pass"):
        self.forward, self.device, self.fields, self.what = forward, device, fields, what
        self.captured: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, tuple]] = {}
        self.pool = None

    def run(self, packed: torch.Tensor, size: tuple[int, int] | None = None):
        """The pass over `packed` ([B, fields + L] long: on the host, pinned, the batch's own buffer
        kept by the caller until the copy has run; or on the device) by replay, capturing its length
        first; only queues work after the first capture. Returns the static outputs."""
        length = packed.shape[1]
        if length not in self.captured:
            self._capture(packed.to(self.device), size)
        graph, static, out = self.captured[length]
        static.copy_(packed, non_blocking=True)  # behind the previous replay of this length, which read it
        graph.replay()
        return out

    def _capture(self, static: torch.Tensor, size: tuple[int, int] | None) -> None:
        warm_up(lambda: self.forward(static, size), self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self.forward(static, size)
        self.pool = graph.pool()
        self.captured[static.shape[1]] = (graph, static, out)
        log.info("captured %s for %d rows of %d tokens", self.what, static.shape[0], static.shape[1] - self.fields)

    def clear(self) -> None:
        self.captured.clear()
        self.pool = None
