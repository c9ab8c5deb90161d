"""Snapshots: how the host reads finished windows without stopping the device.

After a look's steps, the state the host reads is packed into one int32 table on the device (inside
the same CUDA graph as the steps), copied into a host buffer behind them, and an event is recorded;
the host waits for a snapshot only when it needs that one, typically one look later. A slot freed
and re-admitted after a snapshot was queued is not read from it (per-slot admission generations).
Finished rows are inert, so a late look reads exactly what an early one would.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from batchscribe.engine.requests import LANGUAGE_POSITION, FinishedWindow
from batchscribe.engine.slots import Slots

# Columns of a snapshot (int32, one row per slot; the two float32 columns are stored bit for bit),
# then the slot's token buffer: one table, so one copy to the host per look.
_S_RUNNING, _S_HIT_EOT, _S_POSITION, _S_BEGIN, _S_LOGPROB, _S_NO_SPEECH, _S_SOT, _S_TOKENS = range(8)


@dataclass
class Snapshot:
    """A host copy of the per-slot state the host reads, taken after some steps."""

    ints: torch.Tensor  # [n_slots, _S_TOKENS + n_text_ctx] int32: _S_* columns, then the tokens
    ready: torch.cuda.Event | None  # recorded after the copy (CUDA); None on the CPU: copied at once
    n_rows: int = 0  # rows [0, n_rows) were copied: every slot occupied when it was taken
    generation: np.ndarray | None = None  # [n_slots] each slot's admission count when it was taken


class SnapshotQueue:
    """The device pack table, the queued host copies (oldest first) and spare host buffers."""

    def __init__(self, slots: Slots):
        self.state, self.device = slots.state, slots.device
        self.n_slots, self.n_ctx = slots.n_slots, slots.n_ctx
        self.pinned = slots.device.type == "cuda"
        self.table = torch.zeros(self.n_slots, _S_TOKENS + self.n_ctx, dtype=torch.int32, device=self.device)
        self.pending: deque[Snapshot] = deque()
        self.spare: list[Snapshot] = []

    def pack(self, n: int) -> None:
        """Pack rows [0, n) of the state the host reads into the table. Pure tensor code: captured
        at the end of every step graph."""
        rows, table, s = slice(0, n), self.table, self.state  # [S, _S_TOKENS + n_ctx] int32
        table[rows, _S_RUNNING].copy_(s.running[rows])
        table[rows, _S_HIT_EOT].copy_(s.hit_eot[rows])
        table[rows, _S_POSITION].copy_(s.positions[rows])
        table[rows, _S_BEGIN].copy_(s.sample_begin[rows])
        table[rows, _S_LOGPROB].copy_(s.sum_logprob[rows].view(torch.int32))  # float32 bits
        table[rows, _S_NO_SPEECH].copy_(s.no_speech_prob[rows].view(torch.int32))
        table[rows, _S_SOT].copy_(s.sot_pos[rows])
        table[rows, _S_TOKENS:].copy_(s.tokens[rows])

    def queue(self, n_rows: int, generation: np.ndarray, packed: bool) -> None:
        """Queue a copy of rows [0, n_rows) (every occupied slot); never waits. `packed`: a step
        graph has just packed the table. On CUDA the copy goes to a pinned buffer behind the steps
        already queued, with an event to wait on; on the CPU at once."""
        snap = self.spare.pop() if self.spare else self._new()
        snap.n_rows, snap.generation = n_rows, generation.copy()
        if n_rows:
            if not packed:
                self.pack(n_rows)
            # NOTE: the device table is rewritten by the next look's graph; stream order keeps
            # this copy ahead of it.
            snap.ints[:n_rows].copy_(self.table[:n_rows], non_blocking=snap.ready is not None)
            if snap.ready is not None:
                snap.ready.record()
        self.pending.append(snap)

    def _new(self) -> Snapshot:
        return Snapshot(
            ints=torch.zeros(self.n_slots, _S_TOKENS + self.n_ctx, dtype=torch.int32, pin_memory=self.pinned),
            ready=torch.cuda.Event() if self.pinned else None,
        )

    def wait(self) -> Snapshot:
        """The oldest queued snapshot, once its copy has landed (the only wait on the device)."""
        snap = self.pending.popleft()
        if snap.ready is not None:
            snap.ready.synchronize()
        return snap

    def finished(self, snap: Snapshot, slots: Slots) -> list[FinishedWindow]:
        """Windows that had finished when `snap` was taken; their slots become free. A slot that is
        free now, or was re-admitted after the snapshot was taken, is skipped: the snapshot
        describes an earlier window (or none). The snapshot's buffer is then reused."""
        ints = snap.ints[: snap.n_rows].numpy()  # [n, _S_TOKENS + n_ctx] int32
        floats = ints[:, _S_LOGPROB : _S_NO_SPEECH + 1].view(np.float32)  # [n, 2] the same bits
        results = []
        for slot in np.flatnonzero(ints[:, _S_RUNNING] == 0).tolist():
            key = slots.keys[slot]
            if key is None or snap.generation[slot] != slots.generation[slot]:
                continue
            row = ints[slot]
            begin, position, hit_eot = int(row[_S_BEGIN]), int(row[_S_POSITION]), bool(row[_S_HIT_EOT])
            sampled = row[_S_TOKENS + begin : _S_TOKENS + position + 1].tolist()
            if hit_eot:
                sampled = sampled[:-1]
            at = int(row[_S_SOT]) + LANGUAGE_POSITION
            language = int(row[_S_TOKENS + at]) if begin > at else None
            results.append(FinishedWindow(key=key, tokens=sampled, sum_logprob=float(floats[slot, 0]),
                                          no_speech_prob=float(floats[slot, 1]), language_token=language,
                                          temperature=float(slots.temperatures[slot]), hit_eot=hit_eot,
                                          slot=slot))  # fmt: skip
            slots.release(slot)
        self.spare.append(snap)
        return results
