"""How big things are: slots for the free memory, the captured row and length buckets, how many
steps the host launches between looks at the slots, and the host memory decoded audio may take."""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Sequence

# GPU seconds of steps the host launches between looks at the finished flags: enough queued work
# that the device stays busy while the host admits and collects, and no more, since a finished row
# idles until its batch is read. Chosen by measurement (docs/GPU_NOTES.md).
STEPS_AHEAD_SECONDS = 0.002
MAX_STEPS_PER_CHECK = 4
# Decoder slots unless batch_size says: 16 on the CPU; on CUDA as many as fit, up to the cap. More
# slots make a large model's steps a little more efficient but a small model's admissions (groups
# twice the size) slower (docs/GPU_NOTES.md). Here, without torch: --ray's driver sizes its actor
# calls by them.
CPU_SLOTS = 16
CUDA_SLOT_CAP = 256
# Decoded audio the scheduler may hold in the items it is transcribing (each keeps its whole audio
# on the host until its last window): a share of the machine's memory, split among a run's engines.
# 256 slots of hour-long files would otherwise hold ~59 GB.
HOST_AUDIO_FRACTION = 1 / 4


def steps_per_check(step_seconds: float) -> int:
    """Small models' sub-millisecond steps: 4 per look; large models' ~25 ms steps: 1 (their
    finished rows would otherwise idle for several steps)."""
    return max(1, min(MAX_STEPS_PER_CHECK, math.ceil(STEPS_AHEAD_SECONDS / max(step_seconds, 1e-9))))


def default_buckets(n_slots: int) -> list[int]:
    """Powers of two up to 64, then steps of 64 up to n_slots (always included): the tail of a run
    pads to a small bucket; the steady state, with every slot busy, runs the largest."""
    buckets = [b for b in (1, 2, 4, 8, 16, 32) if b < n_slots]
    buckets += list(range(64, n_slots, 64))
    return sorted(set(buckets + [n_slots]))


def bucket_for(buckets: Sequence[int], n: int) -> int:
    """The smallest of the sorted buckets that holds n (a step over n rows, or n cached positions,
    runs that bucket's width): what graphs replay, and what eager steps compute so that the two
    give the same shapes."""
    return buckets[bisect_left(buckets, n)]


def default_kv_buckets(n_text_ctx: int) -> list[int]:
    """Self-attention lengths to capture: a step attends over the smallest one that covers every
    row's position, so short transcripts do not read (masked) cache up to n_text_ctx."""
    return sorted({min(n_text_ctx, k) for k in (64, 160, 256, n_text_ctx)})


def slots_for_memory(free_bytes: int, bytes_per_slot: int, fraction: float = 0.6, cap: int = 512) -> int:
    """How many slots fit in a fraction of free memory, rounded down to a multiple of 8."""
    fit = int(free_bytes * fraction) // max(1, bytes_per_slot)
    return max(1, min(cap, fit - fit % 8 if fit >= 8 else fit))


def host_memory_bytes() -> int:
    """This machine's physical memory (16 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def host_audio_bytes(engines: int = 1) -> int:
    """The default budget of decoded audio for each of `engines` engines on this machine."""
    return int(host_memory_bytes() * HOST_AUDIO_FRACTION) // max(1, engines)


def gpus_on_this_machine(proc: str = "/proc/driver/nvidia/gpus") -> int:
    """NVIDIA GPUs on this machine, whatever CUDA_VISIBLE_DEVICES shows (a Ray GPU actor sees only
    its own): the driver's entries, 1 where it lists none."""
    try:
        return max(1, len(os.listdir(proc)))
    except OSError:
        return 1
