"""Peak memory of reading + decoding a dataset: does it stay flat as the dataset grows?

Runs `iter_source` + `decode_stream` over the first N rows of the four train-clean-5 shards in
../shared/data (838 rows, 2.9 h of FLAC) in a fresh subprocess per N and prints each run's peak
RSS: ru_maxrss of the main process plus that of its largest worker (a conservative bound on the
total; the workers run in parallel and the decoded audio lives in both places briefly).

    python benchmarks/memory_streaming.py                # 100 vs 838 rows, 1 worker
    python benchmarks/memory_streaming.py --rows 100 838 --workers 2 --prefetch 64

Exit status 1 when the largest N's peak exceeds the smallest N's by more than --tolerance (20%).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "librispeech"
INPUT_GLOB = str(DATA / "train-clean-5-0000[0-3]-of-00008.parquet")


def measure(rows: int, workers: int, prefetch: int) -> dict[str, float]:
    """Runs in the child process: stream `rows` items through the pool, report peak memory."""
    from batchscribe.audio.pool import decode_stream
    from batchscribe.audio.sources import SourceOptions, iter_source

    start = time.perf_counter()
    items = errors = 0
    audio_s = 0.0
    for decoded in decode_stream(iter_source([INPUT_GLOB], SourceOptions(limit=rows)), workers, prefetch):
        items += 1
        errors += decoded.error is not None
        audio_s += 0 if decoded.audio is None else decoded.audio.shape[0] / 16000
    wall = time.perf_counter() - start
    # NOTE: workers are children of the forkserver, not of this process; stopping it makes the
    # kernel fold their peak (reaped by the forkserver) into our RUSAGE_CHILDREN.
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"rows": rows, "items": items, "errors": errors, "audio_h": audio_s / 3600, "wall_s": wall,
            "main_mib": own, "worker_mib": children, "peak_mib": own + children}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 838])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.20)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.workers, args.prefetch)))
        return 0
    if not DATA.is_dir():
        print(f"{DATA} is absent; nothing to measure", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    print(f"# {platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} cores, "
          f"Python {platform.python_version()}, commit {commit}, workers={args.workers}, prefetch={args.prefetch}")
    print(f"{'rows':>6} {'items':>6} {'errors':>6} {'audio_h':>8} {'wall_s':>7} {'main_MiB':>9} {'worker_MiB':>10} {'peak_MiB':>9}")
    results = []
    for rows in args.rows:
        cmd = [sys.executable, __file__, "--child", str(rows), "--workers", str(args.workers),
               "--prefetch", str(args.prefetch)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        out = proc.stdout
        r = json.loads(out.strip().splitlines()[-1])
        results.append(r)
        print(f"{r['rows']:>6} {r['items']:>6} {r['errors']:>6} {r['audio_h']:>8.2f} {r['wall_s']:>7.1f} "
              f"{r['main_mib']:>9.1f} {r['worker_mib']:>10.1f} {r['peak_mib']:>9.1f}")
    ratio = results[-1]["peak_mib"] / results[0]["peak_mib"]
    ok = ratio <= 1 + args.tolerance
    print(f"peak ratio {results[-1]['rows']} / {results[0]['rows']} rows: {ratio:.3f} "
          f"({'within' if ok else 'OVER'} {args.tolerance:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
