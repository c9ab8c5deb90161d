"""The --ray driver's sizing of the Ray Data stages (no cluster)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from batchscribe.engine.sizing import CPU_SLOTS, CUDA_SLOT_CAP
from batchscribe.ray.driver import (
    CPU_ACTOR_CPUS,
    GPU_ACTOR_CPUS,
    GPU_SLOTS,
    HELD_CALL_COVER,
    RayPlan,
    _actor_pool,
    _connect,
    calls_per_actor,
    decode_tasks,
    rows_per_call,
)


@pytest.mark.parametrize(("cpus", "actor_cpus", "workers"), [(16, GPU_ACTOR_CPUS, 1), (2, CPU_ACTOR_CPUS, 2),
                                                            (64, GPU_ACTOR_CPUS, 8), (1, CPU_ACTOR_CPUS, 2)])  # fmt: skip
def test_decode_tasks_use_the_cpus_the_actors_leave(cpus: int, actor_cpus: float, workers: int) -> None:
    tasks = decode_tasks(cpus, actor_cpus, workers)
    left = cpus - actor_cpus * workers
    assert tasks >= 2  # never starved on a small machine
    assert tasks == 2 or tasks <= left < tasks + 1  # else every CPU the actors leave, and no more


def test_each_actor_runs_its_calls_at_once_and_queues_no_more() -> None:
    data = pytest.importorskip("ray.data", reason="the ray extra is not installed")
    pool = _actor_pool(data, 3, 17)
    assert (pool.min_size, pool.max_size) == (3, 3)
    assert pool.max_concurrent_calls_per_actor == 17 and pool.max_tasks_in_flight_per_actor == 17


@pytest.mark.parametrize(("gpus", "batch_size", "rows"), [(1, None, GPU_SLOTS), (1, 64, 64), (0, None, 1), (0, 4, 1)])
def test_rows_per_call_fill_the_slots_on_a_gpu_and_are_single_rows_on_the_cpu(gpus: int, batch_size: int | None,
                                                                              rows: int) -> None:  # fmt: skip
    assert rows_per_call(gpus, batch_size) == rows


@pytest.mark.parametrize(("gpus", "batch_size"), [(1, None), (1, 64), (0, None), (0, 4), (0, 1)])
def test_the_calls_beside_the_oldest_cover_the_slots_and_no_call_more(gpus: int, batch_size: int | None) -> None:
    """A call's records come back only when all its rows are done, so the rows of the calls beside
    the oldest must cover the slots (HELD_CALL_COVER times over where a call has many rows, whose
    slowest row holds it back; once for one-row calls); more would pin rows to one actor that
    another could take. The slots are the engine's own (engine/sizing.py)."""
    slots = batch_size or (CUDA_SLOT_CAP if gpus else CPU_SLOTS)
    rows, calls = rows_per_call(gpus, batch_size), calls_per_actor(gpus, batch_size)
    cover = 1 if rows == 1 else HELD_CALL_COVER
    assert (calls - 1) * rows >= cover * slots > (calls - 2) * rows


def test_a_gpu_actor_of_default_slots_runs_six_calls_of_a_slots_worth() -> None:
    """The shape measured on one GPU (benchmarks/ray_stages.py): 2 calls at once ran the actor at
    half the engine's rate, 6 within 8 % of it."""
    assert (rows_per_call(1, None), calls_per_actor(1, None)) == (GPU_SLOTS, 6)


def test_a_ray_without_concurrent_calls_gets_one_at_a_time() -> None:
    class OldRay:
        class ActorPoolStrategy:
            def __init__(self, *, size: int) -> None:  # Ray before max_concurrent_calls_per_actor
                self.size = size

    pool: Any = _actor_pool(OldRay, 2)
    assert pool.size == 2


@pytest.mark.parametrize(("address", "env", "expected"), [(None, None, "0"), (None, "1", "1"), ("auto", None, None)])
def test_a_local_cluster_reports_no_usage_stats_unless_asked(monkeypatch, address, env, expected) -> None:
    """The cluster --ray starts for one run sends Ray's usage stats nowhere by default; a user's
    RAY_USAGE_STATS_ENABLED wins, and joining a cluster (--ray ADDRESS) leaves the setting to it.
    A stand-in for ray: only what _connect calls, recording the environment ray.init would see."""
    seen: dict[str, Any] = {}

    class FakeRay:
        class data:
            class DataContext:
                enable_progress_bars = True

                @classmethod
                def get_current(cls) -> Any:
                    return cls

        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(address: str | None = None, **kwargs: Any) -> None:
            seen["env"] = os.environ.get("RAY_USAGE_STATS_ENABLED")

    if env is None:
        monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    else:
        monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", env)
    assert _connect(FakeRay, RayPlan(address, 1)) is True
    assert seen["env"] == expected
