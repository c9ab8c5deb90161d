"""The actor's one engine stream (batchscribe/ray/feed.py), without Ray: calls from several threads
into the real tiny.en on the CPU. The reference is the same transcriber's own transcribe() of the
same rows; a stand-in transcriber appears only where the engine has to fail."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from batchscribe.ray.feed import Feed


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    from batchscribe.api import Transcriber

    return Transcriber(str(tiny_en_dir), device="cpu", batch_size=4)


@pytest.fixture(scope="module")
def rows(shared_data) -> list[tuple[str, np.ndarray]]:
    import pyarrow.parquet as pq

    src = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    table = pq.read_table(src, columns=["id", "audio"]).slice(0, 8).to_pylist()
    return [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in table]


def _tokens(record: dict[str, Any]) -> list[list[int]]:
    return [s["tokens"] for s in record["segments"]]


def test_calls_from_two_threads_get_their_own_rows_records(transcriber, rows) -> None:
    want = {r["id"]: r for r in transcriber.transcribe(rows, sample_rate=16000)}
    feed, got, errors = Feed(transcriber), {}, []

    def call(part: list[tuple[str, np.ndarray]]) -> None:
        try:
            for (item_id, _), future in zip(part, feed.submit(part)):
                got[item_id] = future.result(timeout=300)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(rows[k::2],)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got.keys() == want.keys() and all(got[i]["id"] == i for i in got)
    assert {i: (r["text"], _tokens(r)) for i, r in got.items()} == {i: (r["text"], _tokens(r)) for i, r in want.items()}


def test_the_next_calls_rows_fill_slots_before_this_calls_last_record(transcriber, shared_data, rows) -> None:
    """What a stream per call cannot do: a long item of call A is still running when call B's
    short rows, admitted into the slots A's short rows freed, are done."""
    from batchscribe.audio.decode import decode_audio

    book = decode_audio(shared_data / "longform" / "librispeech-concat" / "118-47824-longform.flac")
    feed, done = Feed(transcriber), []
    first = [("book", book[: 16000 * 60]), *rows[:3]]  # one item of two seek windows and more
    futures = feed.submit(first)
    futures += feed.submit(rows[3:7])
    for (item_id, _), future in zip([*first, *rows[3:7]], futures):
        future.add_done_callback(lambda f, i=item_id: done.append(i))
    for future in futures:
        future.result(timeout=300)
    assert done.index("book") > min(done.index(i) for i, _ in rows[3:7])


def test_an_idle_feed_blocks_instead_of_spinning(transcriber, rows) -> None:
    class Counting(Feed):
        nothing = 0

        def __next__(self) -> tuple[str, np.ndarray] | None:
            row = super().__next__()
            Counting.nothing += row is None
            return row

    feed = Counting(transcriber)
    for future in feed.submit(rows[:2]):
        future.result(timeout=300)
    time.sleep(0.1)  # the engine thread's turn ends and it asks for the next row
    before = Counting.nothing
    time.sleep(0.3)
    assert Counting.nothing == before  # waiting on the condition, not returning "nothing yet"
    assert feed.submit(rows[2:3])[0].result(timeout=300)["id"] == rows[2][0]  # and wakes for new rows


class _Fails:
    """Stands in for the transcriber: takes one row, then its engine fails."""

    def transcribe_stream(self, items: Iterable[Any]) -> Iterator[dict[str, Any]]:
        next(iter(items))
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
        yield {}


def test_an_engine_failure_reaches_every_waiting_call_and_refuses_later_ones(rows) -> None:
    feed = Feed(_Fails())
    futures = feed.submit(rows[:3])
    for future in futures:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            future.result(timeout=30)
    with pytest.raises(RuntimeError, match="engine failed earlier"):
        feed.submit(rows[3:4])


def test_an_id_already_in_flight_is_refused(rows) -> None:
    feed = Feed(_Blocks())
    feed.submit(rows[:1])
    with pytest.raises(ValueError, match=rows[0][0]):
        feed.submit(rows[:1])
    with pytest.raises(ValueError, match="within this batch"):
        feed.submit([rows[1], rows[1]])
    _Blocks.release.set()


class _Blocks:
    """Stands in for the transcriber: holds every row until released."""

    release = threading.Event()

    def transcribe_stream(self, items: Iterable[Any]) -> Iterator[dict[str, Any]]:
        for row in items:
            if row is not None:
                self.release.wait(30)
                yield {"id": row[0]}
