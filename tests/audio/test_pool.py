"""The decoding pool: input order, bad items as error records, bounded prefetch, worker crashes.

Real decoding is checked against soundfile reading the same FLAC bytes; the ordering, bounding
and crash tests use tiny module-level decoders (workers import them by name).
"""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from batchscribe.audio.pool import DecodedItem, decode_stream
from batchscribe.audio.sources import SourceItem

TEST_OTHER = "librispeech/test-other-subset-00000-of-00001.parquet"
CRASH = b"crash me"


def _bytes_decoder(data: bytes | str) -> np.ndarray:
    """Narrow stand-in: the payload bytes as samples; raises on b"bad", kills its process on CRASH."""
    if data == CRASH:
        os.kill(os.getpid(), signal.SIGSEGV)  # what a crashing native decoder does to a worker
    if data == b"bad":
        raise ValueError("undecodable payload")
    assert isinstance(data, bytes)
    return np.frombuffer(data, dtype=np.uint8).astype(np.float32)


def _items(payloads: list[bytes]) -> list[SourceItem]:
    return [SourceItem(f"item{i}", p, None, f"text{i}", {"n": i}) for i, p in enumerate(payloads)]


@pytest.fixture(scope="module")
def flac_rows(shared_data: Path) -> list[dict]:
    table = pq.ParquetFile(shared_data / TEST_OTHER).read_row_group(0, columns=["id", "audio", "text"])
    return table.slice(0, 8).to_pylist()


@pytest.mark.parametrize("workers,threads,thread_chunk", [(0, False, 1), (2, False, 1), (3, True, 1), (3, True, 4)])
def test_real_decoding_in_order_with_bad_items(flac_rows: list[dict], tmp_path: Path, workers: int, threads: bool,
                                               thread_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from batchscribe.audio import pool

    monkeypatch.setattr(pool, "THREAD_CHUNK_ITEMS", thread_chunk)  # decode threads take tasks of several items
    tasks: list[int] = []
    decode_many = pool.decode_many
    if threads:
        monkeypatch.setattr(pool, "decode_many", lambda chunk, *a: tasks.append(len(chunk)) or decode_many(chunk, *a))
    items = [SourceItem(r["id"], r["audio"]["bytes"], r["audio"]["path"], r["text"], {}) for r in flac_rows]
    items[2] = SourceItem("garbage", b"\x00not audio at all" * 50, None, None, {})
    items[4] = SourceItem("truncated-header", flac_rows[4]["audio"]["bytes"][:20], None, None, {})
    items[6] = SourceItem("missing-file", None, str(tmp_path / "nowhere.flac"), None, {})
    items.append(SourceItem("no-audio", None, None, None, {}))
    if thread_chunk > 1:  # enough items that tasks grow once the first results show their size
        items += [SourceItem(f"{r['id']}-{k}", r["audio"]["bytes"], r["audio"]["path"], r["text"], {})
                  for k in range(3) for r in flac_rows]  # fmt: skip
    # A view of a buffer, as Parquet sources give (decoded in place by threads, copied for processes).
    items[1] = SourceItem(items[1].id, memoryview(items[1].audio_bytes or b""), items[1].path, items[1].text, {})

    out = list(decode_stream(items, workers=workers, prefetch=3 if thread_chunk == 1 else 8, threads=threads))

    assert [d.id for d in out] == [i.id for i in items]
    if threads:
        assert sum(tasks) == len(items) and (max(tasks) > 1) == (thread_chunk > 1) and max(tasks) <= thread_chunk
    bad = {"garbage", "truncated-header", "missing-file", "no-audio"}
    for item, dec in zip(items, out):
        if item.id in bad:
            assert dec.audio is None and dec.error is not None and dec.error.startswith(f"{item.id}: ")
            continue
        assert dec.error is None and dec.text == item.text and dec.source_path == item.path
        reference, rate = sf.read(io.BytesIO(bytes(item.audio_bytes or b"")), dtype="float32")
        assert rate == 16000
        assert dec.audio is not None and dec.audio.dtype == np.float32 and dec.audio.shape == reference.shape
        np.testing.assert_allclose(dec.audio, reference, atol=1e-6)


@pytest.mark.parametrize("threads", [True, False])
def test_decoded_samples_die_with_their_last_reference(threads: bool) -> None:
    """Reference counting alone frees what the stream yielded once the consumer lets go, with the
    garbage collector off: no reference cycle (a task and its future's callback made one) keeps
    decoded samples alive until the collector's next run. A GPU run's samples live in its pinned
    ring, which can take new items only as earlier ones die."""
    payloads = [bytes([i]) * 50 for i in range(40)]
    gc.collect()
    gc.disable()
    try:
        seen: list[weakref.ref] = []
        for d in decode_stream(_items(payloads), workers=2, prefetch=6, decoder=_bytes_decoder, threads=threads):
            seen.append(weakref.ref(d.audio))
        del d
        alive = [i for i, ref in enumerate(seen) if ref() is not None]
    finally:
        gc.enable()
    assert len(seen) == 40 and alive == []


def test_order_and_errors_inline_equals_pooled() -> None:
    payloads = [bytes([i]) * (i % 5 + 1) for i in range(30)]
    payloads[11] = b"bad"
    pooled = list(decode_stream(_items(payloads), workers=2, prefetch=5, decoder=_bytes_decoder))
    inline = list(decode_stream(_items(payloads), workers=0, decoder=_bytes_decoder))
    for got in (pooled, inline):
        assert [d.id for d in got] == [f"item{i}" for i in range(30)]
        assert got[11].audio is None and got[11].error == "item11: ValueError: undecodable payload"
        for i, d in enumerate(got):
            if i != 11:
                assert d.error is None and d.audio is not None
                np.testing.assert_array_equal(d.audio, np.frombuffer(payloads[i], np.uint8).astype(np.float32))
                assert d.extra == {"n": i} and d.text == f"text{i}"


def test_worker_crash_costs_only_that_item() -> None:
    payloads = [bytes([i]) * 4 for i in range(14)]
    crashers = {5, 6, 11}  # two in the same in-flight window, one after the pool was replaced
    for i in crashers:
        payloads[i] = CRASH
    out = list(decode_stream(_items(payloads), workers=2, prefetch=4, decoder=_bytes_decoder))
    assert [d.id for d in out] == [f"item{i}" for i in range(14)]
    for i, d in enumerate(out):
        if i in crashers:
            assert d.audio is None and d.error is not None
            assert d.error.startswith(f"item{i}: the decoder process died")
        else:
            assert d.error is None and d.audio is not None and d.audio[0] == i


def test_prefetch_bounds_items_in_flight() -> None:
    pulled = 0

    def source() -> Iterator[SourceItem]:
        nonlocal pulled
        for item in _items([bytes([i]) for i in range(40)]):
            pulled += 1
            yield item

    prefetch = 6
    seen_ahead = []
    stream: Iterator[DecodedItem] = decode_stream(source(), workers=1, prefetch=prefetch, decoder=_bytes_decoder)
    for k, _ in enumerate(stream):
        seen_ahead.append(pulled - k)  # items pulled but not yet handed to the caller (incl. this one)
        time.sleep(0.01)  # a slow consumer: the pool runs ahead until prefetch stops it
    assert max(seen_ahead) == prefetch
    assert len(seen_ahead) == 40


def test_early_close_shuts_down() -> None:
    stream = decode_stream(_items([b"x"] * 100), workers=2, prefetch=8, decoder=_bytes_decoder)
    assert next(stream).id == "item0"
    stream.close()  # must not hang or leave the pool running


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="prefetch=0"):
        list(decode_stream([], workers=1, prefetch=0))
    with pytest.raises(ValueError, match="workers=-1"):
        list(decode_stream([], workers=-1))


def test_streaming_memory_is_flat(shared_data: Path) -> None:
    """Peak RSS for all 838 train-clean-5 rows within 20% of 100 rows (the benchmark, ~15 s)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_streaming.py"
    proc = subprocess.run([sys.executable, str(script), "--rows", "100", "838", "--workers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line.split() for line in proc.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in table] == [(100, 100, 0), (838, 838, 0)]
    small, large = float(table[0][-1]), float(table[1][-1])
    assert large <= 1.2 * small, proc.stdout


def _big_decoder(data: bytes | str) -> np.ndarray:
    """Narrow stand-in for hours-long audio: 1 MB of samples per item."""
    return np.zeros(1 << 18, dtype=np.float32)


def test_byte_budget_bounds_long_audio() -> None:
    pulled = 0

    def source() -> Iterator[SourceItem]:
        nonlocal pulled
        for item in _items([b"x"] * 30):
            pulled += 1
            yield item

    ahead = []
    stream = decode_stream(source(), workers=2, prefetch=64, decoder=_big_decoder, max_buffered_bytes=3 << 20)
    for k, dec in enumerate(stream):
        time.sleep(0.01)  # a slow consumer: decoded results pile up unless the budget stops them
        assert dec.audio is not None and dec.audio.nbytes == 1 << 20
        ahead.append(pulled - k)
    # At most the budget (3 items) done and waiting plus 2 per worker handed out (4) being decoded.
    assert len(ahead) == 30 and max(ahead) <= 3 + 4


def test_worker_processes_hand_audio_back_through_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Process workers leave decoded samples in a spill folder and send only the path; the main
    process reads them back exactly, and the folder is gone after the run, after a worker crash
    (whatever it left half-written) and after an early close. Without room to spill, the samples
    still arrive, through the pipe."""
    from batchscribe.audio import worker

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(worker, "RAM_DIR", str(spill))
    # What a killed run leaves behind (its process is gone), and a live process's folder.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (spill / f"batchscribe-decoded-{dead.pid}-abc").mkdir()
    (spill / f"batchscribe-decoded-{dead.pid}-abc" / "x.f32").write_bytes(b"\0" * 8)
    (spill / f"batchscribe-decoded-{os.getppid()}-live").mkdir()
    spilled: list[object] = []
    real = worker.unspill
    monkeypatch.setattr(worker, "unspill", lambda audio: spilled.append(audio) or real(audio))
    payloads = [bytes([i]) * (100 + i) for i in range(12)]
    payloads[7] = CRASH
    out = list(decode_stream(_items(payloads), workers=2, prefetch=4, decoder=_bytes_decoder))
    assert [d.id for d in out] == [f"item{i}" for i in range(12)]
    for i, d in enumerate(out):
        if i == 7:
            assert d.audio is None and d.error.startswith("item7: the decoder process died")
        else:
            np.testing.assert_array_equal(d.audio, np.frombuffer(payloads[i], np.uint8).astype(np.float32))
    assert sum(isinstance(a, worker.Spilled) for a in spilled) == 11
    # The run's folder and every file in it removed, the killed run's swept, the live one kept.
    assert [p.name for p in spill.iterdir()] == [f"batchscribe-decoded-{os.getppid()}-live"]
    (spill / f"batchscribe-decoded-{os.getppid()}-live").rmdir()

    stream = decode_stream(_items([b"x" * 64] * 50), workers=2, prefetch=8, decoder=_bytes_decoder)
    next(stream)
    stream.close()
    assert list(spill.iterdir()) == []

    full = tmp_path / "full"  # a spill folder that cannot be written: samples come through the pipe
    monkeypatch.setattr(worker, "RAM_DIR", str(full))
    full.mkdir()
    monkeypatch.setattr(worker.tempfile, "mkdtemp", lambda **kw: str(full / "gone"))
    spilled.clear()
    out = list(decode_stream(_items(payloads[:3]), workers=2, prefetch=4, decoder=_bytes_decoder))
    assert [d.audio.size for d in out] == [100, 101, 102]
    assert spilled and not any(isinstance(a, worker.Spilled) for a in spilled)


def test_default_worker_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unless told, processes number cores - 1, and threads (the GPU path) three quarters of the
    cores, at most 12."""
    from batchscribe.audio import pool

    made: list[tuple[int, bool]] = []
    real = pool._new_pool
    monkeypatch.setattr(pool, "_new_pool", lambda workers, threads=False: made.append((workers, threads)) or real(workers, threads))
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 32)
    for threads in (True, False):
        list(decode_stream(_items([b"ab"]), threads=threads, decoder=_bytes_decoder))
    assert made == [(12, True), (31, False)]
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 6)
    assert pool.decode_threads_default() == 4 and pool.default_workers() == 5
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 2)
    assert pool.decode_threads_default() == 1 and pool.default_workers() == 1


def test_worker_processes_take_short_items_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes get short items in chunks once decoded sizes are known (each task's round trip
    costs the main process the same whatever it carries), at most MAX_CHUNK_ITEMS; threads get one
    item per task (THREAD_CHUNK_ITEMS; faster beside a GPU engine). Order, samples and the item
    count are unchanged."""
    from batchscribe.audio import pool

    sizes: dict[bool, list[int]] = {True: [], False: []}
    real = pool._new_pool

    def counting(workers: int, threads: bool = False):
        executor = real(workers, threads)
        submit = executor.submit

        def spy(fn, chunk, *args):
            sizes[threads].append(len(chunk))
            return submit(fn, chunk, *args)

        executor.submit = spy
        return executor

    monkeypatch.setattr(pool, "_new_pool", counting)
    payloads = [bytes([i % 251]) * (40 + i % 7) for i in range(200)]
    for threads in (False, True):
        out = list(decode_stream(_items(payloads), workers=2, prefetch=64, decoder=_bytes_decoder, threads=threads))
        assert [d.id for d in out] == [f"item{i}" for i in range(200)]
        for d, p in zip(out, payloads):
            np.testing.assert_array_equal(d.audio, np.frombuffer(p, np.uint8).astype(np.float32))
    assert sum(sizes[False]) == 200 and sizes[False][0] == 1 and max(sizes[False]) == 16
    assert pool.THREAD_CHUNK_ITEMS == 1 and sizes[True] == [1] * 200



def test_workers_that_cannot_start_stop_the_stream_instead_of_blaming_each_item(tmp_path: Path) -> None:
    """A script that decodes without a main guard: multiprocessing runs it again in each worker,
    where it fails. Every item used to get "the audio is probably corrupt" and the run ended
    complete with nothing transcribed; the stream now raises, naming the guard."""
    clip = Path(__file__).resolve().parents[2] / "batchscribe" / "demo" / "sense_and_sensibility_01_austen_64kb-0870.flac"
    script = tmp_path / "no_guard.py"
    script.write_text(textwrap.dedent(f"""
        from batchscribe.audio.pool import DecodeWorkersError, decode_stream
        from batchscribe.audio.sources import SourceItem

        data = open({str(clip)!r}, "rb").read()
        try:
            out = list(decode_stream([SourceItem("a", data, None, None), SourceItem("b", data, None, None)], workers=1))
            print("decoded:", [d.error for d in out])
        except DecodeWorkersError as exc:
            print("refused:", exc)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "refused:" in proc.stdout and '__name__ == "__main__"' in proc.stdout, proc.stdout + proc.stderr
    guarded = tmp_path / "guarded.py"
    body = script.read_text().split("data = ", 1)
    guarded.write_text(body[0] + 'if __name__ == "__main__":\n' + textwrap.indent("data = " + body[1], "    "))
    proc = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "decoded: [None, None]", proc.stdout + proc.stderr
