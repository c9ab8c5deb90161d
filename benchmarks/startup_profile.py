"""Where `batchscribe run`'s start-up goes: run() on a few rows, in this process.

Prints the wall time of run(), the summary's model_load_seconds, and when each start-up phase
(the functions in PHASES) began and how long it took, by wall clock. With --cprofile, the
functions with the largest cumulative time instead (the main thread only; waits on the GIL and
on the GPU land in whatever is running, so read it as a pointer, not a breakdown). Run it twice in fresh processes: the first pays for Triton's and FlashInfer's builds
and the model conversion, the second is what a user's every later run pays.

    python benchmarks/startup_profile.py --parquet ../shared/data/librispeech/train-clean-5-first100.parquet
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import io
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path


PHASES = [
    "batchscribe.run:default_transcriber", "batchscribe.model_check:resolve_model",
    "batchscribe.model_check:Tokenizer.from_folder", "batchscribe.api:weights_sha256", "batchscribe.api:load_state_dict",
    "batchscribe.model_check:resolve_engine",
    "batchscribe.api:Whisper.load_hf_state_dict", "batchscribe.api:Whisper.to", "batchscribe.api:Transcriber.scheduler",
    "batchscribe.engine.prewarm:Prewarm.join",
    "batchscribe.engine.engine:DecoderCache.allocate", "batchscribe.engine.engine:build_backend",
    "batchscribe.engine.engine:Stager.__init__", "batchscribe.engine.engine:WindowEncoder.warm_up",
    "batchscribe.engine.engine:one_step_seconds", "batchscribe.engine.engine:StepGraphs.capture",
    "batchscribe.engine.engine:EncoderGraphs.capture", "batchscribe.engine.engine:Engine.enable_arena",
    "batchscribe.run:inputs_listing", "batchscribe.run:checked_state", "batchscribe.run:first_pending", "batchscribe.run:estimate_total", "batchscribe.engine.scheduler:Scheduler.run",
]  # fmt: skip


def _wrap_phases(t0: float, log: list[str]) -> None:
    """Replace each PHASES function by a wrapper that logs its start (s after t0) and duration."""
    for spec in PHASES:
        module_name, attr = spec.split(":")
        owner: object = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        fn = getattr(owner, name, None)
        if fn is None:
            log.append(f"{0:8.2f} s  (not found: {spec}; renamed?)")
            continue
        # A classmethod is fetched bound to its class: the wrapper calls it so and is set as a staticmethod.
        bound = isinstance(owner, type) and isinstance(vars(owner).get(name), (staticmethod, classmethod))

        def wrapper(*a, __fn=fn, __spec=attr, **k):
            start = time.perf_counter()
            try:
                return __fn(*a, **k)
            finally:
                log.append(f"{start - t0:8.2f} s  +{time.perf_counter() - start:6.2f} s  {__spec}")

        wrapped = functools.wraps(fn)(wrapper)
        setattr(owner, name, staticmethod(wrapped) if bound else wrapped)


def _wrap_prewarm(t0: float, log: list[str]) -> None:
    """Log each of Prewarm's library steps and each of its threads whole (with its synchronize),
    named by thread: they run beside the main thread's phases."""
    from batchscribe.engine import prewarm

    steps, touch = prewarm.library_steps, prewarm.Prewarm._touch

    def timed(label: str, call):
        def run():
            start = time.perf_counter()
            try:
                return call()
            finally:
                log.append(f"{start - t0:8.2f} s  +{time.perf_counter() - start:6.2f} s  "
                           f"[{threading.current_thread().name}] {label}")  # fmt: skip
        return run

    prewarm.library_steps = lambda *a, **k: [(name, timed(name, call)) for name, call in steps(*a, **k)]
    prewarm.Prewarm._touch = staticmethod(lambda device, calls: timed("thread, synchronised", lambda: touch(device, calls))())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", required=True, type=Path)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--filter", default="batchscribe|torch/cuda|triton|flashinfer|safetensors|tokenizers",
                    help="regex on the printed functions' file names")
    ap.add_argument("--no-prewarm", action="store_true",
                    help="leave the GPU libraries' first calls to the engine's warm-up (engine/prewarm.py's A/B)")
    args = ap.parse_args()
    # torch and the engine's modules are imported before the clock in both arms of --no-prewarm
    # (patching Prewarm imports them; at d5c013a that moved ~3.5 s of imports out of one arm's run()).
    t_import = time.perf_counter()
    import torch  # noqa: F401

    from batchscribe.engine import prewarm

    torch_s = time.perf_counter() - t_import
    if args.no_prewarm:
        prewarm.Prewarm._touch = staticmethod(lambda device, calls: None)
    t_import = time.perf_counter()
    from batchscribe.run import RunOptions, run
    from batchscribe.audio.sources import SourceOptions
    import_s = time.perf_counter() - t_import

    log: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        if args.cprofile:
            prof.enable()
        else:
            _wrap_phases(t0, log)
            if not args.no_prewarm:
                _wrap_prewarm(t0, log)
        result = run([str(args.parquet)], Path(tmp) / "out", RunOptions(source=SourceOptions(limit=args.rows)))
        prof.disable()
        wall = time.perf_counter() - t0
    s = result.summary
    print(f"import torch + batchscribe.engine: {torch_s:.2f} s; import batchscribe.run: {import_s:.2f} s; run() {wall:.2f} s for {s['items']} rows; "
          f"model_load_seconds {s['model_load_seconds']:.2f}", flush=True)
    if not args.cprofile:
        print("\n".join(sorted(log, key=float_start)))
        return
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("cumulative")
    stats.print_stats(args.filter, args.top)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    sys.stdout.write("\n".join(ln[:220] for ln in lines[-(args.top + 2):]) + "\n")


def float_start(line: str) -> float:
    return float(line.split()[0])


if __name__ == "__main__":
    main()
