"""The input pipeline alone: Parquet FLAC bytes -> decoded arrays, in threads or processes.

    python benchmarks/decode_pipeline.py --parquet ../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
        [--replicate 10] [--workers 8] [--cuda] [--decoders default soundfile dr_flac]

Times `decode_stream` behind `read_ahead` (as `batchscribe run` feeds a GPU engine) with nobody
consuming slowly: seconds to the first item, to all items, and audio seconds per second, for
threads and for processes. `--cuda` initialises CUDA in this process first (as a GPU run has).
`--decoders` compares the product's decoder with libsndfile alone and dr_flac (miniaudio) alone.
Diagnoses W1's input wait; not a peer comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def soundfile_only(data: bytes | str):
    """libsndfile from a BytesIO, float32, first channel: the decode cost without the product's checks."""
    import io

    import soundfile as sf

    return sf.read(io.BytesIO(data) if isinstance(data, bytes) else data, dtype="float32", always_2d=True)[0][:, 0]


def dr_flac_only(data: bytes | str):
    """dr_flac (miniaudio) straight to float32, first channel."""
    import miniaudio
    import numpy as np

    decoded = miniaudio.flac_read_f32(data) if isinstance(data, bytes) else miniaudio.flac_read_file_f32(data)
    return np.frombuffer(decoded.samples, np.float32)[:: decoded.nchannels]


DECODERS = {"default": None, "soundfile": soundfile_only, "dr_flac": dr_flac_only}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, required=True)
    ap.add_argument("--replicate", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[8])
    ap.add_argument("--prefetch", type=int, default=512)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--decoders", nargs="+", choices=sorted(DECODERS), default=["default"])
    ap.add_argument("--modes", nargs="+", choices=["threads", "processes"], default=["threads", "processes"])
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
    for name, workers, mode in [(d, w, m) for d in args.decoders for w in args.workers for m in args.modes]:
        threads = mode == "threads"
        t0 = time.perf_counter()
        first, n, audio_s = None, 0, 0.0
        stream = decode_stream(iter(items), workers=workers, prefetch=args.prefetch, threads=threads,
                               decoder=DECODERS[name])  # fmt: skip
        for d in read_ahead(stream, depth=256):
            first = time.perf_counter() - t0 if first is None else first
            n += 1
            audio_s += 0 if d.audio is None else len(d.audio) / 16000
        total = time.perf_counter() - t0
        print(f"{name:>9} {mode:>9} x{workers}: first item {first:.3f} s, {n} items in {total:.2f} s, "
              f"{audio_s / total:.0f} audio s/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
