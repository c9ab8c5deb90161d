"""Finished windows waiting for the alignment pass until their batch is fuller.

On CUDA the pass runs batches of one fixed shape per token bucket (`Aligner.max_batch` windows), so
a batch of 3 windows costs the device as much as one of 16, and sent as each collect reads them,
W1's batches were half padding (docs/GPU_NOTES.md). So a window whose words are timed may wait here, its slot
kept out of admission (`Slots.held`: the pass reads its cross K/V in place), until its bucket has a
whole batch, or the oldest window of the bucket has waited `max_age` collects, or the scheduler sends
everything (nothing else runs, fewer windows run than a batch holds, a compaction is next).

Which windows go when depends only on the schedule (counts of collects and windows), never on how
fast the device is, so every run of the same input sends the same batches; a window's alignment does
not depend on the windows beside it in its batch either (a fixed shape per bucket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchscribe.engine.alignment import AlignWindow

if TYPE_CHECKING:
    from batchscribe.engine.alignment import Aligner
    from batchscribe.engine.windows import Judged


@dataclass(frozen=True)
class Held:
    """A window read from a snapshot whose words wait for the pass."""

    key: int  # the scheduler's item key
    verdict: Judged
    request: AlignWindow


class AlignQueue:
    """Windows by bucket, in the order they were added; `take` says which go to the pass now."""

    def __init__(self, aligner: Aligner, max_age: int):
        self.aligner, self.max_age = aligner, max_age
        self._buckets: dict[int, list[tuple[int, int, Held]]] = {}  # bucket -> [(order, collect added, window)]
        self._added = 0
        self._collects = 0  # `take` calls so far

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def add(self, held: Held) -> None:
        self._buckets.setdefault(self.aligner.bucket(held.request), []).append((self._added, self._collects, held))
        self._added += 1

    def take(self, force: bool = False) -> list[Held]:
        """The windows to send now, in the order they were added: every whole batch of a bucket,
        and a bucket's remainder once its oldest window has waited `max_age` collects (or at once
        with `force`). Call it once per collect: the windows left wait one collect more."""
        batch, out = self.aligner.max_batch, []
        for bucket in list(self._buckets):
            held = self._buckets[bucket]
            n = len(held) - len(held) % batch  # whole batches, the oldest windows first
            if n < len(held) and (force or self._collects - held[n][1] >= self.max_age):
                n = len(held)  # the rest too: held[n] is the oldest left
            out += held[:n]
            if n == len(held):
                del self._buckets[bucket]
            else:
                self._buckets[bucket] = held[n:]
        self._collects += 1
        return [h for _, _, h in sorted(out, key=lambda entry: entry[0])]
