"""The alignment queue's rule: whole batches go at once, a bucket's remainder after `max_age`
collects or when forced, always in the order the windows came."""

from __future__ import annotations

from batchscribe.engine.align_queue import AlignQueue, Held
from batchscribe.engine.alignment import AlignWindow


class _Buckets:
    """An Aligner's two properties the queue reads: buckets by text length, the batch size."""

    def __init__(self, max_batch: int):
        self.max_batch = max_batch

    def bucket(self, window: AlignWindow) -> int:
        return 64 if len(window.text_tokens) < 60 else 128


def _held(key: int, n_text: int = 10) -> Held:
    return Held(key, None, AlignWindow(key, (1, 2, 3), (5,) * n_text, 3000))


def _keys(held: list[Held]) -> list[int]:
    return [h.key for h in held]


def test_whole_batches_go_at_once_and_the_rest_after_max_age_collects() -> None:
    queue = AlignQueue(_Buckets(4), max_age=2)
    for k in range(6):
        queue.add(_held(k))
    assert _keys(queue.take()) == [0, 1, 2, 3]  # one whole batch; 4 and 5 wait
    assert len(queue) == 2
    queue.add(_held(6))
    assert queue.take() == []  # 4 and 5 have waited one collect
    assert _keys(queue.take()) == [4, 5, 6]  # two: the oldest is due, the bucket goes whole
    assert len(queue) == 0 and queue.take() == []


def test_a_filled_bucket_goes_before_its_oldest_is_due() -> None:
    queue = AlignQueue(_Buckets(3), max_age=5)
    queue.add(_held(0))
    assert queue.take() == []
    queue.add(_held(1))
    queue.add(_held(2))
    queue.add(_held(3))
    assert _keys(queue.take()) == [0, 1, 2]
    # 3 came a collect later than 0: its own age counts from then.
    for _ in range(4):
        assert queue.take() == []
    assert _keys(queue.take()) == [3]


def test_buckets_wait_apart_and_leave_in_the_order_added() -> None:
    queue = AlignQueue(_Buckets(2), max_age=1)
    queue.add(_held(0, n_text=100))  # bucket 128
    queue.add(_held(1))  # bucket 64
    queue.add(_held(2, n_text=100))  # bucket 128: a whole batch with 0
    assert _keys(queue.take()) == [0, 2]
    queue.add(_held(3))  # bucket 64 again: 1 and 3 make a batch
    queue.add(_held(4, n_text=100))
    assert _keys(queue.take()) == [1, 3]
    assert _keys(queue.take()) == [4]  # waited one collect: due


def test_force_sends_everything_and_max_age_zero_holds_nothing() -> None:
    queue = AlignQueue(_Buckets(16), max_age=10)
    for k in (0, 1, 2):
        queue.add(_held(k, n_text=100 if k == 1 else 10))
    assert queue.take() == []
    assert _keys(queue.take(force=True)) == [0, 1, 2]
    at_once = AlignQueue(_Buckets(16), max_age=0)
    at_once.add(_held(7))
    assert _keys(at_once.take()) == [7]


def test_a_smaller_batch_after_out_of_memory_is_followed() -> None:
    """Aligner.submit halves max_batch when the pass runs out of memory: the queue reads it each time."""
    aligner = _Buckets(8)
    queue = AlignQueue(aligner, max_age=3)
    for k in range(5):
        queue.add(_held(k))
    assert queue.take() == []
    aligner.max_batch = 2
    assert _keys(queue.take()) == [0, 1, 2, 3]
    assert len(queue) == 1
