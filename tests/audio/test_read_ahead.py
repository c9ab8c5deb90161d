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
