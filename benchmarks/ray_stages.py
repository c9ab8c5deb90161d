"""Where `batchscribe run --ray`'s time goes on one GPU (issue 21): its stages timed alone on the
same rows, in one process. A program, not a timed test.

    python benchmarks/ray_stages.py --device cuda --rows 100 --replicate 50 --cpus 16
    python benchmarks/ray_stages.py --rows 12 --shapes 4x2   (the CPU: checks the program runs)

1. decode: Ray Data's read, repartition and decode tasks exactly as the driver builds them
   (`driver._Stages.decoded`), drained by this process with no actor: the rate the CPU side feeds.
2. engine: the decoded rows through `Transcriber.transcribe_stream`, fed from memory by a thread
   that copies each row into the engine's pinned arena (as the plain run's decode threads do):
   the engine's own rate, the ceiling for the rest.
3. actor: the same rows through `ray.actor.Transcribe` in this process (its Feed), called from
   C threads at once with R rows a call, for each --shapes RxC: the actor without Ray's transport.
4. ray: `run_on_ray` on this process's local cluster with each RxC (the driver's rows per call and
   calls per actor), reporting the in-run wall, the time after the first record, and how long the
   driver waited on Ray's output iterator (the rest is its own committing).

Stages 2 and 3 print the engine's host seconds by stage: `wait_input` is time the engine had
nothing to admit. Each engine is warmed on a few rows first. --shapes' first entry should be the
driver's default (rows_per_call x calls_per_actor: 256x2 on a GPU today).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from common import commit, hardware
from ray_overhead import DEFAULT_PARQUET, _rows

SAMPLE_RATE = 16_000
WARM_ROWS = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, default=DEFAULT_PARQUET)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--replicate", type=int, default=1, help="copies of the rows, ids made unique")
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray cluster")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--shapes", default="256x2,128x3,64x5", help="rows per call x calls at once, for stages 3 and 4")
    ap.add_argument("--skip", default="", help="stages to leave out, e.g. actor,ray")
    args = ap.parse_args()
    import ray

    from batchscribe.config import EngineOptions
    from batchscribe.ray import driver
    from batchscribe.run_options import RunOptions

    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = _rows(args.parquet, args.rows, folder, args.replicate)
        cache = Path(os.environ.get("BATCHSCRIBE_CACHE") or folder / "cache")
        opts = RunOptions(engine=EngineOptions(device=args.device), cache_dir=cache)
        ray.init(num_cpus=args.cpus, num_gpus=1 if args.device == "cuda" else 0, include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)  # fmt: skip
        driver.import_ray()  # its log and warning filters, as in a run
        cols = driver._columns([str(rows)], opts)
        stages = driver._Stages(ray, [str(rows)], cols, opts, driver.RayPlan(), frozenset())
        print(f"hardware: {hardware()}; commit {commit()}; {args.rows} rows x{args.replicate}; Ray {ray.__version__}, "
              f"{args.cpus} CPUs; driver default per GPU actor: {driver.rows_per_call(1, None)} rows x "
              f"{driver.calls_per_actor(1, None)} calls", flush=True)  # fmt: skip
        tables, audio_s = _decode_stage(stages)
        if "engine" not in skip:
            _engine_stage(opts, tables, audio_s)
        if "actor" not in skip:
            for r, c in shapes:
                _actor_stage(opts, stages.read, tables, audio_s, r, c)
        del tables
        if "ray" not in skip:
            for r, c in shapes:
                _ray_stage(driver, rows, folder / f"ray_{r}x{c}", opts, audio_s, r, c)
        ray.shutdown()


def _report(name: str, seconds: float, n_rows: int, audio_s: float, extra: str = "") -> None:
    print(f"{name}: {seconds:.2f} s, {n_rows / seconds:.0f} rows/s, RTFx {audio_s / seconds:.0f}{extra}", flush=True)


def _decode_stage(stages: Any) -> tuple[list[Any], float]:
    """Drain the decode stage; its tables (id, samples, ...) feed stages 2 and 3."""
    t0 = time.perf_counter()
    tables, first = [], None
    for table in stages.decoded(decode=True).iter_batches(batch_format="pyarrow", batch_size=None):
        first = first or time.perf_counter() - t0
        tables.append(table)
    seconds = time.perf_counter() - t0
    n = sum(t.num_rows for t in tables)
    audio_s = sum(len(v) for t in tables for v in _views(t) if v is not None) / 4 / SAMPLE_RATE
    _report("1 decode (read, repartition, decode tasks; no actor)", seconds, n, audio_s,
            f"; first batch after {first:.2f} s, {len(tables)} batches of {tables[0].num_rows if tables else 0} rows")
    return tables, audio_s


def _views(table: Any) -> list[memoryview | None]:
    """The samples column's cells as views of the block (no copy per row: GBs at 5,000 rows)."""
    from batchscribe.audio.sources.parquet import binary_views

    return [view for chunk in table.column("samples").chunks for view in binary_views(chunk)]


def _samples(tables: list[Any]) -> list[tuple[str, np.ndarray]]:
    return [(str(i), np.frombuffer(v, dtype=np.float32)) for t in tables
            for i, v in zip(t.column("id").to_pylist(), _views(t)) if v is not None]  # fmt: skip


def _engine_stage(opts: Any, tables: list[Any], audio_s: float) -> None:
    from batchscribe.api import Transcriber

    transcriber = Transcriber(model=opts.model, cache_dir=opts.cache_dir, engine=opts.engine)
    allocate = transcriber.host_allocator()
    items = _samples(tables)
    list(transcriber.transcribe_stream(items[:WARM_ROWS]))
    sched = transcriber.scheduler()
    sched.timings.clear()
    ready: queue.Queue = queue.Queue(maxsize=512)  # a producer ahead of the engine, as decode threads are

    def produce() -> None:
        for item_id, samples in items:
            if allocate is not None:
                pinned = allocate(samples.size)
                pinned[...] = samples
                samples = pinned
            ready.put((item_id, samples))
        ready.put(None)

    def feed():
        while (item := ready.get()) is not None:
            yield item

    t0 = time.perf_counter()
    threading.Thread(target=produce, daemon=True).start()
    n = sum(1 for _ in transcriber.transcribe_stream(feed()))
    seconds = time.perf_counter() - t0
    _report("2 engine (transcribe_stream from memory)", seconds, n, audio_s)
    print("   engine host seconds:", {k: round(v, 3) for k, v in sched.timings.items()}, flush=True)
    transcriber.release()


def _actor_stage(opts: Any, read: dict, tables: list[Any], audio_s: float, rows: int, calls: int) -> None:
    from batchscribe.ray.actor import Transcribe

    actor = Transcribe(model=opts.model, cache_dir=opts.cache_dir, engine=opts.engine, read=read)
    actor(tables[0].slice(0, WARM_ROWS))
    sched = actor.transcriber.scheduler()
    sched.timings.clear()
    batches = [t.slice(k, rows) for t in tables for k in range(0, t.num_rows, rows)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(calls) as pool:
        n = sum(len(out["id"]) for out in pool.map(actor, batches))
    seconds = time.perf_counter() - t0
    _report(f"3 actor in-process, {rows} rows x {calls} calls", seconds, n, audio_s)
    print("   engine host seconds:", {k: round(v, 3) for k, v in sched.timings.items()}, flush=True)
    actor.transcriber.release()


def _ray_stage(driver: Any, rows_file: Path, out: Path, opts: Any, audio_s: float, rows: int, calls: int) -> None:
    import json

    saved = driver.rows_per_call, driver.calls_per_actor, driver._Stages.records
    waited = [0.0]

    def timed(self: Any):  # the driver's time blocked on Ray's output; the rest is its own work
        it = saved[2](self)
        while True:
            t = time.perf_counter()
            try:
                row = next(it)
            except StopIteration:
                return
            finally:
                waited[0] += time.perf_counter() - t
            yield row

    driver.rows_per_call, driver.calls_per_actor = (lambda g, b: rows), (lambda g, b: calls)
    driver._Stages.records = timed
    try:
        t0 = time.perf_counter()
        result = driver.run_on_ray([str(rows_file)], out, opts)
        seconds = time.perf_counter() - t0
    finally:
        driver.rows_per_call, driver.calls_per_actor, driver._Stages.records = saved
    s = result.summary
    n = s["this_run"]["items"]
    _report(f"4 ray, {rows} rows x {calls} calls (in-run)", s["wall_seconds"], n, audio_s,
            f"; after the first record {s['wall_seconds'] - s['first_record_seconds']:.2f} s; driver waited on "
            f"Ray {waited[0]:.2f} s of {seconds:.2f} s; status {json.dumps(s.get('status'))}")


if __name__ == "__main__":
    main()
