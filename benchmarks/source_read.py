"""Reading Parquet rows into items, as a run's reader thread does, before any decoding.

    python benchmarks/source_read.py [--parquet FILE] [--rows 100 --replicate 100] [--shards 1 8] [--repeat 3]

Writes the first `--rows` rows `--replicate` times (ids made unique, 64-row groups as the
LibriSpeech shards have) to a temporary file, then times `iter_source` over it for each shard
count (shard 0; a `--gpus N` child reads every row and keeps its share), with audio cells as views
(decode threads, GPU runs) and as copies (decode processes). Best of `--repeat`, rows/s. Each
child's reader thread does this work, much of it holding the GIL its engine thread waits for.
Not a peer comparison.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "librispeech"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, default=DATA / "test-other-subset-00000-of-00001.parquet")
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--replicate", type=int, default=100)
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from ray_overhead import _rows

    from batchscribe.audio.sources import SourceOptions, iter_source

    with tempfile.TemporaryDirectory() as tmp:
        path = _rows(args.parquet, args.rows, Path(tmp), args.replicate)
        print(f"# {path.stat().st_size / 1e9:.2f} GB, {args.rows * args.replicate} rows")
        for shards in args.shards:
            for views in (True, False):
                best, n = float("inf"), 0
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    n = sum(1 for _ in iter_source([str(path)], SourceOptions(num_shards=shards, audio_views=views)))
                    best = min(best, time.perf_counter() - start)
                rows = args.rows * args.replicate
                print(f"shards {shards}  {'views ' if views else 'copies'}  {n:>6} items kept  {best:.3f} s  "
                      f"{rows / best:,.0f} rows read/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
