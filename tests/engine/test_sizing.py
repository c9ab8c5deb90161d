"""Sizing rules (engine/sizing.py): buckets, slots for memory, steps per look."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscribe.engine import sizing
from batchscribe.engine.sizing import bucket_for, default_buckets, default_kv_buckets, slots_for_memory, steps_per_check


def test_buckets_and_slots_for_memory() -> None:
    assert default_kv_buckets(448) == [64, 160, 256, 448]
    assert default_buckets(256)[-1] == 256 and default_buckets(3) == [1, 2, 3]
    assert slots_for_memory(10 * 2**30, 2**30, fraction=0.6) == 6


def test_a_count_runs_the_smallest_bucket_that_holds_it() -> None:
    buckets = default_buckets(200)
    for n in range(1, 201):
        width = bucket_for(buckets, n)
        assert width >= n and width in buckets
        assert all(b < n for b in buckets if b < width)  # no smaller bucket would hold it
    assert bucket_for(default_kv_buckets(448), 161) == 256


def test_steps_per_check_keeps_about_two_ms_queued() -> None:
    assert steps_per_check(0.0003) == 4  # tiny.en-sized steps: capped at 4 per look
    assert steps_per_check(0.0007) == 3
    assert steps_per_check(0.001) == 2
    assert steps_per_check(0.025) == 1  # large-v3-sized steps: look after every one
    assert steps_per_check(0.0) == 4


def test_the_audio_budget_is_a_quarter_of_the_machine_split_among_its_engines(monkeypatch) -> None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        pytest.skip("no /proc/meminfo here to check the machine's memory against")
    ram = int(meminfo.read_text().split("\n")[0].split()[1]) * 1024  # MemTotal: N kB
    assert sizing.host_memory_bytes() == ram
    assert sizing.host_audio_bytes() == ram // 4
    assert sizing.host_audio_bytes(engines=8) == ram // 4 // 8
    monkeypatch.setattr(sizing, "host_memory_bytes", lambda: 64 << 30)
    assert sizing.host_audio_bytes(engines=2) == 8 << 30


def test_gpus_on_this_machine_counts_the_drivers_entries(tmp_path: Path) -> None:
    proc = tmp_path / "gpus"
    assert sizing.gpus_on_this_machine(str(proc)) == 1  # no NVIDIA driver: one engine
    for bus in ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"):
        (proc / bus).mkdir(parents=True)
    assert sizing.gpus_on_this_machine(str(proc)) == 3
