"""Admission's host side: a group's audio and per-slot state packed into host buffers and sent to
the device with a few asynchronous copies, then padded there.

Two host buffers alternate (pinned on CUDA; pinned allocations are slow, so they are made once),
so an admission waits only for the copy of the admission before last. Only the real samples cross
to the device; zero padding is made there. Samples that decode threads wrote into the pinned arena
are copied by DMA as they are, not packed first, so a buffer's audio part (n_slots windows, ~0.5
GB pinned at 256 slots) is made only when a group first has samples outside the arena: a GPU run
whose items all decode into the arena never pays for it at start-up.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from batchscribe.constants import N_SAMPLES
from batchscribe.engine.pinned import PinnedArena, shared_arena
from batchscribe.engine.requests import WindowRequest

# Columns of an admission pack (int64, one row per admitted window); the prompt row follows them.
_A_SLOT, _A_LENGTH, _A_SHIFT, _A_BEGIN, _A_DETECT, _A_NOISE, _A_SOT, _A_PROMPT = range(8)


@dataclass
class _Buffers:
    """One of the two alternating host buffers (pinned on CUDA)."""

    audio: torch.Tensor | None  # [n_slots * N_SAMPLES] float32: a group's real samples, concatenated; made on first use
    ints: torch.Tensor  # [n_slots, _A_PROMPT + n_text_ctx] int64: _A_* columns, then the prompt row
    floats: torch.Tensor  # [n_slots] float32: temperature
    copied: torch.cuda.Event | None  # recorded after the last copy out of these buffers (CUDA)
    holds: list[np.ndarray] = field(default_factory=list)  # pinned samples being copied from (CUDA)


@dataclass(frozen=True)
class Staged:
    """An admission group on the device."""

    audio: torch.Tensor  # [G, N_SAMPLES] float32, zero-padded
    ints: torch.Tensor  # [G, _A_PROMPT + n_text_ctx] int64
    floats: torch.Tensor  # [G] float32: temperature

    @property
    def slot_ids(self) -> torch.Tensor:  # [G] long
        return self.ints[:, _A_SLOT]

    @property
    def begin(self) -> torch.Tensor:  # [G] long: prompt lengths
        return self.ints[:, _A_BEGIN]

    @property
    def prompts(self) -> torch.Tensor:  # [G, n_text_ctx] long
        return self.ints[:, _A_PROMPT:]

    @property
    def noise_key(self) -> torch.Tensor:  # [G] long
        return self.ints[:, _A_NOISE]

    @property
    def detect(self) -> torch.Tensor:  # [G] bool
        return self.ints[:, _A_DETECT] != 0

    @property
    def sot(self) -> torch.Tensor:  # [G] long: where <|startoftranscript|> sits (after a prompt)
        return self.ints[:, _A_SOT]


class Stager:
    """Packs admission groups into alternating host buffers and copies them to `device`."""

    def __init__(self, n_slots: int, n_ctx: int, device: torch.device, timings: defaultdict[str, float]):
        self.n_slots, self.n_ctx, self.device = n_slots, n_ctx, device
        self.pinned = device.type == "cuda"
        self.arena: PinnedArena | None = None  # see enable_arena
        self.buffers = [self._new_buffers() for _ in range(2)]
        self.turn = 0
        self.timings = timings  # the caller's host seconds by part; staging adds its waits

    def _new_buffers(self) -> _Buffers:
        pin = self.pinned
        return _Buffers(
            audio=None,
            ints=torch.zeros(self.n_slots, _A_PROMPT + self.n_ctx, dtype=torch.long, pin_memory=pin),
            floats=torch.zeros(self.n_slots, dtype=torch.float32, pin_memory=pin),
            copied=torch.cuda.Event() if pin else None,
        )

    def enable_arena(self, n_samples: int | None = None, arena: PinnedArena | None = None) -> PinnedArena | None:
        """Pinned memory for decode threads to decode into (CUDA; None on the CPU): `arena`, else
        the process's shared one. An engine keeps the first it was given; samples in another are
        packed like ordinary memory."""
        if self.pinned and self.arena is None:
            self.arena = arena or shared_arena(n_samples).result()
        return self.arena

    def release(self) -> None:
        """Let go of the pinned samples the last admissions were copied from (returning their arena
        ranges). Only once the device has done those copies: the caller has waited for a later
        snapshot."""
        for buf in self.buffers:
            buf.holds = []

    def stage(self, requests: Sequence[WindowRequest], slots: Sequence[int]) -> Staged:
        """Pack the group on the host, send each buffer with one copy, pad the audio on the device."""
        buf = self.buffers[self.turn]
        self.turn ^= 1
        if buf.copied is not None:
            t0 = time.perf_counter()
            buf.copied.synchronize()  # NOTE: the copy out of this buffer two admissions ago must be done
            buf.holds = []  # and so are the copies from pinned samples it kept alive
            self.timings["admit_stage_wait"] += time.perf_counter() - t0
        lengths = np.array([min(len(r.audio), N_SAMPLES) for r in requests], dtype=np.int64)  # [G]
        offsets = np.cumsum(lengths) - lengths  # [G] where each window starts in the flat samples
        self._pack_state(buf, requests, slots, lengths, offsets)
        total = int(lengths.sum())
        picked, packed = self._pack_audio(buf, requests, lengths, offsets, total)
        g = len(requests)
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
        return Staged(self._pad(flat, ints_d, g, total), ints_d, floats_d)

    @staticmethod
    def _pack_state(buf: _Buffers, requests: Sequence[WindowRequest], slots: Sequence[int],
                    lengths: np.ndarray, offsets: np.ndarray) -> None:  # fmt: skip
        g = len(requests)
        ints = buf.ints[:g].numpy()  # [G, _A_PROMPT + n_ctx], a view of the (pinned) host buffer
        ints[:, _A_SLOT] = slots
        ints[:, _A_LENGTH] = lengths
        # Sample j of window i lands at i * N_SAMPLES + (j - offsets[i]) of the padded batch.
        ints[:, _A_SHIFT] = np.arange(g) * N_SAMPLES - offsets
        ints[:, _A_BEGIN] = [len(r.prompt) for r in requests]
        ints[:, _A_DETECT] = [r.detect_language for r in requests]
        ints[:, _A_NOISE] = [r.noise_key for r in requests]
        ints[:, _A_SOT] = [r.sot_index for r in requests]
        ints[:, _A_PROMPT:] = 0
        for i, req in enumerate(requests):
            ints[i, _A_PROMPT : _A_PROMPT + len(req.prompt)] = req.prompt
        buf.floats[:g].numpy()[:] = [r.temperature for r in requests]

    def _pack_audio(self, buf: _Buffers, requests: Sequence[WindowRequest], lengths: np.ndarray,
                    offsets: np.ndarray, total: int) -> tuple[list[tuple[np.ndarray, int]], bool]:  # fmt: skip
        """Concatenate the samples that are not in the pinned arena into the host buffer. Returns
        the arena's (samples, start) pairs, copied as they are, and whether anything was packed."""
        # (samples [n] float32, where they start in the flat group, in the pinned arena?) per window
        parts = [(r.audio[:n], start, self.arena is not None and self.arena.holds(r.audio))
                 for r, n, start in zip(requests, lengths.tolist(), offsets.tolist())]  # fmt: skip
        picked = [(a, start) for a, start, pinned in parts if pinned]
        packed = bool(total) and len(picked) < len(requests)
        if packed and buf.audio is None:
            buf.audio = torch.empty(self.n_slots * N_SAMPLES, dtype=torch.float32, pin_memory=self.pinned)
        if packed and not picked:
            np.concatenate([a for a, _, _ in parts], out=buf.audio[:total].numpy())
        elif packed:
            host = buf.audio.numpy()
            for a, start, pinned in parts:
                if not pinned:
                    host[start : start + len(a)] = a
        return picked, packed

    def _pad(self, flat: torch.Tensor, ints: torch.Tensor, g: int, total: int) -> torch.Tensor:
        """flat [total] samples -> [G, N_SAMPLES], each window zero-padded, on the device."""
        audio = torch.zeros(g, N_SAMPLES, dtype=torch.float32, device=self.device)
        if total:
            # output_size keeps repeat_interleave from reading the total back from the device.
            shift = torch.repeat_interleave(ints[:, _A_SHIFT], ints[:, _A_LENGTH], output_size=total)
            dest = torch.arange(total, device=self.device) + shift  # [total]
            audio.view(-1).index_copy_(0, dest, flat)
        return audio
