"""Sizing rules (engine/sizing.py): buckets, slots for memory, steps per look."""

from __future__ import annotations

from batchscribe.engine.sizing import default_buckets, default_kv_buckets, slots_for_memory, steps_per_check


def test_buckets_and_slots_for_memory() -> None:
    assert default_kv_buckets(448) == [64, 160, 256, 448]
    assert default_buckets(256)[-1] == 256 and default_buckets(3) == [1, 2, 3]
    assert slots_for_memory(10 * 2**30, 2**30, fraction=0.6) == 6


def test_steps_per_check_keeps_about_two_ms_queued() -> None:
    assert steps_per_check(0.0003) == 4  # tiny.en-sized steps: capped at 4 per look
    assert steps_per_check(0.0007) == 3
    assert steps_per_check(0.001) == 2
    assert steps_per_check(0.025) == 1  # large-v3-sized steps: look after every one
    assert steps_per_check(0.0) == 4
