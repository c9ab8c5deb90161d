"""Planning a `--gpus` run: which devices, which ids each child writes, and what a stopped child
means. Pure (no processes, no CUDA): the tests plan over CPU "devices".

A child is one writer of the folder (output/lock.py): child k of G, in a run that is itself part i
of S (`--num-shards S --shard-index i`), runs as part i + S*k of S*G. Because shard_of is a hash
modulo the count, `h % (S*G) = i + S*k` implies `h % S = i`: the children split exactly the ids of
part i, nothing outside it and nothing twice. The children's run configs record `num_shards` S*G,
so a rerun with another GPU count (or without --gpus) is refused by the usual settings check
rather than mixing two splits in one folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

from batchscribe.config import ConfigError
from batchscribe.engine.sizing import host_audio_bytes
from batchscribe.output.resume import output_prefix
from batchscribe.run import RunOptions

# A child that dies this many times (without the run being stopped) fails the run: a crash that
# repeats on resume (a poisoned item, a bad GPU) would otherwise loop forever.
MAX_RESTARTS = 3
# Exit codes a child may end with (those of the CLI, cli/app.py).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143


def parse_gpus(spec: str, available: int) -> tuple[int, ...]:
    """`--gpus all|N|0,1,3` -> CUDA device indices; a usage error names the value and the fix.
    `available`: torch.cuda.device_count() (0 without CUDA)."""
    text = spec.strip().lower()
    if available < 1:
        raise ConfigError(f"--gpus {spec}: this host has no CUDA GPU (torch sees none); run without --gpus "
                          "(the CPU), or on a host with GPUs and a CUDA build of torch")
    if text == "all":
        return tuple(range(available))
    try:
        numbers = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--gpus {spec!r} is not all, a count or a list of GPU indices (such as 0,1,3)") from None
    if "," in text:
        wanted = numbers
    elif numbers and numbers[0] >= 1:
        wanted = tuple(range(numbers[0]))
    else:
        raise ConfigError(f"--gpus {spec}: give a GPU count >= 1, a list such as 0,1,3, or all")
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"--gpus {spec}: a GPU is listed twice; list each index once")
    bad = [g for g in wanted if not 0 <= g < available]
    if bad or not wanted:
        raise ConfigError(f"--gpus {spec}: this host has {available} GPU(s) (indices 0..{available - 1}); "
                          f"{'index ' + ', '.join(map(str, bad)) + ' does not exist' if bad else 'none listed'}. "
                          f"Ask for at most {available}, or --gpus all")
    return wanted


@dataclass(frozen=True)
class ChildPlan:
    """One child of a --gpus run: the device it runs on and the part of the ids it writes."""

    rank: int  # 0..len(devices)-1
    device: str  # "cuda:3"; in tests "cpu"
    num_shards: int  # the parent's --num-shards x the number of children
    shard_index: int

    @property
    def prefix(self) -> str:
        return output_prefix(self.num_shards, self.shard_index)

    @property
    def cuda_index(self) -> int | None:
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None


def plan_children(devices: Sequence[str], num_shards: int = 1, shard_index: int = 0) -> tuple[ChildPlan, ...]:
    """One child per device; see the module docstring for the shard arithmetic."""
    if not devices:
        raise ConfigError("--gpus planned no device; give --gpus all, a count or a list")
    n = len(devices)
    return tuple(ChildPlan(k, d, num_shards * n, shard_index + num_shards * k) for k, d in enumerate(devices))


def child_workers(workers: int | None, n_children: int, on_cuda: bool, cpus: int | None = None) -> int | None:
    """Decode workers per child: the user's value as given; on GPUs, three quarters of the cores
    shared between the children, and at most 12 a child. The cap of 12 is per process (more threads
    take the GIL from the thread that launches GPU work); each child has its own GIL, so a big host
    gives every child 12 rather than 12 in all (12 in all left two H200s waiting on FLAC decoding)."""
    if workers is not None or not on_cuda:
        return workers
    cores = cpus or os.cpu_count() or 1
    return max(1, min(12, cores * 3 // 4 // n_children))


def child_options(opts: RunOptions, child: ChildPlan, n_children: int) -> RunOptions:
    """The child's RunOptions (`opts`: the parent's): its device and part of the ids; --overwrite
    is done once by the parent before any child starts, so children never delete each other's work.
    A GPU child sees only its own GPU (CUDA_VISIBLE_DEVICES, set by the supervisor), as cuda:0.
    The children share this machine's memory: each gets its part of the decoded-audio budget."""
    source = dataclasses.replace(opts.source, num_shards=child.num_shards, shard_index=child.shard_index)
    audio_memory = max(1, (opts.engine.audio_memory or host_audio_bytes()) // n_children)
    engine = dataclasses.replace(opts.engine, device=child.device if child.cuda_index is None else "cuda:0",
                                 audio_memory=audio_memory)  # fmt: skip
    workers = child_workers(opts.workers, n_children, child.cuda_index is not None)
    return dataclasses.replace(opts, source=source, engine=engine, overwrite=False, workers=workers)


@dataclass(frozen=True)
class Stopped:
    """What the supervisor does with a child that exited: `done`, `restart`, or `fail` (the run
    fails with the child's message; exit `code` for the CLI)."""

    action: str
    code: int = 0


def on_exit(returncode: int, restarts: int, stopping: bool) -> Stopped:
    """A child's exit -> what to do. Killed by a signal (SIGKILL, the OOM killer, a segfault in a
    driver) or any unexpected code: restart and resume, up to MAX_RESTARTS. A usage error (2) or a
    failure / --max-errors (1) would repeat: the run fails. Once the run is stopping, nothing restarts."""
    if returncode == EXIT_OK:
        return Stopped("done")
    if stopping:
        return Stopped("done", returncode)
    if returncode in (EXIT_USAGE, EXIT_FAILED):
        return Stopped("fail", returncode)
    if restarts >= MAX_RESTARTS:
        return Stopped("fail", EXIT_FAILED)
    return Stopped("restart")
