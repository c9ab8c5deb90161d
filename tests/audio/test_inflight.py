"""The pool's bookkeeping: how many items a task takes."""

from __future__ import annotations

import numpy as np

from batchscribe.audio.inflight import ChunkSizer


def test_chunk_sizer_fits_the_budget_share() -> None:
    sizer = ChunkSizer(chunk_bytes=8000, most=16)
    assert sizer.items() == 1  # nothing decoded yet: one item per task
    sizer.observe([(np.zeros(250, np.float32), None), (None, "bad")])  # 1,000 bytes per item
    assert sizer.items() == 8
    sizer.observe([(np.zeros(10, np.float32), None)] * 100)
    assert sizer.items() == 16  # small items: capped
    big = ChunkSizer(chunk_bytes=8000, most=16)
    big.observe([(np.zeros(1 << 20, np.float32), None)])
    assert big.items() == 1  # an item larger than the share still travels alone
    assert ChunkSizer(chunk_bytes=8000, most=1).items() == 1
