"""Slot decoder: 30 s windows decoded in a fixed pool of slots, one token per slot per step.

Each slot holds one window: its cross-attention K/V (written once at admission), its token buffer
(forced prompt, then sampled tokens), its position, and the per-row state the logit rules need. A step
feeds every row in [0, n_rows) the token at its position; forced prompt tokens, language detection,
the OpenAI logit rules, sampling, log-prob sums and end-of-text flags are all tensor operations, so
the same step runs eagerly on the CPU and, in the GPU engine, inside a CUDA graph. Rows that are
free or finished are inert: they neither move nor change their results.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from batchscribe.audio.features import LogMel
from batchscribe.constants import N_SAMPLES
from batchscribe.engine.logits import LogitRules, RuleSpec, select_tokens
from batchscribe.model.attention import AttentionBackend, SdpaBackend
from batchscribe.model.whisper import DecoderCache, Whisper

LANGUAGE_POSITION = 1  # <|startoftranscript|> <|xx|> <|task|> ...: the language token's index


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


KERNELS = {"self": ("sdpa", "flashinfer"), "cross": ("sdpa", "flashinfer", "flashinfer_tc")}


@dataclass(frozen=True)
class AttentionKinds:
    """Which kernels run each attention kind, and the cross-attention cache's dtype."""

    self_attention: str = "sdpa"  # "sdpa" | "flashinfer"
    cross_attention: str = "sdpa"  # "sdpa" | "flashinfer" | "flashinfer_tc" (its tensor-core kernels)
    cross_dtype: torch.dtype | None = None  # None: the model's dtype; torch.float8_e4m3fn: fp8

    def __post_init__(self) -> None:
        for kind, name in (("self", self.self_attention), ("cross", self.cross_attention)):
            if name not in KERNELS[kind]:
                raise ValueError(f"{kind}-attention kernel {name!r} is unknown; use one of {KERNELS[kind]}")

    @classmethod
    def resolve(cls, attention: str, cross_kv: str, device: torch.device, dtype: torch.dtype) -> "AttentionKinds":
        """EngineOptions' names -> kernels. `attention` is "auto", one kernel for both kinds, or
        "SELF/CROSS" (e.g. "flashinfer/flashinfer_tc"). "auto" on CUDA in fp16/bf16 with FlashInfer
        installed: FlashInfer for both kinds (ragged self-attention 2.2x faster than masked SDPA on
        the H200; figures per kind in docs/GPU_NOTES.md); SDPA everywhere else (CPU, float32)."""
        if cross_kv not in ("auto", "fp8"):
            raise ValueError(f"cross_kv={cross_kv!r}; use 'auto' (the model's dtype) or 'fp8'")
        half = dtype in (torch.float16, torch.bfloat16)
        if attention == "auto":
            from batchscribe.model.flashinfer_backend import flashinfer_available

            self_kind = cross_kind = "flashinfer" if device.type == "cuda" and half and flashinfer_available() else "sdpa"
        else:
            self_kind, _, cross_kind = attention.partition("/")
            cross_kind = cross_kind or self_kind
            if self_kind not in KERNELS["self"] or cross_kind not in KERNELS["cross"]:
                raise ValueError(f"attention={attention!r}; use 'auto', 'sdpa', 'flashinfer' or 'SELF/CROSS' with "
                                 f"SELF in {KERNELS['self']} and CROSS in {KERNELS['cross']}")  # fmt: skip
        if not half and (self_kind, cross_kind) != ("sdpa", "sdpa"):
            raise ValueError(f"attention={attention!r} runs in float16 or bfloat16, not {dtype}; "
                             "pick one of those dtypes or attention='sdpa'")  # fmt: skip
        cross_dtype = torch.float8_e4m3fn if cross_kv == "fp8" else None
        return cls(self_kind, cross_kind, cross_dtype)

    @property
    def uses_flashinfer(self) -> bool:
        return self.self_attention != "sdpa" or self.cross_attention != "sdpa"

    def backend(self, cache: DecoderCache, q_dtype: torch.dtype) -> AttentionBackend:
        if not self.uses_flashinfer:
            return SdpaBackend()
        from batchscribe.model.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(cache, q_dtype, use_self=self.self_attention == "flashinfer",
                                 use_cross=self.cross_attention != "sdpa",
                                 cross_tensor_cores=self.cross_attention == "flashinfer_tc")  # fmt: skip


@dataclass(frozen=True)
class DecoderSpec:
    """Static facts the decoder needs; built once from the tokenizer and options."""

    rules: RuleSpec
    no_speech: int
    language_tokens: tuple[int, ...]  # candidates for language detection
    sample_len: int


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
        self.cache = DecoderCache.allocate(dims, n_slots, device, dtype, attention.cross_dtype)
        self.backend = attention.backend(self.cache, dtype)
        self.features = LogMel(dims.n_mels, device=device)
        self.rules = LogitRules(spec.rules, device)
        self.language_ids = torch.tensor(spec.language_tokens or [0], device=device)
        self.runner = None  # a GraphRunner, set by the engine on CUDA
        # Host staging for admitted audio, allocated once (pinned allocations are slow).
        self.staging = torch.zeros(n_slots * N_SAMPLES, dtype=torch.float32, pin_memory=device.type == "cuda")
        self._staged: torch.cuda.Event | None = None  # the last copy out of `staging`

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
        self.hit_eot = zeros(n_slots, dtype=torch.bool)
        # Host mirror: which window each slot holds and its position (positions advance by exactly
        # one per step while running, so the host can bound attention lengths without a sync).
        self.keys: list[int | None] = [None] * n_slots
        self.temperatures: list[float] = [0.0] * n_slots
        self.host_positions = np.zeros(n_slots, dtype=np.int64)

    # -- admission -----------------------------------------------------------------------------

    def free_slots(self) -> list[int]:
        return [s for s, key in enumerate(self.keys) if key is None]

    @torch.no_grad()
    def admit(self, requests: list[WindowRequest], slots: list[int]) -> None:
        """Encode a group of windows together and set up their slots."""
        mel = self.features(self._stage_audio(requests))  # [G, n_mels, 3000]
        enc = self.model.encoder(mel.to(self.dtype))  # [G, 1500, n_state]
        slot_ids = torch.tensor(slots, device=self.device)
        self.model.write_cross_kv(self.cache, enc, slot_ids)

        prompts = torch.zeros(len(requests), self.n_ctx, dtype=torch.long)
        begin, detect, temps, keys = [], [], [], []
        for i, req in enumerate(requests):
            prompts[i, : len(req.prompt)] = torch.tensor(req.prompt)
            begin.append(len(req.prompt))
            detect.append(req.detect_language)
            temps.append(req.temperature)
            keys.append(req.noise_key)
            self.keys[slots[i]] = req.key
            self.temperatures[slots[i]] = req.temperature
            self.host_positions[slots[i]] = 0
        begin_t = torch.tensor(begin, device=self.device)
        self.tokens[slot_ids] = prompts.to(self.device)
        self.positions[slot_ids] = 0
        self.sample_begin[slot_ids] = begin_t
        self.sample_end[slot_ids] = torch.clamp(begin_t + self.spec.sample_len, max=self.n_ctx) - 1
        self.last_timestamp[slot_ids] = -1
        self.sum_logprob[slot_ids] = 0.0
        self.no_speech_prob[slot_ids] = 0.0
        self.temperature[slot_ids] = torch.tensor(temps, device=self.device)
        self.noise_key[slot_ids] = torch.tensor(keys, device=self.device)
        self.detect[slot_ids] = torch.tensor(detect, device=self.device)
        self.running[slot_ids] = True
        self.hit_eot[slot_ids] = False

    def _stage_audio(self, requests: list[WindowRequest]) -> torch.Tensor:  # [G, N_SAMPLES] on device
        """Only the real samples cross to the device (one copy); zero padding is made there."""
        lengths = [min(len(r.audio), N_SAMPLES) for r in requests]
        if self._staged is not None:
            self._staged.synchronize()  # NOTE: the last copy out of the pinned buffer must be done
        flat = self.staging[: sum(lengths)]  # [sum(lengths)], pinned on CUDA
        np.concatenate([r.audio[:n] for r, n in zip(requests, lengths)], out=flat.numpy())
        on_device = flat.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._staged = torch.cuda.Event()
            self._staged.record()
        audio = torch.zeros(len(requests), N_SAMPLES, device=self.device)
        start = 0
        for i, n in enumerate(lengths):
            audio[i, :n] = on_device[start : start + n]
            start += n
        return audio

    # -- the step ------------------------------------------------------------------------------

    def rows_in_use(self) -> int:
        """Rows [0, n) cover every occupied slot; the CPU path steps only those."""
        used = [s for s, key in enumerate(self.keys) if key is not None]
        return used[-1] + 1 if used else 0

    @torch.no_grad()
    def step(self, n_rows: int) -> None:
        """One decode step for rows [0, n_rows); pure tensor code from here down."""
        # Attend only up to the longest row (the host mirror is an upper bound on every position),
        # rounded up to a captured length on CUDA so eager and graph steps compute alike.
        kv_len = int(self.host_positions[:n_rows].max()) + 1
        if self.kv_buckets:
            kv_len = self.kv_buckets[bisect_left(self.kv_buckets, kv_len)]
        sample = any(t > 0 for t in self.temperatures[:n_rows])
        if self.runner is not None:
            self.runner.replay(n_rows, kv_len, sample)
        else:
            self._step(n_rows, kv_len, sample)
        self.host_positions[:n_rows] += np.array(
            [key is not None for key in self.keys[:n_rows]], dtype=np.int64
        )
        np.minimum(self.host_positions, self.n_ctx - 1, out=self.host_positions)

    def _step(self, n: int, kv_len: int | None, sample: bool) -> None:
        rows = slice(0, n)
        tokens, positions = self.tokens[rows], self.positions[rows]
        running = self.running[rows]
        fed = tokens.gather(1, positions[:, None]).squeeze(1)  # [n]
        logits = self.model.decode_step(self.cache, fed, positions, None, kv_len, self.backend)  # [n, V]

        # no_speech_prob is read where <|startoftranscript|> is fed (openai DecodingTask).
        at_sot = running & (positions == 0)
        p_no_speech = torch.softmax(logits, dim=-1)[:, self.spec.no_speech]
        self.no_speech_prob[rows] = torch.where(at_sot, p_no_speech, self.no_speech_prob[rows])
        # Language detection reads the same distribution, restricted to language tokens.
        language = self.language_ids[logits[:, self.language_ids].argmax(dim=-1)]  # [n]

        next_pos = positions + 1
        begin = self.sample_begin[rows]
        filtered = self.rules.apply(logits, tokens, next_pos, begin, self.last_timestamp[rows])
        sampled, logprob = select_tokens(filtered, self.temperature[rows], self.noise_key[rows], next_pos, sample)

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

    def collect(self) -> list[WindowResult]:
        """Results of finished windows; their slots become free. One host sync per call."""
        occupied = [s for s, key in enumerate(self.keys) if key is not None]
        if not occupied:
            return []
        running = self.running.cpu().numpy()
        finished = [s for s in occupied if not running[s]]
        if not finished:
            return []
        idx = torch.tensor(finished, device=self.device)
        tokens = self.tokens[idx].cpu().numpy()
        positions = self.positions[idx].cpu().numpy()
        begin = self.sample_begin[idx].cpu().numpy()
        sum_lp = self.sum_logprob[idx].cpu().numpy()
        no_speech = self.no_speech_prob[idx].cpu().numpy()
        hit_eot = self.hit_eot[idx].cpu().numpy()
        results = []
        for i, slot in enumerate(finished):
            sampled = tokens[i, begin[i] : positions[i] + 1].tolist()
            if hit_eot[i]:
                sampled = sampled[:-1]
            language = int(tokens[i, LANGUAGE_POSITION]) if begin[i] > LANGUAGE_POSITION else None
            results.append(
                WindowResult(
                    key=self.keys[slot],
                    tokens=sampled,
                    sum_logprob=float(sum_lp[i]),
                    no_speech_prob=float(no_speech[i]),
                    language_token=language,
                    temperature=self.temperatures[slot],
                    hit_eot=bool(hit_eot[i]),
                )
            )
            self.keys[slot] = None
            self.temperatures[slot] = 0.0  # a free slot never asks for the sampling graphs
            self.host_positions[slot] = 0
        return results
