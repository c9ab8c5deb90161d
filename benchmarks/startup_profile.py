"""Where `batchscribe run`'s start-up goes: run() on a few rows under cProfile, in this process.

Prints the wall time of run(), the summary's model_load_seconds, and the functions with the
largest cumulative time (the main thread only: decode threads and the engine's helpers are not
profiled). Run it twice in fresh processes: the first pays for Triton's and FlashInfer's builds
and the model conversion, the second is what a user's every later run pays.

    python benchmarks/startup_profile.py --parquet ../shared/data/librispeech/train-clean-5-first100.parquet
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", required=True, type=Path)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--filter", default="batchscribe|torch/cuda|triton|flashinfer|safetensors|tokenizers",
                    help="regex on the printed functions' file names")
    args = ap.parse_args()
    t_import = time.perf_counter()
    from batchscribe.run import RunOptions, run
    from batchscribe.audio.sources import SourceOptions
    import_s = time.perf_counter() - t_import

    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        result = run([str(args.parquet)], Path(tmp) / "out", RunOptions(source=SourceOptions(limit=args.rows)))
        prof.disable()
        wall = time.perf_counter() - t0
    s = result.summary
    print(f"import batchscribe.run: {import_s:.2f} s; run() {wall:.2f} s for {s['items']} rows; "
          f"model_load_seconds {s['model_load_seconds']:.2f}", flush=True)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("cumulative")
    stats.print_stats(args.filter, args.top)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    sys.stdout.write("\n".join(ln[:220] for ln in lines[-(args.top + 2):]) + "\n")


if __name__ == "__main__":
    main()
