"""`batchscribe run INPUT -o OUT --ray [ADDRESS] --ray-workers N`: the run on Ray Data.

Ray Data reads the Parquet inputs (streaming), CPU tasks decode the audio ahead of GPU actors
(`actor.decode_batch`; CPU actors decode their own rows) and N actors transcribe
(`actor.Transcribe`, one engine each, one GPU each on a GPU cluster). The
records stream back to this driver, which is the folder's one writer: it holds the lock for the
whole run and commits every record through the same ShardWriter, manifest and run config as a
plain run (prefix `records`, or the `--num-shards` part's), so a --ray folder and a plain one
resume each other. Exactly once: a row is emitted by a task only when the task's whole batch is
done; a task redone after an actor died may send some rows again, and the driver drops an id it
has already committed or received. When the driver dies, what it committed stays and the rest is
redone on rerun; ids committed before are dropped by the decode tasks before any decoding.

Import ray only here (and lazily): `import batchscribe` and plain runs never load it.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscribe.audio.sources import SourceError
from batchscribe.audio.sources.columns import Columns, resolve_columns
from batchscribe.audio.sources.fingerprint import inputs_listing
from batchscribe.config import ConfigError
from batchscribe.engine.sizing import CPU_SLOTS, CUDA_SLOT_CAP
from batchscribe.output.lock import lock_output
from batchscribe.output.records import now_iso
from batchscribe.output.resume import OutputState, output_prefix
from batchscribe.ray.actor import Transcribe, decode_batch, keep_rows
from batchscribe.ray.commit import Drive
from batchscribe.run import check_item_prompts, check_model, run_config
from batchscribe.run_folder import Folder, checked_state
from batchscribe.run_options import RunOptions, RunResult
from batchscribe.sink import ProgressCallback, estimate_total
from batchscribe.stops import stop_signals

INSTALL = "pip install 'batchscribe[ray]'"
# Logical CPUs each stage asks Ray for. Decoding is light next to the model. CPU actors asking for
# whole CPUs would leave none for the read and decode tasks on a small machine, and Ray Data then
# waits forever (measured: 2 actors of 0.75 on 2 CPUs hang; of 0.5 they run). Ray sets an actor's
# OMP threads from its share (at least 1), so torch does not oversubscribe.
DECODE_CPUS, CPU_ACTOR_CPUS, GPU_ACTOR_CPUS = 0.25, 0.5, 1.0
# A GPU actor's engine slots unless --batch-size says: the engine's default cap (it sizes them from
# memory up to the cap; where a large model's do not reach it, the rows beyond wait in the actor).
# A CPU actor's are the engine's CPU_SLOTS.
GPU_SLOTS = CUDA_SLOT_CAP
# How many times over the rows of an actor's other calls cover its slots (calls_per_actor).
HELD_CALL_COVER = 5


@dataclass(frozen=True)
class RayPlan:
    """Where and how wide: `address` None starts a local cluster; `workers` transcribing actors."""

    address: str | None = None
    workers: int = 1

    @classmethod
    def parse(cls, ray: str, workers: int | None) -> RayPlan:
        if workers is not None and workers < 1:
            raise ConfigError(f"--ray-workers {workers}: give at least 1 actor")
        address = None if ray.strip().lower() in ("", "local") else ray.strip()
        return cls(address, 1 if workers is None else workers)


def import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray Data, which is not installed ({exc}); install it with {INSTALL}, "
                          "or run without --ray") from None  # fmt: skip
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-dataset INFO lines would drown the bar
    # Ray's deprecation and tuning hints (raised inside ray, or attributed to the pipeline built
    # here) say nothing the user of `batchscribe run` can act on.
    warnings.filterwarnings("ignore", module=r"(ray|batchscribe\.ray)(\.|$)")
    return ray


def parquet_files(inputs: Sequence[str], exclude: tuple[str, ...]) -> list[str]:
    """The Parquet files the inputs name (files, folders, globs), as a plain run lists them."""
    files: list[str] = []
    for inp in inputs:
        paths = sorted(glob.glob(inp)) if any(c in inp for c in "*?[") else [inp]
        for p in map(Path, paths):
            if p.is_dir():
                files += [str(f) for f in sorted(p.rglob("*.parquet"))
                          if not any(os.path.realpath(f).startswith(e + os.sep) for e in exclude)]  # fmt: skip
            elif p.suffix == ".parquet" and p.is_file():
                files.append(str(p))
            else:
                raise SourceError(f"{inp}: --ray reads Parquet inputs (files, folders of them, globs) with Ray Data; "
                                  "run this input without --ray, or write it to Parquet first")  # fmt: skip
    if not files:
        raise SourceError(f"{', '.join(inputs)}: no Parquet files found; check the path or glob")
    return files


def _columns(files: list[str], opts: RunOptions) -> Columns:
    import pyarrow.parquet as pq

    cols = resolve_columns(pq.read_schema(files[0]).names, opts.source, files[0])
    if cols.id is None:
        raise SourceError(f"{files[0]}: --ray needs an id column (a plain run numbers rows per file, which Ray's "
                          "parallel reads cannot); name one with --id-column NAME, or run without --ray")
    return cols


def check_unique_ids(files: list[str], id_column: str) -> None:
    """Refuse an input whose id column repeats an id. The driver drops an id it has already
    received, since Ray redoes the tasks of a dead actor; a genuine repeat would be dropped the same
    way and its item lost. A plain run keeps both (the second under a derived id)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    chunks = [c for f in files for c in pq.read_table(f, columns=[id_column]).column(id_column).cast(pa.string()).chunks]
    counts = pc.value_counts(pa.chunked_array(chunks, type=pa.string())).to_pylist()
    repeated = [c["values"] for c in counts if c["counts"] > 1]
    if repeated:
        shown = ", ".join(map(repr, repeated[:5])) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
        where = files[0] if len(files) == 1 else f"{len(files)} Parquet files"
        raise SourceError(f"{where}: the id column {id_column!r} repeats {len(repeated)} id(s) ({shown}); --ray needs "
                          "unique ids (a repeat cannot be told from a task Ray redid, so an item would be lost). "
                          "Make the ids unique, or run without --ray (a plain run keeps both, the second under a "
                          "derived id)")  # fmt: skip


def _check_options(opts: RunOptions) -> None:
    if opts.source.limit is not None:
        raise ConfigError("--limit counts items in input order, which Ray's parallel reads do not keep; "
                          "drop --limit (or run without --ray)")


def run_on_ray(inputs: Sequence[str], output_dir: Path | str, opts: RunOptions, plan: RayPlan = RayPlan(),
               progress: ProgressCallback | None = None) -> RunResult:  # fmt: skip
    """Like `run.run`, on Ray Data; the same errors, summary and exit paths."""
    _check_options(opts)
    if plan.address is None:
        # The local cluster's actors load the model on this machine: the plain run's checks come
        # first, before the lock files (never removed) and the cluster. On a remote cluster the
        # model may exist only on its nodes, and a hub id would be downloaded here: its errors
        # come from the actors.
        check_model(opts)
    else:
        check_item_prompts(opts)
    output_dir = Path(output_dir)
    start_wall, start_time = time.monotonic(), now_iso()
    source = dataclasses.replace(opts.source, exclude=(os.path.realpath(output_dir),))
    files = parquet_files(inputs, source.exclude)
    cols = _columns(files, opts)
    check_unique_ids(files, cols.id)
    ray = import_ray()  # after the inputs' checks: those errors come at once
    listing = inputs_listing(inputs, source.exclude)
    config = run_config(inputs, opts, listing)
    prefix = output_prefix(opts.source.num_shards, opts.source.shard_index)
    with lock_output(output_dir, prefix) as lock, stop_signals():
        state = checked_state(output_dir, prefix, config, opts, lock, listing)
        skip = _skip(state, opts)
        started = _connect(ray, plan)
        try:
            stages = _Stages(ray, files, cols, opts, plan, skip)
            info = {"address": plan.address or "local", "workers": plan.workers, "gpus_per_worker": stages.gpus}
            drive = Drive(inputs, opts, info, Folder(state, lock, config, listing), (start_wall, start_time),
                          progress, estimate_total(inputs, source), len(skip))  # fmt: skip
            return drive.drive(stages.records())
        finally:
            if started:
                ray.shutdown()


def _skip(state: OutputState, opts: RunOptions) -> frozenset[str]:
    """Ids the decode tasks drop: committed ones, less the error records --retry-errors redoes."""
    if opts.overwrite:
        return frozenset()
    if opts.retry_errors:
        return frozenset(state.completed - {i for e in state.entries for i in e.error_ids})
    return frozenset(state.completed)


def _connect(ray: Any, plan: RayPlan) -> bool:
    """Join the cluster (or start a local one); True when this call did, so the run disconnects."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
    if plan.address is None:
        # The private local cluster of one run reports no usage stats home (its reporter tries the
        # network from hosts that often have none; its CPU cost was not measurable), unless the
        # user's environment asks for them.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        ray.init(address=plan.address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--ray {plan.address or 'local'}: cannot reach a Ray cluster ({exc}); give the head's "
                          "address (host:6379, or auto on a cluster node), or --ray alone for a local one") from None
    ray.data.DataContext.get_current().enable_progress_bars = False  # batchscribe's own bar reports
    return True


class _Stages:
    """The Ray Data pipeline: read -> decode tasks -> transcribing actors."""

    def __init__(self, ray: Any, files: list[str], cols: Columns, opts: RunOptions, plan: RayPlan,
                 skip: frozenset[str]) -> None:  # fmt: skip
        self.ray, self.files, self.cols, self.opts, self.plan, self.skip = ray, files, cols, opts, plan, skip
        self.gpus = _gpus_per_actor(ray, opts.engine.device)

    def records(self) -> Iterator[dict[str, Any]]:
        """Each output row as a dict (id, text, error, record, describe)."""
        engine = self.opts.engine
        device = "cuda" if self.gpus else "cpu"  # Ray gives a GPU actor its GPU as cuda:0
        # A CPU actor decodes its rows on its call threads: decode tasks there cost more (their
        # Python workers, the samples through the object store) than the decoding they take off it.
        ds = self.decoded(decode=bool(self.gpus))
        ds = ds.map_batches(
            # Arrow batches: the samples reach the engine as views of the block, not copies (actor.py)
            Transcribe, batch_size=rows_per_call(self.gpus, engine.batch_size), batch_format="pyarrow",
            compute=_actor_pool(self.ray.data, self.plan.workers, calls_per_actor(self.gpus, engine.batch_size)),
            num_gpus=self.gpus, num_cpus=self._actor_cpus(),
            fn_constructor_kwargs={"model": self.opts.model, "cache_dir": _str(self.opts.cache_dir),
                                   "decode": self.opts.decode, "describe": True, "read": self.read,
                                   "engine": dataclasses.replace(engine, device=device), "peers": self.plan.workers})  # fmt: skip
        for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            yield from table.to_pylist()

    @property
    def read(self) -> dict[str, Any]:
        """decode_batch's keywords: the run's columns, and the folder relative paths start from."""
        cols, folders = self.cols, {os.path.dirname(os.path.abspath(f)) for f in self.files}
        return {"id_column": cols.id, "audio_column": cols.audio, "text_column": cols.text,
                "passthrough": list(cols.passthrough), "prompt_column": cols.prompt,
                "base_dir": folders.pop() if len(folders) == 1 else None}  # fmt: skip

    def decoded(self, decode: bool) -> Any:
        """The rows to do, cut into actor calls, and (`decode`) decoded by CPU tasks: a Dataset of
        decode_batch's columns (raw rows without `decode`). benchmarks/ray_stages.py times it alone."""
        src, cols = self.opts.source, self.cols
        data = self.ray.data
        context = data.DataContext.get_current()
        if hasattr(context, "use_datasource_v2"):
            # Ray Data's v2 Parquet reader splits a file's row groups over read tasks (GPU actors
            # wait on the read and decode otherwise), but plans with actors of its own: start-up
            # CPU that CPU actors wait behind on a small machine. Measured: docs/GPU_NOTES.md.
            context.use_datasource_v2 = bool(self.gpus)
        tasks = decode_tasks(self.ray.cluster_resources().get("CPU", 1.0), self._actor_cpus(), self.plan.workers)
        try:
            ds = data.read_parquet(self.files, concurrency=tasks, ray_remote_args={"num_cpus": DECODE_CPUS})
        except TypeError:  # a Ray without concurrency= on its reads
            ds = data.read_parquet(self.files, ray_remote_args={"num_cpus": DECODE_CPUS})
        ds = ds.select_columns(cols.needed)
        if self.skip or src.num_shards > 1:  # before the rows are cut into calls, so every call is whole
            ds = ds.map_batches(keep_rows, batch_format="pyarrow", batch_size=None, num_cpus=DECODE_CPUS,
                                concurrency=tasks, fn_kwargs={"id_column": cols.id, "skip": self.skip,
                                                              "num_shards": src.num_shards,
                                                              "shard_index": src.shard_index})  # fmt: skip
        rows = rows_per_call(self.gpus, self.opts.engine.batch_size)
        try:
            # One block, one actor call: Ray Data returns a task's records only when its whole input
            # block is done, and a Parquet row group is one block (thousands of rows, on one actor).
            # Streaming, no shuffle. Ray before 2.4x lacks it.
            ds = ds.repartition(target_num_rows_per_block=rows)
        except TypeError:
            pass
        if decode:
            ds = ds.map_batches(decode_batch, batch_size=rows, num_cpus=DECODE_CPUS, concurrency=tasks,
                                fn_kwargs=self.read)  # fmt: skip
        return ds

    def _actor_cpus(self) -> float:
        return GPU_ACTOR_CPUS if self.gpus else CPU_ACTOR_CPUS


def rows_per_call(gpus: int, batch_size: int | None) -> int:
    """Rows per actor call (and per decode task). Several calls run at once on an actor's one
    engine stream (ray/feed.py, `calls_per_actor`). On a GPU a call is the slots' worth. On the
    CPU a call is one row: a row's slot then frees and its record leaves as soon as it is done
    (a bigger call holds its finished rows until the last one ends, and with them rows that
    would fill slots), and a small input spreads over the actors row by row."""
    slots = batch_size or (GPU_SLOTS if gpus else CPU_SLOTS)
    return slots if gpus else 1


def calls_per_actor(gpus: int, batch_size: int | None) -> int:
    """Calls running at once on an actor. A call's rows come back only when its slowest row is
    done; meanwhile its finished rows' slots are refilled from the later calls' rows. So the rows
    of the calls beside the oldest must cover the slots `HELD_CALL_COVER` times over, or the engine
    steps half-empty slots while the oldest call waits on its last row (benchmarks/ray_stages.py;
    docs/GPU_NOTES.md). A one-row call has no slowest row to wait on: its rows need to cover the
    slots once."""
    slots, rows = batch_size or (GPU_SLOTS if gpus else CPU_SLOTS), rows_per_call(gpus, batch_size)
    cover = 1 if rows == 1 else HELD_CALL_COVER
    return -(-cover * slots // rows) + 1


def _actor_pool(data: Any, workers: int, calls: int = 2) -> Any:
    """`calls` at once on each actor, all feeding its one engine stream (ray/feed.py), and none
    queued beyond them: a task queued on a busy actor waits while another may stand idle. A Ray
    without these arguments runs one call at a time."""
    try:
        return data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=calls,
                                      max_concurrent_calls_per_actor=calls, enable_true_multi_threading=True)  # fmt: skip
    except TypeError:
        return data.ActorPoolStrategy(size=workers)


def decode_tasks(cluster_cpus: float, actor_cpus: float, workers: int) -> int:
    """Read and decode tasks at once: the CPUs the actors leave, at least 2. Uncapped, tasks of
    DECODE_CPUS each run 4 to a CPU: 64 Python workers on 16 CPUs beside one GPU actor (seen)."""
    return max(2, int(cluster_cpus - actor_cpus * workers))


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _gpus_per_actor(ray: Any, device: str) -> int:
    has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
    if device == "cpu":
        return 0
    if device.startswith("cuda") and not has_gpus:
        raise ConfigError(f"--device {device}: the Ray cluster has no GPU; add GPU nodes, or pass --device cpu")
    return 1 if has_gpus else 0
