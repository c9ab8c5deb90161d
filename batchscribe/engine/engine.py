"""The device side of decoding: a fixed pool of slots, the static cache, the attention backend, the
decode step and, on CUDA, its graphs.

The engine only queues work: admissions stage audio and encode it into free slots, `advance` runs a
look (a few steps, then a snapshot of the slots) by graph replay or eagerly, and finished windows are
read from snapshots later. What to admit and when to look is the scheduler's business.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from batchscribe.attention.registry import build_backend
from batchscribe.engine.alignment import Aligner, AlignWindow, PendingAlignment
from batchscribe.engine.cpu_numerics import REPRODUCIBLE, threads_agree
from batchscribe.engine.encoder import WindowEncoder
from batchscribe.engine.graphs import EncoderGraphs, PassGraphs, StepGraphs, one_step_seconds
from batchscribe.engine.pinned import PinnedArena, to_device_async
from batchscribe.engine.prefill import prefill_groups, prefill_packed, prefill_prompts
from batchscribe.engine.requests import FinishedWindow, WindowRequest
from batchscribe.engine.setup import EngineConfig
from batchscribe.engine.sizing import MAX_STEPS_PER_CHECK, bucket_for, default_buckets, steps_per_check
from batchscribe.engine.slots import Slots
from batchscribe.engine.snapshots import Snapshot, SnapshotQueue
from batchscribe.engine.staging import Stager
from batchscribe.engine.step import Look, StepRules, StepSpec
from batchscribe.model.cache import DecoderCache
from batchscribe.model.whisper import Whisper

log = logging.getLogger(__name__)


class Engine:
    """Slots on one device for one model and one set of step rules (config.n_slots of them)."""

    def __init__(self, model: Whisper, spec: StepSpec, config: EngineConfig,
                 alignment_heads: Sequence[tuple[int, int]] | None = None):  # fmt: skip
        if config.n_slots is None:
            raise ValueError("config.n_slots is unset: size it first (EngineConfig.with_slots)")
        dims, device, n_slots = model.dims, config.device, config.n_slots
        model.prepare_decoder()  # the step's fused projection and padded logits, before anything captures
        self.model, self.spec, self.config, self.device = model, spec, config, device
        self.n_slots, self.n_ctx = n_slots, dims.n_text_ctx
        dtype = next(model.parameters()).dtype
        plan = config.attention
        self.cache = DecoderCache.allocate(dims, n_slots, device, dtype, plan.cross_dtype, plan.cross_hnd)
        self.backend = build_backend(plan, self.cache, dtype)
        self.slots = Slots(n_slots, self.n_ctx, device)
        if config.skip_inert_rows:  # e.g. the Triton kernels skip rows that are not running
            self.backend.set_live_rows(self.slots.state.running)
        self.timings: defaultdict[str, float] = defaultdict(float)  # host seconds of admission parts
        self.staging = Stager(n_slots, self.n_ctx, device, self.timings)
        self.snapshots = SnapshotQueue(self.slots)
        self.encoder = WindowEncoder(model, self.cache, n_slots, config.encoder, plan.encoder_kernel,
                                     config.batch_invariant)  # fmt: skip
        self.rules = StepRules(spec, device, config.fused_greedy)
        # Word timestamps: the alignment pass reads the finished windows' cross K/V in their slots.
        self.aligner = None if alignment_heads is None else Aligner(
            model, self.cache, alignment_heads, spec.rules.eot, spec.rules.no_timestamps,
            max_batch=1 if config.batch_invariant and device.type != "cuda" else None,
            graphs=config.cuda_graphs, timings=self.timings)  # fmt: skip
        self.kv_buckets = sorted(config.kv_buckets)
        # Row counts a step runs at on CUDA, eager or replayed: the graphs' buckets, so that graphs on
        # or off compute alike (cuBLAS and SDPA may sum a row in another order at another batch size)
        self.buckets = [n_slots] if config.batch_invariant else default_buckets(n_slots)
        # Batch-invariant on the CPU without MKL's reproducible mode: steps on the math attention
        # (engine/cpu_numerics.py)
        self.math_steps = config.batch_invariant and device.type == "cpu" and not threads_agree()
        if self.math_steps:
            log.warning("--batch-invariant on the CPU: MKL ran before MKL_CBWR could be set in this process, so "
                        "the decode steps use torch's math attention (slower) to stay invariant; set "
                        "MKL_CBWR=%s in the environment before Python starts for the fast path", REPRODUCIBLE)
        # Steps per look: on CUDA sized from a measured step once graphs are captured.
        self.steps_per_look = MAX_STEPS_PER_CHECK if device.type == "cuda" else 1
        self.look = self._look(self.steps_per_look)
        self.graphs: StepGraphs | None = None
        self.encoder_graphs: EncoderGraphs | None = None
        self.prefill_graphs: PassGraphs | None = None  # batch-invariant: its one prefill shape, on first use
        if device.type == "cuda":
            self.encoder.warm_up()
            if self.aligner is not None:
                self.aligner.warm_up()
            if config.cuda_graphs:
                self._capture()

    def _look(self, steps: int) -> Look:
        return Look(self.slots.state, self.model, self.cache, self.backend, self.rules, self.snapshots.pack, steps)

    def _capture(self) -> None:
        """Time one step, choose the steps per look from it, capture the looks and the encoder."""
        kv_len = (self.kv_buckets or [self.n_ctx])[0]
        # Inert rows count as live while timing: a full bucket's step computes them all.
        self.backend.set_live_rows(None)
        step = one_step_seconds(self.look, self.n_slots, kv_len, self.device)
        if self.config.skip_inert_rows:
            self.backend.set_live_rows(self.slots.state.running)
        self.steps_per_look = steps_per_check(step)
        log.info("a %d-row step takes %.2f ms on the GPU: looking at finished rows every %d steps",
                 self.n_slots, step * 1e3, self.steps_per_look)  # fmt: skip
        self.look = self._look(self.steps_per_look)
        self.graphs = StepGraphs(self.look, self.buckets, self.kv_buckets or [self.n_ctx], self.device)
        self.graphs.capture(sample=False)
        self.encoder_graphs = EncoderGraphs(self.encoder, self.encoder.chunk_sizes, self.device)
        self.encoder_graphs.capture()
        if self.config.batch_invariant:  # a partial, not a bound method: graphs must not refer to the engine
            prefill = partial(prefill_packed, self.model, self.cache)
            self.prefill_graphs = PassGraphs(prefill, self.device, 1, "the prompt prefill")

    # -- admission -----------------------------------------------------------------------------

    def enable_arena(self, n_samples: int | None = None, arena: PinnedArena | None = None) -> PinnedArena | None:
        """Pinned memory for decode threads to decode into (CUDA; None on the CPU): `arena`, else
        the process's shared one (Stager.enable_arena)."""
        return self.staging.enable_arena(n_samples, arena)

    @property
    def arena(self) -> PinnedArena | None:
        return self.staging.arena

    @torch.no_grad()
    def admit(self, requests: Sequence[WindowRequest], slots: Sequence[int]) -> None:
        """Encode a group of windows together and set up their slots (free ones); only queues work."""
        if self.aligner is not None:
            self.aligner.fence()  # a slot refilled here may be one a queued pass still reads
        t0 = time.perf_counter()
        staged = self.staging.stage(requests, slots)
        t1 = time.perf_counter()
        encode = self.encoder_graphs.replay if self.encoder_graphs is not None else self.encoder
        for part, pad in self.encoder.chunks(len(requests)):
            audio, slot_ids = staged.audio[part], staged.slot_ids[part]  # [g, N_SAMPLES], [g]
            if pad:  # batch-invariant: the one chunk size, filled with the last window (same slot, same K/V)
                audio = torch.cat([audio, audio[-1:].expand(pad, -1)])
                slot_ids = torch.cat([slot_ids, slot_ids[-1:].expand(pad)])
            encode(audio, slot_ids)
        t2 = time.perf_counter()
        self.slots.state.set_up(staged.slot_ids, staged.prompts, staged.begin, staged.floats, staged.noise_key,
                                staged.detect, self.spec.sample_len, staged.sot)  # fmt: skip
        prompted = [i for i, r in enumerate(requests) if r.sot_index > 0]  # host-known: no device read
        sots = [requests[i].sot_index for i in prompted]
        cuda, invariant = self.device.type == "cuda", self.config.batch_invariant
        for group, length in prefill_groups(prompted, sots, self.n_ctx, cuda, invariant):
            rows = to_device_async(torch.tensor(group), self.device)  # no stream sync: looks stay queued
            tokens, slot_ids = staged.prompts[rows, :length], staged.slot_ids[rows]  # [G, length], [G]
            if self.prefill_graphs is not None:
                self.prefill_graphs.run(torch.cat([slot_ids[:, None], tokens], 1))
            else:
                prefill_prompts(self.model, self.cache, tokens, slot_ids)
        self.timings["admit_stage"] += t1 - t0
        self.timings["admit_encode"] += t2 - t1
        self.timings["admit_setup"] += time.perf_counter() - t2
        self.slots.claim([r.key for r in requests], [r.temperature for r in requests], slots,
                         [r.sot_index for r in requests])

    def reset(self) -> None:
        """Forget every window a stream given up on left (its consumer stopped early): the queued
        snapshots (waited for, so their buffers can be reused), the occupied and held slots, their
        rows' running flags (so they step as inert rows) and the staged samples. Nothing to do after
        a stream that ran to its end."""
        slots = self.slots
        if not (self.snapshots.pending or slots.occupied.any() or slots.held.any()):
            return
        while self.snapshots.pending:
            self.snapshots.spare.append(self.snapshots.wait())
        slots.clear()
        if self.aligner is not None:
            self.aligner.fence()  # a pass still queued on its side stream reads the slots
        self.staging.release()

    def release_staging(self) -> None:
        """Let go of the pinned samples the last admissions were copied from; only once a later
        snapshot has been waited for."""
        self.staging.release()

    # -- looks ---------------------------------------------------------------------------------

    @torch.no_grad()
    def advance(self, n_rows: int, steps: int) -> None:
        """`steps` decode steps for rows [0, n_rows), then queue a snapshot: on CUDA, when the
        graphs hold `steps` steps, one replay (steps and snapshot pack), one copy, one event."""
        # Attend only up to the longest row after the last step (the host mirror bounds every
        # position), rounded up to a captured length on CUDA so eager and graph steps compute alike.
        kv_len = self.slots.kv_bound(n_rows, steps)
        if self.kv_buckets:
            kv_len = bucket_for(self.kv_buckets, kv_len)
        sample = self.slots.sampling(n_rows)
        packed = self.graphs is not None and self.graphs.steps == steps
        if packed:
            extra = self.graphs.replay(n_rows, kv_len, sample)
            if extra:  # a capture's warm-up stepped every occupied row for real
                self.slots.stepped(self.n_slots, extra)
        else:
            width = self.step_width(n_rows)
            with sdpa_kernel(SDPBackend.MATH) if self.math_steps else nullcontext():
                for _ in range(steps):
                    self.look.step(width, kv_len, sample)
        self.slots.stepped(n_rows, steps)
        self.snapshots.queue(self.slots.rows_in_use(), self.slots.generation, packed)

    def step_width(self, n_rows: int) -> int:
        """The rows a step over rows [0, n_rows) computes: on CUDA, and when batch-invariant (one
        bucket: all the slots), the bucket a graph would replay; on the CPU otherwise n_rows, as a
        CPU step's cost follows its rows. Rows past n_rows are free: their results are never read."""
        if self.device.type != "cuda" and not self.config.batch_invariant:
            return n_rows
        return bucket_for(self.buckets, n_rows)

    def compact(self) -> int:
        """Move the tail's running windows into the rows finished ones left (Slots.compact, the K/V
        cache with them); returns the rows now in use."""
        if self.aligner is not None:
            self.aligner.fence()
        return self.slots.compact(self.cache.tensors())

    def hold_for_alignment(self, slots: Sequence[int]) -> None:
        """Keep collected windows' slots out of admission until their alignment pass is queued
        (submit_alignment frees them again); nothing may compact meanwhile."""
        self.slots.held[list(slots)] = True

    def submit_alignment(self, windows: Sequence[AlignWindow]) -> PendingAlignment:
        """Queue the alignment pass over finished windows. Call it before any admission or
        compaction is queued after the snapshot they were read from, or hold their slots until
        then: an admission may refill a slot, and only stream order keeps the pass's reads of its
        cross K/V ahead of it. Their slots are free afterwards."""
        if self.aligner is None:
            raise AssertionError("submit_alignment() on an engine built without alignment heads")
        pending = self.aligner.submit(windows)
        self.slots.held[[w.slot for w in windows]] = False  # what refills them is queued behind the pass
        return pending

    def pending_snapshots(self) -> int:
        return len(self.snapshots.pending)

    def wait_snapshot(self) -> Snapshot:
        return self.snapshots.wait()

    def finished(self, snap: Snapshot) -> list[FinishedWindow]:
        """The windows finished in `snap`; their slots become free."""
        return self.snapshots.finished(snap, self.slots)


def build_engine(model: Whisper, spec: StepSpec, config: EngineConfig,
                 alignment_heads: Sequence[tuple[int, int]] | None = None) -> Engine:  # fmt: skip
    """An Engine with config.n_slots slots or, out of memory, the most of n/2, n/4, ... that fit."""
    n_slots = config.n_slots
    while True:
        try:
            return Engine(model, spec, replace(config, n_slots=n_slots), alignment_heads)
        except torch.OutOfMemoryError:
            if n_slots == 1:
                raise
            log.warning("out of GPU memory with %d decoder slots; retrying with %d", n_slots, n_slots // 2)
        # Out of the except block, so its traceback no longer holds the failed attempt's caches.
        if config.on_cuda:
            torch.cuda.empty_cache()
        n_slots //= 2
