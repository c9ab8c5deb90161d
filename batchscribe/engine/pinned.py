"""Pinned host memory that decode threads decode into, so audio reaches the GPU without a host copy.

One pinned block is allocated once, at start-up (never per item: page-locking takes the CUDA
driver's locks, and CUDA calls from decode threads stall the engine's launches). Decode threads take
each item's samples from it (`decode_audio(allocate=arena.allocate)`); admission then copies them
to the device with asynchronous DMA instead of first packing every sample into its staging buffer,
which is the largest host cost of an admission.

On by default for GPU runs that decode in threads (`RunOptions.pinned_arena`; processes cannot
write into it): measured faster end to end (docs/GPU_NOTES.md).

Items are carved from the block as a ring, in the order they are decoded, and given back when the
last view of their samples dies; when the ring is full (a long item still alive at its tail), an
item simply gets ordinary memory and is packed as before.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import numpy as np
import torch

from batchscribe.engine.sizing import host_memory_bytes


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device` without waiting for the stream: through pinned memory on
    CUDA (the caching host allocator keeps the block until the copy is done). A plain `.to(cuda)`
    from pageable memory synchronises the stream, which drains every look queued ahead."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


ARENA_MAX_BYTES = 1 << 30  # ~4.7 h of 16 kHz float32 audio: every item a GPU run has in flight
ARENA_RAM_FRACTION = 1 / 16  # never more than this share of the machine's memory


def default_arena_samples() -> int:
    return int(min(ARENA_MAX_BYTES, host_memory_bytes() * ARENA_RAM_FRACTION)) // 4


class _Range:
    """Exposes [n] float32 at an address to numpy (the array interface), and can be weakly referenced."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, n_samples: int):
        self.__array_interface__ = {"data": (address, False), "shape": (n_samples,), "typestr": "<f4", "version": 3}


class PinnedArena:
    """A ring of pinned float32 samples; `allocate` is safe to call from any thread."""

    def __init__(self, n_samples: int, pin: bool = True):
        # pin=False only for tests on machines without CUDA: the ring works the same.
        self.tensor = torch.empty(n_samples, dtype=torch.float32, pin_memory=pin)  # [cap] host, pinned
        self.capacity = n_samples
        self._base = self.tensor.data_ptr()
        self._lock = threading.Lock()
        self._live: deque[list[int]] = deque()  # [start, n_samples, freed] in allocation order
        self._head = 0  # where the next allocation starts
        self.fallbacks = 0  # allocations that got ordinary memory (ring full)

    def allocate(self, n_samples: int) -> np.ndarray:
        """[n_samples] float32: a view of the pinned block, or ordinary memory when it is full."""
        with self._lock:
            entry = self._reserve(n_samples)
            if entry is None:
                self.fallbacks += 1
        if entry is None:
            return np.empty(n_samples, dtype=np.float32)
        # A small object owns the view: numpy views and tensors of the samples keep it alive (numpy
        # records the first non-array owner as every view's base), and its finalizer gives the range
        # back once the last of them is gone.
        owner = _Range(self._base + 4 * entry[0], n_samples)
        weakref.finalize(owner, _release, entry)
        return np.asarray(owner)

    def holds(self, samples: np.ndarray) -> bool:
        """Do these samples lie in the pinned block (so the GPU can copy them asynchronously)?"""
        address = samples.__array_interface__["data"][0]
        return self._base <= address < self._base + 4 * self.capacity

    def in_use(self) -> int:
        with self._lock:
            self._drop_freed()
            return sum(n for _, n, freed in self._live if not freed)

    def _drop_freed(self) -> None:
        """Under the lock: ranges given back at the tail of the ring become free space."""
        while self._live and self._live[0][2]:
            self._live.popleft()

    def _reserve(self, n: int) -> list[int] | None:
        if n <= 0 or n > self.capacity:
            return None
        self._drop_freed()
        if not self._live:
            self._head = 0
            start: int | None = 0
        else:
            tail = self._live[0][0]
            if self._head > tail:  # free: [head, capacity) and [0, tail)
                start = self._head if self._head + n <= self.capacity else (0 if n <= tail else None)
            else:  # wrapped: free is [head, tail)
                start = self._head if self._head + n <= tail else None
        if start is None:
            return None
        entry = [start, n, 0]
        self._live.append(entry)
        self._head = start + n
        return entry


class PendingArena:
    """A PinnedArena made on a thread of its own: page-locking a GiB takes about half a second
    (docs/GPU_NOTES.md), which `run()` spends beside the model load. Decode threads may start at
    once: their first allocation waits for the block (they would wait for the model anyway)."""

    def __init__(self, n_samples: int, pin: bool = True):
        self._arena: PinnedArena | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._make, args=(n_samples, pin), name="batchscribe-arena",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _make(self, n_samples: int, pin: bool) -> None:
        try:
            self._arena = PinnedArena(n_samples, pin)
        except BaseException as exc:  # raised by result(), on the thread that needs the arena
            self._error = exc
        finally:
            self._ready.set()

    def result(self) -> PinnedArena:
        """The arena, once made; what making it raised, raised here."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self._arena is not None
        return self._arena

    def allocate(self, n_samples: int) -> np.ndarray:
        """As PinnedArena.allocate; ordinary memory when the block could not be made (result()
        raises that for the engine, with its own context)."""
        self._ready.wait()
        if self._arena is None:
            return np.empty(n_samples, dtype=np.float32)
        return self._arena.allocate(n_samples)


_shared: dict[int, PendingArena] = {}
_shared_lock = threading.Lock()


def shared_arena(n_samples: int | None = None) -> PendingArena:
    """The process's pinned arena of `n_samples` (default: default_arena_samples()), made once, on
    a thread. Every engine and every run() of a process stages from and decodes into the same
    block, so a Transcriber reused across runs (the Python API, a warmed benchmark) never meets
    a second one. It lives as long as the process: page-locking is slow to do and to undo."""
    n = n_samples or default_arena_samples()
    with _shared_lock:
        if n not in _shared:
            _shared[n] = PendingArena(n)
        return _shared[n]


def _release(entry: list[int]) -> None:
    """A range's finalizer: marks it free, for the next allocation to reclaim. It takes no lock.
    Finalizers run wherever the last view dies, the garbage collector's runs included, and those
    happen on any allocation, also inside `allocate` with the lock held: a finalizer that waited
    for the lock there deadlocked the thread (tests/test_pinned.py). One item store is atomic."""
    entry[2] = 1
