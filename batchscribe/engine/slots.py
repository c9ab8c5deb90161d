"""The decoder's slots: per-slot state tensors on the device and the host's mirror of them.

Each slot holds one window: its token buffer (forced prompt, then sampled tokens), its position, and
the per-row state the logit rules and the results need. `SlotTensors` lists every one of those
tensors, so whatever moves a slot (compaction) or reads them (snapshots) iterates one structure.
The host mirror knows which window each slot holds and its position without reading the device:
positions advance by exactly one per step while a slot runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from batchscribe.engine.pinned import to_device_async


@dataclass
class SlotTensors:
    """Per-slot decode state, one row per slot (device). Rows that are free or finished are inert:
    a step neither moves them nor changes their results."""

    tokens: torch.Tensor  # [S, n_text_ctx] long: forced prompt, then sampled tokens
    positions: torch.Tensor  # [S] long: position of the token fed next
    sample_begin: torch.Tensor  # [S] long: position of the first sampled token
    sample_end: torch.Tensor  # [S] long: last position a sampled token may take
    last_timestamp: torch.Tensor  # [S] long: last sampled timestamp token, -1 if none
    sum_logprob: torch.Tensor  # [S] float32
    no_speech_prob: torch.Tensor  # [S] float32
    temperature: torch.Tensor  # [S] float32
    noise_key: torch.Tensor  # [S] long: per-window sampling key (logits.uniform_noise)
    detect: torch.Tensor  # [S] bool: the language token is detected, not forced
    running: torch.Tensor  # [S] bool: admitted and not finished
    hit_eot: torch.Tensor  # [S] bool
    sot_pos: torch.Tensor  # [S] long: position of <|startoftranscript|> (after an initial prompt)

    @classmethod
    def allocate(cls, n_slots: int, n_ctx: int, device: torch.device) -> SlotTensors:
        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        f32, flag = torch.float32, torch.bool
        return cls(zeros(n_slots, n_ctx), zeros(n_slots), zeros(n_slots), zeros(n_slots), zeros(n_slots),
                   zeros(n_slots, dtype=f32), zeros(n_slots, dtype=f32), zeros(n_slots, dtype=f32), zeros(n_slots),
                   zeros(n_slots, dtype=flag), zeros(n_slots, dtype=flag), zeros(n_slots, dtype=flag),
                   zeros(n_slots))  # fmt: skip

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every per-slot tensor, in declaration order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def set_up(
        self,
        slot_ids: torch.Tensor,  # [G] long
        prompts: torch.Tensor,  # [G, n_text_ctx] long: each window's prompt, zero after it
        begin: torch.Tensor,  # [G] long: prompt lengths
        temperature: torch.Tensor,  # [G] float32
        noise_key: torch.Tensor,  # [G] long
        detect: torch.Tensor,  # [G] bool
        sample_len: int,
        sot: torch.Tensor | None = None,  # [G] long: <|startoftranscript|>'s position; None: 0
    ) -> None:
        """Scatter an admitted group's state into its slots: one device op per state tensor. A
        window with an initial prompt starts at its sot: the prompt's K/V are prefilled."""
        n_ctx = self.tokens.shape[1]
        sot = torch.zeros_like(begin) if sot is None else sot
        self.tokens.index_copy_(0, slot_ids, prompts)
        self.positions.index_copy_(0, slot_ids, sot)
        self.sot_pos.index_copy_(0, slot_ids, sot)
        self.sample_begin.index_copy_(0, slot_ids, begin)
        self.sample_end.index_copy_(0, slot_ids, torch.clamp(begin + sample_len, max=n_ctx) - 1)
        self.last_timestamp.index_fill_(0, slot_ids, -1)
        self.sum_logprob.index_fill_(0, slot_ids, 0.0)
        self.no_speech_prob.index_fill_(0, slot_ids, 0.0)
        self.temperature.index_copy_(0, slot_ids, temperature)
        self.noise_key.index_copy_(0, slot_ids, noise_key)
        self.detect.index_copy_(0, slot_ids, detect)
        self.running.index_fill_(0, slot_ids, True)
        self.hit_eot.index_fill_(0, slot_ids, False)


class Slots:
    """The device state of every slot and the host's mirror: which window each slot holds, its
    temperature and position, and how often it was admitted (the stale-snapshot guard)."""

    def __init__(self, n_slots: int, n_ctx: int, device: torch.device):
        self.n_slots, self.n_ctx, self.device = n_slots, n_ctx, device
        self.state = SlotTensors.allocate(n_slots, n_ctx, device)
        self.keys: list[int | None] = [None] * n_slots
        self.occupied = np.zeros(n_slots, dtype=bool)  # [S] keys[s] is not None
        self.temperatures = np.zeros(n_slots, dtype=np.float64)  # [S] 0 for free slots
        self.positions = np.zeros(n_slots, dtype=np.int64)  # [S] bounds the device positions
        self.generation = np.zeros(n_slots, dtype=np.int64)  # [S] admissions per slot
        # [S] collected, but the alignment pass has yet to read their cross K/V: not free
        self.held = np.zeros(n_slots, dtype=bool)

    def free_slots(self) -> list[int]:
        return np.flatnonzero(~(self.occupied | self.held)).tolist()

    def rows_in_use(self) -> int:
        """Rows [0, n) cover every occupied slot; the CPU path steps only those."""
        used = np.flatnonzero(self.occupied)
        return int(used[-1]) + 1 if used.size else 0

    def slots_in_use(self) -> int:
        return int(np.count_nonzero(self.occupied))

    def claim(self, keys: Sequence[int], temperatures: Sequence[float], slots: Sequence[int],
              starts: Sequence[int] | None = None) -> None:  # fmt: skip
        """Record admitted windows (`starts`: their first positions, 0 without a prompt). Called
        last in an admission, so an out-of-memory error before it leaves the slots free."""
        for key, temperature, slot in zip(keys, temperatures, slots):
            self.keys[slot] = key
            self.temperatures[slot] = temperature
        self.occupied[slots] = True
        self.positions[slots] = 0 if starts is None else starts
        self.generation[slots] += 1

    def release(self, slot: int) -> None:
        """A collected window's slot becomes free (a free slot never asks for the sampling graphs)."""
        self.keys[slot] = None
        self.occupied[slot] = False
        self.temperatures[slot] = 0.0
        self.positions[slot] = 0

    def clear(self) -> None:
        """Free every slot, held ones too, and stop their rows on the device (inert from now on)."""
        for slot in np.flatnonzero(self.occupied).tolist():
            self.release(slot)
        self.held[:] = False
        self.state.running.fill_(False)

    def kv_bound(self, n_rows: int, steps: int) -> int:
        """The longest self-attention length rows [0, n_rows) reach within `steps` steps."""
        return min(int(self.positions[:n_rows].max()) + steps, self.n_ctx)

    def sampling(self, n_rows: int) -> bool:
        """Does any of rows [0, n_rows) decode at a temperature above 0?"""
        return bool((self.temperatures[:n_rows] > 0).any())

    def stepped(self, n_rows: int, steps: int) -> None:
        """Rows [0, n_rows) took `steps` steps (running rows move; positions stop at the cache end)."""
        self.positions[:n_rows] += steps * self.occupied[:n_rows]
        np.minimum(self.positions, self.n_ctx - 1, out=self.positions)

    @torch.no_grad()
    def compact(self, cache: Sequence[torch.Tensor]) -> int:
        """Move the windows in rows at or past the number of occupied slots into the free rows
        below it, so that steps cover only that many rows; returns rows_in_use() after it.

        For the tail of a run, when no admission will fill the holes that finished windows leave.
        Every per-slot tensor (the state, and `cache`: the K/V buffers) moves with its row: a window
        decodes the same in any slot (the sampling noise is keyed by window, not slot). Only queues
        device copies. Snapshots queued before the move describe the old rows, so both ends of every
        move count as re-admitted (`generation`) and those snapshots skip them; later snapshots read
        the moved windows, finished ones included (a finished row is inert).
        """
        if self.held.any():
            raise AssertionError("compaction with slots held for the alignment pass: it could refill them")
        used = np.flatnonzero(self.occupied)
        n = used.size
        src = used[used >= n]  # [m] rows to move
        if not src.size:
            return n
        dst = np.flatnonzero(~self.occupied[:n])  # [m]: as many holes below n as rows past it
        src_d, dst_d = (to_device_async(torch.from_numpy(rows), self.device) for rows in (src, dst))
        for t in (*self.state.tensors(), *cache):
            if t.dtype.itemsize == 1 and t.is_floating_point():
                t = t.view(torch.uint8)  # fp8 K/V: moved as bytes (index_copy_ has no fp8 kernels)
            t.index_copy_(0, dst_d, t.index_select(0, src_d))
        self.state.running.index_fill_(0, src_d, False)  # the rows left behind are free: inert
        for mirror in (self.occupied, self.temperatures, self.positions):
            mirror[dst] = mirror[src]
        self.occupied[src], self.temperatures[src], self.positions[src] = False, 0.0, 0
        for a, b in zip(src.tolist(), dst.tolist()):
            self.keys[b], self.keys[a] = self.keys[a], None
        self.generation[src] += 1
        self.generation[dst] += 1
        return n
