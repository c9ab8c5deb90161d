"""--gpus planning without CUDA: device parsing, which ids each child writes, what a stopped child
means. The reference for the split is `shard_of` itself: the children of part i of S must hold
exactly the ids a plain `--num-shards S --shard-index i` run holds, each once."""

from __future__ import annotations

import pytest

from batchscribe.audio.sources import shard_of
from batchscribe.config import ConfigError, EngineOptions
from batchscribe.fleet.plan import MAX_RESTARTS, child_options, child_workers, on_exit, parse_gpus, plan_children
from batchscribe.run import RunOptions
from batchscribe.audio.sources import SourceOptions

IDS = [f"spk{k // 7}-utt{k:04d}" for k in range(3000)]


def test_parse_gpus_all_count_and_list() -> None:
    assert parse_gpus("all", 8) == tuple(range(8))
    assert parse_gpus("3", 8) == (0, 1, 2)
    assert parse_gpus("0,1,3", 4) == (0, 1, 3)
    assert parse_gpus(" 2 ", 2) == (0, 1)


@pytest.mark.parametrize(("spec", "available", "says"), [
    ("all", 0, "no CUDA GPU"), ("1", 0, "no CUDA GPU"),
    ("9", 8, "this host has 8 GPU(s)"), ("0,8", 8, "index 8 does not exist"),
    ("0,0", 2, "listed twice"), ("0", 2, "count >= 1"), ("two", 2, "not all, a count or a list"),
])  # fmt: skip
def test_parse_gpus_usage_errors_name_the_value_and_fix(spec: str, available: int, says: str) -> None:
    with pytest.raises(ConfigError, match="--gpus") as info:
        parse_gpus(spec, available)
    assert says in str(info.value)


@pytest.mark.parametrize(("num_shards", "shard_index", "n_children"), [(1, 0, 1), (1, 0, 2), (1, 0, 8), (3, 2, 4)])
def test_children_split_exactly_the_parents_part(num_shards: int, shard_index: int, n_children: int) -> None:
    children = plan_children([f"cuda:{k}" for k in range(n_children)], num_shards, shard_index)
    parent = {i for i in IDS if shard_of(i, num_shards) == shard_index}
    parts = [{i for i in IDS if shard_of(i, c.num_shards) == c.shard_index} for c in children]
    assert sum(len(p) for p in parts) == len(parent)  # nothing twice
    assert set().union(*parts) == parent  # nothing lost, nothing from another part
    assert len({c.prefix for c in children}) == n_children  # each child its own writer
    assert all(p for p in parts)  # every GPU has work


def test_one_child_of_an_unsplit_run_is_the_plain_writer() -> None:
    """--gpus 1 writes what a plain run writes (prefix `records`): either resumes the other."""
    (child,) = plan_children(["cuda:0"])
    assert (child.num_shards, child.shard_index, child.prefix, child.cuda_index) == (1, 0, "records", 0)


def test_child_options_set_device_part_and_leave_overwrite_to_the_parent() -> None:
    opts = RunOptions(overwrite=True, source=SourceOptions(num_shards=2, shard_index=1, limit=5))
    child = plan_children(["cuda:0", "cuda:1"], 2, 1)[1]
    got = child_options(opts, child, 2)
    assert (got.source.num_shards, got.source.shard_index, got.source.limit) == (4, 3, 5)
    assert got.engine.device == "cuda:0" and got.overwrite is False  # the one GPU it sees: CUDA_VISIBLE_DEVICES=1
    assert child_options(opts, plan_children(["cpu", "cpu"])[1], 2).engine.device == "cpu"


def test_children_share_the_decoded_audio_budget(monkeypatch) -> None:
    """The children of one run share the machine's memory: each holds its part of the budget."""
    from batchscribe.engine import sizing

    monkeypatch.setattr(sizing, "host_memory_bytes", lambda: 64 << 30)
    children = plan_children(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], 1, 0)
    assert child_options(RunOptions(), children[0], 4).engine.audio_memory == (64 << 30) // 4 // 4
    given = RunOptions(engine=EngineOptions(audio_memory=8 << 30))
    assert child_options(given, children[3], 4).engine.audio_memory == 2 << 30


def test_decode_workers_are_shared_between_gpu_children() -> None:
    assert child_workers(None, 4, on_cuda=True, cpus=32) == 6  # 24 threads shared by 4
    assert child_workers(None, 2, on_cuda=True, cpus=32) == 12  # each child's own cap, not 12 in all
    assert child_workers(None, 8, on_cuda=True, cpus=128) == 12
    assert child_workers(None, 2, on_cuda=True, cpus=16) == 6
    assert child_workers(None, 8, on_cuda=True, cpus=4) == 1
    assert child_workers(5, 4, on_cuda=True) == 5  # the user's value as given
    assert child_workers(None, 2, on_cuda=False) is None  # the CPU default of each run


def test_what_a_stopped_child_means() -> None:
    assert on_exit(0, 0, stopping=False).action == "done"
    assert on_exit(-9, 0, stopping=False).action == "restart"  # SIGKILL, the OOM killer
    assert on_exit(-11, MAX_RESTARTS - 1, stopping=False).action == "restart"
    assert on_exit(-9, MAX_RESTARTS, stopping=False).action == "fail"  # a crash that repeats on resume
    assert on_exit(143, 0, stopping=False).action == "restart"  # stopped by someone else: resume
    assert (on_exit(2, 0, stopping=False).action, on_exit(2, 0, stopping=False).code) == ("fail", 2)  # usage
    assert on_exit(1, 0, stopping=False).action == "fail"  # --max-errors, disk full: would repeat
    assert on_exit(143, 0, stopping=True).action == "done"  # the parent stopped it: never restarted
