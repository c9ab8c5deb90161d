"""The --ray driver's sizing of the Ray Data stages (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from batchscribe.ray.driver import CPU_ACTOR_CPUS, GPU_ACTOR_CPUS, _actor_pool, decode_tasks


@pytest.mark.parametrize(("cpus", "actor_cpus", "workers"), [(16, GPU_ACTOR_CPUS, 1), (2, CPU_ACTOR_CPUS, 2),
                                                            (64, GPU_ACTOR_CPUS, 8), (1, CPU_ACTOR_CPUS, 2)])  # fmt: skip
def test_decode_tasks_use_the_cpus_the_actors_leave(cpus: int, actor_cpus: float, workers: int) -> None:
    tasks = decode_tasks(cpus, actor_cpus, workers)
    left = cpus - actor_cpus * workers
    assert tasks >= 2  # never starved on a small machine
    assert tasks == 2 or tasks <= left < tasks + 1  # else every CPU the actors leave, and no more


def test_each_gpu_actor_runs_two_calls_at_once_and_queues_no_more() -> None:
    data = pytest.importorskip("ray.data", reason="the ray extra is not installed")
    pool = _actor_pool(data, 3, gpus=1)
    assert (pool.min_size, pool.max_size) == (3, 3)
    assert pool.max_concurrent_calls_per_actor == 2 and pool.max_tasks_in_flight_per_actor == 2
    cpu = _actor_pool(data, 2, gpus=0)
    assert (cpu.min_size, cpu.max_size, cpu.max_concurrent_calls_per_actor) == (2, 2, None)  # one at a time


def test_a_ray_without_concurrent_calls_gets_one_at_a_time() -> None:
    class OldRay:
        class ActorPoolStrategy:
            def __init__(self, *, size: int) -> None:  # Ray before max_concurrent_calls_per_actor
                self.size = size

    pool: Any = _actor_pool(OldRay, 2, gpus=1)
    assert pool.size == 2
