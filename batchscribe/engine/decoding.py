"""Slot decoder: 30 s windows decoded in a fixed pool of slots, one token per slot per step.

Each slot holds one window: its cross-attention K/V (written once at admission), its token buffer
(forced prompt, then sampled tokens), its position, and the per-row state the logit rules need. A step
feeds every row in [0, n_rows) the token at its position; forced prompt tokens, language detection,
the OpenAI logit rules, sampling, log-prob sums and end-of-text flags are all tensor operations, so
the same step runs eagerly on the CPU and, in the GPU engine, inside a CUDA graph. Rows that are
free or finished are inert: they neither move nor change their results.

The host never stops the device to look at it. Admission packs a group's audio and per-slot state
into one of two alternating host buffers (pinned on CUDA) and sends each with one asynchronous
copy; padding and the slot set-up are a few vectorised device ops. Collection works on snapshots:
`advance()` runs a few steps and queues a copy of the state the host reads (packed into one int32
table on the device, inside the same CUDA graph as the steps) into a host buffer, with an event;
`finished(wait_snapshot())` later turns that copy's finished rows into results. A slot freed and
re-admitted after a snapshot was queued is not read from it (per-slot admission generations).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from batchscribe.audio.features import LogMel
from batchscribe.constants import N_SAMPLES
from batchscribe.engine import triton_select
from batchscribe.engine.kernels import AttentionKinds
from batchscribe.engine.logits import LogitRules, RuleSpec, select_tokens
from batchscribe.engine.pinned import PinnedArena, default_arena_samples
from batchscribe.model.whisper import DecoderCache, Whisper

LANGUAGE_POSITION = 1  # <|startoftranscript|> <|xx|> <|task|> ...: the language token's index

# Columns of an admission pack (int64, one row per admitted window); the prompt row follows them.
_A_SLOT, _A_LENGTH, _A_SHIFT, _A_BEGIN, _A_DETECT, _A_NOISE, _A_PROMPT = range(7)
# Columns of a snapshot (int32, one row per slot; the two float32 columns are stored bit for bit),
# then the slot's token buffer: one table, so one copy to the host per look.
_S_RUNNING, _S_HIT_EOT, _S_POSITION, _S_BEGIN, _S_LOGPROB, _S_NO_SPEECH, _S_TOKENS = range(7)


@dataclass(frozen=True)
class WindowRequest:
    """One window to decode: up to 30 s of 16 kHz audio and how to decode it."""

    key: int  # the caller's handle for this window
    audio: np.ndarray  # [n <= N_SAMPLES] float32
    prompt: tuple[int, ...]  # forced prefix; a language placeholder sits at LANGUAGE_POSITION if detecting
    detect_language: bool
    temperature: float
    noise_key: int = 0  # sampling key: the same key samples the same tokens in any slot or batch


@dataclass(frozen=True)
class WindowResult:
    key: int
    tokens: list[int]  # sampled tokens, end-of-text removed
    sum_logprob: float
    no_speech_prob: float
    language_token: int | None  # the token at LANGUAGE_POSITION (detected or forced), if any
    temperature: float
    hit_eot: bool


@dataclass(frozen=True)
class DecoderSpec:
    """Static facts the decoder needs; built once from the tokenizer and options."""

    rules: RuleSpec
    no_speech: int
    language_tokens: tuple[int, ...]  # candidates for language detection
    sample_len: int


# Admission groups are encoded in chunks of these sizes (the binary decomposition of the group): a
# group of any size then reuses a handful of shapes, so cuFFT plans and cuDNN graphs are built once,
# and on CUDA each size is one captured graph (EncoderGraphs).
ENCODER_CHUNKS = (64, 32, 16, 8, 4, 2, 1)


def encoder_chunks(n: int) -> list[slice]:
    """[0, n) cut into consecutive slices whose sizes are ENCODER_CHUNKS, largest first."""
    parts, start = [], 0
    for size in ENCODER_CHUNKS:
        while n - start >= size:
            parts.append(slice(start, start + size))
            start += size
    return parts


@dataclass
class _Staging:
    """One of two alternating host buffers for admissions (pinned on CUDA)."""

    audio: torch.Tensor  # [n_slots * N_SAMPLES] float32: the group's real samples, concatenated
    ints: torch.Tensor  # [n_slots, _A_PROMPT + n_text_ctx] int64: _A_* columns, then the prompt row
    floats: torch.Tensor  # [n_slots] float32: temperature
    copied: torch.cuda.Event | None  # recorded after the last copy out of these buffers (CUDA)
    holds: list[np.ndarray] = field(default_factory=list)  # pinned samples being copied from (CUDA)


@dataclass(frozen=True)
class _Staged:
    """An admission group on the device, made from one _Staging."""

    audio: torch.Tensor  # [G, N_SAMPLES] float32, zero-padded
    ints: torch.Tensor  # [G, _A_PROMPT + n_text_ctx] int64
    floats: torch.Tensor  # [G] float32


@dataclass
class Snapshot:
    """A copy of the per-slot state the host reads, taken after some steps (host buffer)."""

    ints: torch.Tensor  # [n_slots, _S_TOKENS + n_text_ctx] int32: _S_* columns, then the tokens
    ready: torch.cuda.Event | None  # recorded after the copy (CUDA); None on the CPU: copied at once
    n_rows: int = 0  # rows [0, n_rows) were copied: every slot occupied when it was taken
    generation: np.ndarray | None = None  # [n_slots] each slot's admission count when it was taken


class SlotDecoder:
    """Owns the model, the static cache and all per-slot state tensors on one device."""

    def __init__(
        self,
        model: Whisper,
        spec: DecoderSpec,
        n_slots: int,
        device: torch.device,
        kv_buckets: Sequence[int] = (),  # self-attention lengths steps may use; () = exact
        attention: AttentionKinds = AttentionKinds(),
    ):
        dims = model.dims
        self.model, self.spec, self.device = model, spec, device
        self.n_slots, self.n_ctx = n_slots, dims.n_text_ctx
        self.kv_buckets = sorted(kv_buckets)
        dtype = next(model.parameters()).dtype
        self.dtype = dtype
        self.attention = attention
        self.cache = DecoderCache.allocate(dims, n_slots, device, dtype, attention.cross_dtype, attention.cross_hnd)
        self.backend = attention.backend(self.cache, dtype)
        self.features = LogMel(dims.n_mels, device=device)
        self.rules = LogitRules(spec.rules, device)
        # On CUDA, greedy steps' rules and choice in one kernel (sampled steps keep the tensor path).
        fused = device.type == "cuda" and triton_select.triton_available()
        self.greedy = triton_select.GreedySelect(spec.rules, spec.no_speech, device) if fused else None
        self.language_ids = torch.tensor(spec.language_tokens or [0], device=device)
        self.chunk_sizes = [g for g in ENCODER_CHUNKS if g <= n_slots]  # what an admission can use
        self.runner = None  # a GraphRunner, set by the engine on CUDA
        self.encoder_runner = None  # an EncoderGraphs, set by the engine on CUDA
        # Host buffers, allocated once (pinned allocations are slow): two for admissions, so an
        # admission waits only for the copy of the admission before last; snapshots on demand.
        self._pinned = device.type == "cuda"
        self.arena: PinnedArena | None = None  # see enable_arena
        self._staging = [self._new_staging() for _ in range(2)]
        self._staging_turn = 0
        self._pending: deque[Snapshot] = deque()  # queued snapshots, oldest first
        self._spare: list[Snapshot] = []  # processed snapshots whose buffers can be reused
        # Snapshots are packed here first (on CUDA, inside the step graphs), then copied out whole.
        self._pack = torch.zeros(n_slots, _S_TOKENS + self.n_ctx, dtype=torch.int32, device=device)

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.tokens = zeros(n_slots, self.n_ctx)  # [S, n_text_ctx]
        self.positions = zeros(n_slots)  # [S] position of the token fed next
        self.sample_begin = zeros(n_slots)  # [S]
        self.sample_end = zeros(n_slots)  # [S] last position a sampled token may take
        self.last_timestamp = zeros(n_slots)  # [S] -1: none sampled yet
        self.sum_logprob = zeros(n_slots, dtype=torch.float32)
        self.no_speech_prob = zeros(n_slots, dtype=torch.float32)
        self.temperature = zeros(n_slots, dtype=torch.float32)
        self.noise_key = zeros(n_slots)  # [S] per-window sampling key (logits.uniform_noise)
        self.detect = zeros(n_slots, dtype=torch.bool)
        self.running = zeros(n_slots, dtype=torch.bool)  # admitted and not finished
        if hasattr(self.backend, "live_rows"):  # e.g. the Triton cross kernel skips inert rows' reads
            self.backend.live_rows = self.running
        self.hit_eot = zeros(n_slots, dtype=torch.bool)
        # Host mirror: which window each slot holds and its position (positions advance by exactly
        # one per step while running, so the host can bound attention lengths without a sync).
        self.keys: list[int | None] = [None] * n_slots
        self.occupied = np.zeros(n_slots, dtype=bool)  # [S] keys[s] is not None
        self.temperatures = np.zeros(n_slots, dtype=np.float64)  # [S] 0 for free slots
        self.host_positions = np.zeros(n_slots, dtype=np.int64)
        self.generation = np.zeros(n_slots, dtype=np.int64)  # admissions per slot: stale-snapshot guard
        self.timings: defaultdict[str, float] = defaultdict(float)  # host seconds of admission parts

    # -- admission -----------------------------------------------------------------------------

    @torch.no_grad()
    def warm_up_encoder(self) -> None:
        """Run the features and encoder once at every chunk size an admission can use, so cuFFT
        plans and cuDNN convolution/attention graphs are built here, not mid-run (and before
        EncoderGraphs captures them). The cross K/V go to slot 0, which is free."""
        for size in self.chunk_sizes:
            audio = torch.zeros(size, N_SAMPLES, device=self.device)
            self.encode_chunk(audio, torch.zeros(size, dtype=torch.long, device=self.device))

    def enable_arena(self, n_samples: int | None = None) -> PinnedArena | None:
        """Pinned memory for decode threads to decode into (CUDA; None on the CPU), made once."""
        if self._pinned and self.arena is None:
            self.arena = PinnedArena(n_samples or default_arena_samples())
        return self.arena

    def free_slots(self) -> list[int]:
        return np.flatnonzero(~self.occupied).tolist()

    @torch.no_grad()
    def admit(self, requests: list[WindowRequest], slots: list[int]) -> None:
        """Encode a group of windows together and set up their slots; every call only queues work."""
        clock, t0 = self.timings, time.perf_counter()  # host seconds per part (benchmarks read them)
        staged = self._stage(requests, slots)
        slot_ids = staged.ints[:, _A_SLOT]  # [G] on the device
        t1 = time.perf_counter()
        for part in encoder_chunks(len(requests)):
            if self.encoder_runner is not None:
                self.encoder_runner.replay(staged.audio[part], slot_ids[part])
            else:
                self.encode_chunk(staged.audio[part], slot_ids[part])
        t2 = time.perf_counter()
        self._set_up_slots(slot_ids, staged.ints, staged.floats)
        clock["admit_stage"] += t1 - t0
        clock["admit_encode"] += t2 - t1
        clock["admit_setup"] += time.perf_counter() - t2
        self._claim(requests, slots)

    @torch.no_grad()
    def encode_chunk(self, audio: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """Features, encoder and cross K/V for one chunk of windows, written into their slots.

        audio: [g, N_SAMPLES] float32, zero-padded; slot_ids: [g] long. Pure tensor code: on CUDA
        it is captured once per chunk size (EncoderGraphs) and replayed.
        """
        mel = self.features(audio)  # [g, n_mels, 3000]
        enc = self.model.encoder(mel.to(self.dtype))  # [g, n_audio_ctx, n_state]
        self.model.write_cross_kv(self.cache, enc, slot_ids)

    def _claim(self, requests: list[WindowRequest], slots: list[int]) -> None:
        """The host mirror changes last: an out-of-memory error before it leaves the slots free."""
        for req, slot in zip(requests, slots):
            self.keys[slot] = req.key
            self.temperatures[slot] = req.temperature
        self.occupied[slots] = True
        self.host_positions[slots] = 0
        self.generation[slots] += 1

    def _new_staging(self) -> _Staging:
        pin = self._pinned
        return _Staging(
            audio=torch.empty(self.n_slots * N_SAMPLES, dtype=torch.float32, pin_memory=pin),
            ints=torch.zeros(self.n_slots, _A_PROMPT + self.n_ctx, dtype=torch.long, pin_memory=pin),
            floats=torch.zeros(self.n_slots, dtype=torch.float32, pin_memory=pin),
            copied=torch.cuda.Event() if pin else None,
        )

    def release_staging(self) -> None:
        """Let go of the pinned samples the last admissions were copied from (returning their arena
        ranges). Only once the device has done those copies: the caller has waited for a later
        snapshot."""
        for buf in self._staging:
            buf.holds = []

    def _stage(self, requests: list[WindowRequest], slots: list[int]) -> _Staged:
        """Pack the group on the host, send each buffer with one copy, pad the audio on the device.

        Only the real samples cross to the device; zero padding is made there. Samples in the pinned
        arena are copied by DMA as they are, not packed.
        """
        buf = self._staging[self._staging_turn]
        self._staging_turn ^= 1
        if buf.copied is not None:
            t0 = time.perf_counter()
            buf.copied.synchronize()  # NOTE: the copy out of this buffer two admissions ago must be done
            buf.holds = []  # and so are the copies from pinned samples it kept alive
            self.timings["admit_stage_wait"] += time.perf_counter() - t0  # part of admit_stage
        g = len(requests)
        lengths = np.array([min(len(r.audio), N_SAMPLES) for r in requests], dtype=np.int64)  # [G]
        offsets = np.cumsum(lengths) - lengths  # [G] where each window starts in the flat samples
        total = int(lengths.sum())
        ints = buf.ints[:g].numpy()  # [G, _A_PROMPT + n_ctx], a view of the (pinned) host buffer
        ints[:, _A_SLOT] = slots
        ints[:, _A_LENGTH] = lengths
        # Sample j of window i lands at i * N_SAMPLES + (j - offsets[i]) of the padded batch.
        ints[:, _A_SHIFT] = np.arange(g) * N_SAMPLES - offsets
        ints[:, _A_BEGIN] = [len(r.prompt) for r in requests]
        ints[:, _A_DETECT] = [r.detect_language for r in requests]
        ints[:, _A_NOISE] = [r.noise_key for r in requests]
        ints[:, _A_PROMPT:] = 0
        for i, req in enumerate(requests):
            ints[i, _A_PROMPT : _A_PROMPT + len(req.prompt)] = req.prompt
        buf.floats[:g].numpy()[:] = [r.temperature for r in requests]
        # (samples [n] float32, where they start in the flat group, in the pinned arena?) per window
        parts = [(r.audio[:n], start, self.arena is not None and self.arena.holds(r.audio))
                 for r, n, start in zip(requests, lengths.tolist(), offsets.tolist())]  # fmt: skip
        picked = [(a, start) for a, start, pinned in parts if pinned]  # go to the device as they are
        packed = bool(total) and len(picked) < g
        if packed and not picked:
            np.concatenate([a for a, _, _ in parts], out=buf.audio[:total].numpy())
        elif packed:
            host = buf.audio.numpy()
            for a, start, pinned in parts:
                if not pinned:
                    host[start : start + len(a)] = a
        # copy=True: on the CPU too, the staged group must not alias a buffer that is reused.
        ints_d = buf.ints[:g].to(self.device, non_blocking=True, copy=True)  # [G, _A_PROMPT + n_ctx]
        floats_d = buf.floats[:g].to(self.device, non_blocking=True, copy=True)  # [G]
        if packed:
            flat = buf.audio[:total].to(self.device, non_blocking=True)  # [total], consumed below
        else:
            flat = torch.empty(total, dtype=torch.float32, device=self.device)  # [total]
        if picked:
            # One call for the group's DMA copies (later in stream order than the packed copy, so
            # they overwrite its unused ranges); the arrays stay alive until `copied` is done.
            torch._foreach_copy_([flat[start : start + len(a)] for a, start in picked],
                                 [torch.from_numpy(a) for a, _ in picked], non_blocking=True)  # fmt: skip
            buf.holds = [a for a, _ in picked]
        if buf.copied is not None:
            buf.copied.record()
        audio = torch.zeros(g, N_SAMPLES, dtype=torch.float32, device=self.device)  # [G, N_SAMPLES]
        if total:
            # output_size keeps repeat_interleave from reading the total back from the device.
            shift = torch.repeat_interleave(ints_d[:, _A_SHIFT], ints_d[:, _A_LENGTH], output_size=total)
            dest = torch.arange(total, device=self.device) + shift  # [total]
            audio.view(-1).index_copy_(0, dest, flat)
        return _Staged(audio, ints_d, floats_d)

    def _set_up_slots(self, slot_ids: torch.Tensor, ints: torch.Tensor, floats: torch.Tensor) -> None:
        """Scatter a staged group's state into its slots: one device op per state tensor."""
        begin = ints[:, _A_BEGIN]  # [G]
        self.tokens.index_copy_(0, slot_ids, ints[:, _A_PROMPT:])
        self.positions.index_fill_(0, slot_ids, 0)
        self.sample_begin.index_copy_(0, slot_ids, begin)
        self.sample_end.index_copy_(0, slot_ids, torch.clamp(begin + self.spec.sample_len, max=self.n_ctx) - 1)
        self.last_timestamp.index_fill_(0, slot_ids, -1)
        self.sum_logprob.index_fill_(0, slot_ids, 0.0)
        self.no_speech_prob.index_fill_(0, slot_ids, 0.0)
        self.temperature.index_copy_(0, slot_ids, floats)
        self.noise_key.index_copy_(0, slot_ids, ints[:, _A_NOISE])
        self.detect.index_copy_(0, slot_ids, ints[:, _A_DETECT] != 0)
        self.running.index_fill_(0, slot_ids, True)
        self.hit_eot.index_fill_(0, slot_ids, False)

    # -- the step ------------------------------------------------------------------------------

    def rows_in_use(self) -> int:
        """Rows [0, n) cover every occupied slot; the CPU path steps only those."""
        used = np.flatnonzero(self.occupied)
        return int(used[-1]) + 1 if used.size else 0

    def slots_in_use(self) -> int:
        return int(np.count_nonzero(self.occupied))

    @torch.no_grad()
    def compact(self) -> int:
        """Move the windows in rows at or past the number of occupied slots into the free rows
        below it, so that steps cover only that many rows; returns rows_in_use() after it.

        For the tail of a run, when no admission will fill the holes that finished windows leave:
        W1's last ~0.1 s stepped a 256-row bucket for a few dozen rows. Every per-slot tensor (state
        and K/V cache) moves with its row: a window decodes the same in any slot (the sampling noise
        is keyed by window, not slot). Only queues device copies. Snapshots queued before the move
        describe the old rows, so both ends of every move count as re-admitted (`generation`) and
        those snapshots skip them; later snapshots read the moved windows, finished ones included
        (a finished row is inert: a late look reads what an early one would).
        """
        used = np.flatnonzero(self.occupied)
        n = used.size
        src = used[used >= n]  # [m] rows to move
        if not src.size:
            return n
        dst = np.flatnonzero(~self.occupied[:n])  # [m]: as many holes below n as rows past it
        src_d, dst_d = (self._to_device(torch.from_numpy(rows)) for rows in (src, dst))
        cache = self.cache
        for t in (*self._slot_tensors(), *cache.self_k, *cache.self_v, *cache.cross_k, *cache.cross_v):
            if t.dtype.itemsize == 1 and t.is_floating_point():
                t = t.view(torch.uint8)  # fp8 K/V: moved as bytes (index_copy_ has no fp8 kernels)
            t.index_copy_(0, dst_d, t.index_select(0, src_d))
        self.running.index_fill_(0, src_d, False)  # the rows left behind are free: inert
        for mirror in (self.occupied, self.temperatures, self.host_positions):
            mirror[dst] = mirror[src]
        self.occupied[src], self.temperatures[src], self.host_positions[src] = False, 0.0, 0
        for a, b in zip(src.tolist(), dst.tolist()):
            self.keys[b], self.keys[a] = self.keys[a], None
        self.generation[src] += 1
        self.generation[dst] += 1
        return n

    def _slot_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every per-slot state tensor ([n_slots, ...]) besides the K/V cache."""
        return (self.tokens, self.positions, self.sample_begin, self.sample_end, self.last_timestamp,
                self.sum_logprob, self.no_speech_prob, self.temperature, self.noise_key, self.detect,
                self.running, self.hit_eot)  # fmt: skip

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A small host tensor on the device without waiting: through pinned memory on CUDA (the
        caching host allocator keeps the block until the copy is done)."""
        if not self._pinned:
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    @torch.no_grad()
    def step(self, n_rows: int, steps: int = 1) -> None:
        """`steps` decode steps for rows [0, n_rows), queueing no snapshot."""
        self._advance(n_rows, steps)

    @torch.no_grad()
    def advance(self, n_rows: int, steps: int) -> None:
        """`steps` decode steps for rows [0, n_rows), then queue a snapshot: on CUDA one graph
        replay (steps and snapshot pack), one copy to the host and one event."""
        packed = self._advance(n_rows, steps)
        self.snapshot(packed=packed)

    def _advance(self, n_rows: int, steps: int) -> bool:
        """The steps; True when a graph also packed the snapshot table."""
        # Attend only up to the longest row after the last step (the host mirror bounds every
        # position), rounded up to a captured length on CUDA so eager and graph steps compute alike.
        kv_len = min(int(self.host_positions[:n_rows].max()) + steps, self.n_ctx)
        if self.kv_buckets:
            kv_len = self.kv_buckets[bisect_left(self.kv_buckets, kv_len)]
        sample = bool((self.temperatures[:n_rows] > 0).any())
        packed = self.runner is not None and self.runner.steps == steps
        if packed:
            self.runner.replay(n_rows, kv_len, sample)  # NOTE: the graph packs `bucket` rows
        else:
            for _ in range(steps):
                self._step(n_rows, kv_len, sample)
        self.host_positions[:n_rows] += steps * self.occupied[:n_rows]
        np.minimum(self.host_positions, self.n_ctx - 1, out=self.host_positions)
        return packed

    def _step(self, n: int, kv_len: int | None, sample: bool) -> None:
        rows = slice(0, n)
        tokens, positions = self.tokens[rows], self.positions[rows]
        running = self.running[rows]
        fed = tokens.gather(1, positions[:, None]).squeeze(1)  # [n]
        greedy = self.greedy is not None and not sample
        # [n, V]: float32 for the tensor path; the fused kernel reads the model's dtype as it is.
        logits = self.model.decode_step(self.cache, fed, positions, None, kv_len, self.backend, upcast=not greedy)
        next_pos = positions + 1
        begin = self.sample_begin[rows]
        # Language detection: the raw distribution restricted to language tokens (read before the
        # tensor path's rules write into the logits).
        language = self.language_ids[logits[:, self.language_ids].argmax(dim=-1)]  # [n]
        if greedy:
            sampled, logprob, p_no_speech = self.greedy(logits, tokens, next_pos, begin, self.last_timestamp[rows])
        else:
            p_no_speech = torch.softmax(logits, dim=-1)[:, self.spec.no_speech]
            filtered = self.rules.apply(logits, tokens, next_pos, begin, self.last_timestamp[rows])
            sampled, logprob = select_tokens(filtered, self.temperature[rows], self.noise_key[rows], next_pos, sample)
        # no_speech_prob is read where <|startoftranscript|> is fed (openai DecodingTask).
        at_sot = running & (positions == 0)
        self.no_speech_prob[rows] = torch.where(at_sot, p_no_speech, self.no_speech_prob[rows])

        forced = next_pos < begin
        prompt_tok = tokens.gather(1, next_pos.clamp(max=self.n_ctx - 1)[:, None]).squeeze(1)
        detecting = forced & self.detect[rows] & (next_pos == LANGUAGE_POSITION)
        new_tok = torch.where(detecting, language, torch.where(forced, prompt_tok, sampled))

        generating = running & ~forced
        self.sum_logprob[rows] += torch.where(generating, logprob, torch.zeros_like(logprob))
        write_pos = torch.where(running, next_pos, positions).clamp(max=self.n_ctx - 1)
        old = tokens.gather(1, write_pos[:, None]).squeeze(1)
        tokens.scatter_(1, write_pos[:, None], torch.where(running, new_tok, old)[:, None])
        is_ts = new_tok >= self.spec.rules.timestamp_begin
        self.last_timestamp[rows] = torch.where(generating & is_ts, new_tok, self.last_timestamp[rows])
        eot = generating & (new_tok == self.spec.rules.eot)
        self.hit_eot[rows] |= eot
        done = eot | (generating & (next_pos >= self.sample_end[rows]))
        self.positions[rows] = torch.where(running, next_pos, positions).clamp(max=self.n_ctx - 1)
        self.running[rows] = running & ~done

    # -- collection ----------------------------------------------------------------------------

    def pack_snapshot(self, n: int) -> None:
        """Pack rows [0, n) of the state the host reads into the int32 snapshot table (device).
        Pure tensor code: captured at the end of every step graph."""
        rows, pack = slice(0, n), self._pack  # [S, _S_TOKENS + n_ctx] int32
        pack[rows, _S_RUNNING].copy_(self.running[rows])
        pack[rows, _S_HIT_EOT].copy_(self.hit_eot[rows])
        pack[rows, _S_POSITION].copy_(self.positions[rows])
        pack[rows, _S_BEGIN].copy_(self.sample_begin[rows])
        pack[rows, _S_LOGPROB].copy_(self.sum_logprob[rows].view(torch.int32))  # float32 bits
        pack[rows, _S_NO_SPEECH].copy_(self.no_speech_prob[rows].view(torch.int32))
        pack[rows, _S_TOKENS:].copy_(self.tokens[rows])

    def snapshot(self, packed: bool = False) -> None:
        """Queue a copy of the state the host reads, for rows [0, rows_in_use()); never waits.

        `packed`: a step graph has just packed the table. On CUDA the table goes to a pinned
        buffer behind the steps already queued, with an event to wait on; on the CPU at once.
        """
        n = self.rows_in_use()
        snap = self._spare.pop() if self._spare else self._new_snapshot()
        snap.n_rows, snap.generation = n, self.generation.copy()
        if n:
            if not packed:
                self.pack_snapshot(n)
            # NOTE: the device table is rewritten by the next look's graph; stream order keeps
            # this copy ahead of it.
            snap.ints[:n].copy_(self._pack[:n], non_blocking=snap.ready is not None)
            if snap.ready is not None:
                snap.ready.record()
        self._pending.append(snap)

    def _new_snapshot(self) -> Snapshot:
        pin = self._pinned
        return Snapshot(
            ints=torch.zeros(self.n_slots, _S_TOKENS + self.n_ctx, dtype=torch.int32, pin_memory=pin),
            ready=torch.cuda.Event() if pin else None,
        )

    def pending_snapshots(self) -> int:
        return len(self._pending)

    def wait_snapshot(self) -> Snapshot:
        """The oldest queued snapshot, once its copy has landed (the only wait on the device)."""
        snap = self._pending.popleft()
        if snap.ready is not None:
            snap.ready.synchronize()
        return snap

    def finished(self, snap: Snapshot) -> list[WindowResult]:
        """Windows that had finished when `snap` was taken; their slots become free.

        Rows are inert once finished, so a late look reads exactly what an early one would. A slot
        that is free now, or was re-admitted after the snapshot was taken, is skipped: the
        snapshot describes an earlier window (or none).
        """
        ints = snap.ints[: snap.n_rows].numpy()  # [n, _S_TOKENS + n_ctx] int32
        floats = ints[:, _S_LOGPROB : _S_NO_SPEECH + 1].view(np.float32)  # [n, 2] the same bits
        results = []
        for slot in np.flatnonzero(ints[:, _S_RUNNING] == 0).tolist():
            key = self.keys[slot]
            if key is None or snap.generation[slot] != self.generation[slot]:
                continue
            row = ints[slot]
            begin, position, hit_eot = int(row[_S_BEGIN]), int(row[_S_POSITION]), bool(row[_S_HIT_EOT])
            sampled = row[_S_TOKENS + begin : _S_TOKENS + position + 1].tolist()
            if hit_eot:
                sampled = sampled[:-1]
            language = int(row[_S_TOKENS + LANGUAGE_POSITION]) if begin > LANGUAGE_POSITION else None
            results.append(
                WindowResult(
                    key=key,
                    tokens=sampled,
                    sum_logprob=float(floats[slot, 0]),
                    no_speech_prob=float(floats[slot, 1]),
                    language_token=language,
                    temperature=float(self.temperatures[slot]),
                    hit_eot=hit_eot,
                )
            )
            self.keys[slot] = None
            self.occupied[slot] = False
            self.temperatures[slot] = 0.0  # a free slot never asks for the sampling graphs
            self.host_positions[slot] = 0
        self._spare.append(snap)
        return results

    def collect(self, lag: int = 0) -> list[WindowResult]:
        """Take a snapshot now, then return the finished windows of every queued snapshot but the
        newest `lag`. lag=0 is the synchronous path: one wait for everything queued so far."""
        self.snapshot()
        results = []
        while len(self._pending) > lag:
            results += self.finished(self.wait_snapshot())
        return results
