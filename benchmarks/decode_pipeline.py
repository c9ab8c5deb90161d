"""The input pipeline alone: Parquet FLAC bytes -> decoded arrays, in threads or processes.

    python benchmarks/decode_pipeline.py --parquet ../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
        [--replicate 10] [--workers 8] [--cuda]

Times `decode_stream` behind `read_ahead` (as `batchscribe run` feeds a GPU engine) with nobody
consuming slowly: seconds to the first item, to all items, and audio seconds per second, for
threads and for processes. `--cuda` initialises CUDA in this process first (as a GPU run has).
Diagnoses W1's input wait; not a peer comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, required=True)
    ap.add_argument("--replicate", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[8])
    ap.add_argument("--prefetch", type=int, default=512)
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()
    import pyarrow.parquet as pq

    from batchscribe.audio.pool import decode_stream, read_ahead
    from batchscribe.audio.sources import SourceItem

    if args.cuda:
        import torch

        torch.zeros(1, device="cuda")
    rows = pq.read_table(args.parquet, columns=["id", "audio"]).to_pylist()
    items = [SourceItem(id=f"{r['id']}~{k}", audio_bytes=r["audio"]["bytes"], path=None, text=None)
             for k in range(args.replicate) for r in rows]  # fmt: skip
    for workers in args.workers:
        for threads in (True, False):
            t0 = time.perf_counter()
            first, n, audio_s = None, 0, 0.0
            stream = decode_stream(iter(items), workers=workers, prefetch=args.prefetch, threads=threads)
            for d in read_ahead(stream, depth=256):
                first = time.perf_counter() - t0 if first is None else first
                n += 1
                audio_s += 0 if d.audio is None else len(d.audio) / 16000
            total = time.perf_counter() - t0
            mode = "threads" if threads else "processes"
            print(f"{mode:>9} x{workers}: first item {first:.3f} s, {n} items in {total:.2f} s, "
                  f"{audio_s / total:.0f} audio s/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
