"""read_ahead: order kept, the source's error raised in the consumer, the source closed on an early stop."""

from __future__ import annotations

import pytest

from batchscribe.audio.read_ahead import read_ahead


def test_read_ahead_keeps_order_raises_and_stops_early() -> None:
    assert list(read_ahead(iter(range(500)), depth=7)) == list(range(500))

    def failing():
        yield 1
        raise RuntimeError("source broke")

    got = []
    with pytest.raises(RuntimeError, match="source broke"):
        for value in read_ahead(failing(), depth=2):
            got.append(value)
    assert got == [1]

    closed = []

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.append(True)

    stream = read_ahead(endless(), depth=3)
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.close()  # the consumer stops early: the producer ends and closes its source
    assert closed == [True]


def test_read_ahead_starts_at_once_and_a_stream_never_read_still_closes_its_source() -> None:
    """run() starts decoding while the model loads: the thread pulls `depth` items (plus the one it
    holds) before anyone asks, and a stream closed before its first next() (a model that failed to
    load) still ends the thread and closes the source, so a decode pool never outlives the run."""
    import threading
    import time

    pulled: list[int] = []
    closed = threading.Event()

    def source():
        try:
            for i in range(100):
                pulled.append(i)
                yield i
        finally:
            closed.set()

    stream = read_ahead(source(), depth=4)
    deadline = time.monotonic() + 10
    while len(pulled) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(pulled) == 5  # 4 queued and 1 waiting to be put: bounded by depth, started unasked
    stream.close()
    assert closed.is_set()
    with pytest.raises(StopIteration):
        next(stream)


def test_read_ahead_bounds_the_bytes_waiting_as_well_as_their_count() -> None:
    """Items of 3 units under a bound of 10: three wait (a fourth would pass it) however deep the
    queue, each taken frees room for the next, and an item heavier than the whole bound still goes
    through alone. The order and the items are unchanged."""
    import time

    pulled: list[int] = []
    sizes = [3] * 8 + [25] + [3] * 3

    def source():
        for i, size in enumerate(sizes):
            pulled.append(i)
            yield (i, size)

    def settled(n: int) -> int:
        deadline = time.monotonic() + 10
        while len(pulled) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # would it pull more?
        return len(pulled)

    stream = read_ahead(source(), depth=100, max_bytes=10, weigh=lambda item: item[1])
    assert settled(4) == 4  # 3 queued (9 units) and the 4th waiting for room
    assert next(stream) == (0, 3)
    assert settled(5) == 5  # room for one more
    got = [(0, 3)]
    got += [next(stream) for _ in range(7)]  # items 1..7
    assert settled(10) == 10  # item 8 (25 units) alone in the queue, item 9 waits behind it
    got += list(stream)
    assert got == [(i, size) for i, size in enumerate(sizes)]
    with pytest.raises(ValueError, match="go together"):
        read_ahead(iter(()), depth=1, max_bytes=10)
