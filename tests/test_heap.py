"""stream_collector: the objects alive when a stream starts are out of the collector's scans and the
youngest generation is collected rarely while it runs; both are as they were after; a heap frozen by
someone else stays theirs."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from batchscribe.heap import STREAM_GEN0, stream_collector


@pytest.fixture(autouse=True)
def _thawed():
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_what_lived_before_is_frozen_inside_and_collectable_after() -> None:
    gc.set_threshold(700, 10, 10)
    before = [[] for _ in range(10)]  # tracked containers alive at the start
    with stream_collector():
        frozen = gc.get_freeze_count()
        assert frozen >= len(before)
        assert gc.get_threshold() == (STREAM_GEN0, 10, 10)
        young = [[] for _ in range(1000)]
        # Made inside: not frozen, collected as usual. (Frozen objects that another thread lets go
        # of meanwhile leave the permanent generation: the count may fall, never rise by these.)
        assert gc.get_freeze_count() <= frozen
        cycle = [young]  # a cycle made inside is still garbage the collector finds
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_of_the_callers_is_kept() -> None:
    gc.set_threshold(10 * STREAM_GEN0, 5, 5)
    with stream_collector():
        assert gc.get_threshold() == (10 * STREAM_GEN0, 5, 5)


def test_an_error_inside_still_restores_the_collector() -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(ValueError), stream_collector():
        assert gc.get_freeze_count() > 0
        raise ValueError("boom")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)


def test_a_heap_frozen_by_the_caller_stays_as_they_set_it() -> None:
    gc.set_threshold(700, 10, 10)
    gc.freeze()
    theirs = gc.get_freeze_count()
    fresh = [[] for _ in range(1000)]  # not frozen: a second freeze on entry would take them in
    with stream_collector():
        assert gc.get_threshold() == (700, 10, 10)
        # Neither frozen again (+1,000) nor unfrozen (0). Frozen objects another thread lets go of
        # meanwhile (an earlier test's) leave the permanent generation: the count may fall a little.
        assert theirs - 500 < gc.get_freeze_count() <= theirs
    assert theirs - 500 < gc.get_freeze_count() <= theirs
    del fresh


def test_a_stream_runs_under_it_and_restores_the_collector_when_it_ends(tiny_en_dir: Path) -> None:
    """The real engine's stream (tiny.en on the CPU): frozen while records come, restored after."""
    from batchscribe.api import Transcriber

    gc.set_threshold(700, 10, 10)
    transcriber = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2)
    seen = []
    for record in transcriber.transcribe_stream([("a", np.zeros(16000, np.float32)), ("b", np.zeros(8000, np.float32))]):
        seen.append((record["id"], gc.get_freeze_count(), gc.get_threshold()[0]))
    assert sorted(i for i, _, _ in seen) == ["a", "b"]
    assert all(count > 0 and gen0 == STREAM_GEN0 for _, count, gen0 in seen)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)
