"""The pinned arena decode threads decode into: a ring of samples given back when the last view dies."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

from batchscribe.audio.decode import decode_audio
from batchscribe.engine.pinned import PinnedArena
from tests.marks import needs_cuda


def _arena(n: int) -> PinnedArena:
    return PinnedArena(n, pin=torch.cuda.is_available())


def test_ring_allocates_in_order_wraps_and_falls_back_when_full() -> None:
    arena = _arena(100)
    a, b, c = arena.allocate(40), arena.allocate(40), arena.allocate(30)  # c does not fit: ordinary memory
    assert arena.holds(a) and arena.holds(b) and not arena.holds(c) and arena.fallbacks == 1
    assert b.__array_interface__["data"][0] - a.__array_interface__["data"][0] == 160  # contiguous, in order
    del a
    gc.collect()
    d = arena.allocate(30)  # the tail (a's range) is free again: wraps to the start
    assert arena.holds(d) and d.__array_interface__["data"][0] == arena.tensor.data_ptr()
    assert arena.allocate(20).size == 20 and arena.fallbacks == 2  # [30, 40) is too small, b still lives
    del b, d
    gc.collect()
    assert arena.in_use() == 0 and arena.holds(arena.allocate(100))


def test_range_lives_while_any_view_or_tensor_of_it_does() -> None:
    arena = _arena(64)
    samples = arena.allocate(64)
    samples[:] = np.arange(64)
    window = samples[10:20]  # what the engine slices for a window
    tensor = torch.from_numpy(samples[:5])  # what staging hands to the copy
    del samples
    gc.collect()
    assert arena.in_use() == 64 and arena.fallbacks == 0
    assert arena.allocate(1).size == 1 and arena.fallbacks == 1  # still full
    del window
    gc.collect()
    assert arena.in_use() == 64 and tensor.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    del tensor
    gc.collect()
    assert arena.in_use() == 0


def test_threads_allocate_disjoint_ranges() -> None:
    arena = _arena(4096)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for i in range(200):
            a = arena.allocate(1 + (i * k) % 37)
            a[:] = k
            if arena.holds(a):
                with lock:
                    seen.append((a.__array_interface__["data"][0], a.size))
            assert (a == k).all()  # nobody else wrote into this range while it was alive

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert len(seen) > 100 and arena.in_use() == 0


def test_a_range_freed_by_the_garbage_collector_inside_the_arena_never_deadlocks() -> None:
    """The collector runs whenever Python allocates, in whatever thread: inside `allocate`, with
    the arena's lock held, it can free the last view of another range (one in a reference cycle),
    whose finalizer gives that range back. Giving back must not wait for the lock (the likely
    cause of a W1 run that stalled for minutes on the H200, in its second configuration)."""
    arena = _arena(100)
    samples = arena.allocate(60)
    cycle: list[object] = [samples]
    cycle.append(cycle)  # only the collector frees it
    del samples, cycle
    gc.disable()  # no collection before the one below
    try:

        def allocate_while_collecting() -> None:
            with arena._lock:  # as during allocate's bookkeeping, when the collector may run
                gc.collect()

        worker = threading.Thread(target=allocate_while_collecting, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the finalizer waited for the lock its own thread holds"
    finally:
        gc.enable()
    assert arena.in_use() == 0 and arena.holds(arena.allocate(100))  # the range did come back


def test_a_pending_arena_hands_out_its_block_once_made_and_ordinary_memory_if_it_cannot_be(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """run() makes the arena on a thread beside the model load: decode threads that ask first wait
    for it and get views of its block; when pinning fails, they get ordinary memory (the items
    still decode) and the engine, asking for the arena, gets the error."""
    import batchscribe.engine.pinned as pinned

    made = threading.Event()
    real = pinned.PinnedArena

    class Slow(real):
        def __init__(self, n: int, pin: bool = True):
            made.wait(10)
            super().__init__(n, pin)

    monkeypatch.setattr(pinned, "PinnedArena", Slow)
    pending = pinned.PendingArena(64, pin=torch.cuda.is_available())
    got: list[np.ndarray] = []
    asker = threading.Thread(target=lambda: got.append(pending.allocate(16)))
    asker.start()
    asker.join(0.2)
    assert asker.is_alive() and not got  # waits for the block
    made.set()
    asker.join(10)
    arena = pending.result()
    assert isinstance(arena, real) and arena.holds(got[0]) and got[0].size == 16

    class Refused(real):
        def __init__(self, n: int, pin: bool = True):
            raise RuntimeError("cannot page-lock memory")

    monkeypatch.setattr(pinned, "PinnedArena", Refused)
    failed = pinned.PendingArena(64)
    samples = failed.allocate(8)
    assert samples.shape == (8,) and samples.dtype == np.float32
    with pytest.raises(RuntimeError, match="page-lock"):
        failed.result()


def test_decode_audio_into_the_arena(shared_data) -> None:
    """A FLAC decodes straight into the arena (decode's allocate hook), equal to a plain decode."""
    flac = (shared_data / "misc" / "jfk.flac").read_bytes()
    arena = _arena(16000 * 20)
    got = decode_audio(flac, allocate=arena.allocate)
    assert arena.holds(got) and np.array_equal(got, decode_audio(flac))


@pytest.mark.gpu
@needs_cuda
def test_decode_threads_fill_pinned_arena_and_records_are_unchanged(tiny_en_dir, shared_data, tmp_path) -> None:
    """On the GPU, `run` has decode threads decode into the engine's pinned arena by default and
    admission copies those samples as they are; the records equal runs whose audio was packed
    (threads with the arena off, and decode processes)."""
    import gc
    import json

    from batchscribe.api import Transcriber
    from batchscribe.config import DecodeOptions
    from batchscribe.run import RunOptions, run

    decode = DecodeOptions(temperatures=(0.0,))
    assert Transcriber(str(tiny_en_dir), device="cpu").host_allocator() is None
    parquet = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    texts = {}
    for threads, arena_on in ((True, None), (True, False), (False, None)):
        t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=16, decode=decode)
        out = tmp_path / f"threads-{threads}-{arena_on}"
        opts = RunOptions(model=str(tiny_en_dir), decode=decode, decode_threads=threads, workers=3, pinned_arena=arena_on)
        run([str(parquet)], out, opts, transcriber_factory=lambda _: t)
        records = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
        texts[threads, arena_on] = {r["id"]: (r["text"], [s["tokens"] for s in r["segments"]]) for r in records}
        arena = t.scheduler().engine.arena
        if threads and arena_on is None:  # every utterance fit: all of them went through the arena
            assert arena is not None and arena.fallbacks == 0
            # nothing was packed, so the staging buffers never made their packed samples
            assert [b.audio for b in t.scheduler().engine.staging.buffers] == [None, None]
            gc.collect()
            assert arena.in_use() == 0  # every range given back
        else:
            assert arena is None
    import pyarrow.parquet as pq

    assert len(texts[True, None]) == pq.read_metadata(parquet).num_rows  # one record per row, every row
    assert texts[True, None] == texts[True, False] == texts[False, None]


@pytest.mark.gpu
@needs_cuda
def test_a_transcriber_reused_across_runs_keeps_one_arena(tiny_en_dir, shared_data, tmp_path) -> None:
    """run() starts decoding into the process's pinned arena before the model loads; a Transcriber
    built beforehand (the Python API, a warmed benchmark) already stages from it, so a second and
    third run() reuse the same block (the second run used to fail: its new arena was refused)."""
    from batchscribe.api import Transcriber
    from batchscribe.audio.sources import SourceOptions
    from batchscribe.config import DecodeOptions
    from batchscribe.engine.pinned import shared_arena
    from batchscribe.run import RunOptions, run

    decode = DecodeOptions(temperatures=(0.0,))
    t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=16, decode=decode)
    t.host_allocator()
    arena = t.scheduler().engine.arena
    assert arena is shared_arena().result()
    parquet = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    opts = RunOptions(model=str(tiny_en_dir), decode=decode, source=SourceOptions(limit=8))
    for k in range(2):
        result = run([str(parquet)], tmp_path / f"run{k}", opts, transcriber_factory=lambda _: t)
        assert result.summary["this_run"]["ok"] == 8
    assert t.scheduler().engine.arena is arena
