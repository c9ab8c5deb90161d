"""What the Triton kernels share (attention/triton_common): how a row's keys split over programs."""

from __future__ import annotations

from batchscribe.attention.triton_common import split_for
from batchscribe.attention.triton_cross import CrossConfig


def test_split_for_fills_the_gpu_but_keeps_two_blocks_per_split() -> None:
    cfg = CrossConfig(block_n=128, min_programs=1024, max_split=8)
    assert split_for(256, 20, 1500, cfg) == 1  # 5,120 programs already
    assert split_for(16, 20, 1500, cfg) == 4  # 320 programs: 4 x
    assert split_for(1, 6, 1500, cfg) == 5  # capped so that each split keeps >= 2 blocks of 128
    assert split_for(1, 6, 300, cfg) == 1
