"""Where a decode step's and the encoder's device time goes: torch.profiler tables by kernel.

    python benchmarks/profile_step.py --tokenizer-from BASE_HF_FOLDER [--arch large-v3|turbo] [--configs flashinfer:fp8] [--slots 256]

Builds the W2 engine (large-v3 architecture, or W4's turbo with --arch turbo; random bf16 weights;
see w2_large_v3.py), fills every slot with one admission, then profiles eager decode steps at the
full bucket and one admission chunk of 32 windows as the engine encodes it (log-mel, the encoder
as `EngineConfig.encoder` says, every layer's cross K/V written into the slots), printing the
kernels that take the most device time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from batchscribe.config import EngineOptions
from batchscribe.engine.setup import resolve_engine
from batchscribe.model.dims import ModelDims
import w2_large_v3
from w2_large_v3 import ARCHS, large_v3_tokenizer, random_model, scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="large-v3")
    ap.add_argument("--configs", nargs="*", default=["flashinfer:fp8"])
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--rows", type=int, default=30, help="kernels to list")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tok = large_v3_tokenizer(args.tokenizer_from, Path(tmp))
    w2_large_v3.ARCH = ARCHS[args.arch]  # what random_model builds
    dims = ModelDims.from_hf_config(w2_large_v3.ARCH)
    model = random_model(torch.bfloat16)
    audio = (np.random.default_rng(0).standard_normal(16000 * 30) * 0.1).astype(np.float32)
    for config in args.configs:
        attention, cross_kv, precision = (config.split(":") + ["auto"])[:3]
        options = EngineOptions(device="cuda", dtype="bfloat16", batch_size=args.slots, cuda_graphs=False,
                                attention=attention, cross_kv=cross_kv, encoder_precision=precision)  # fmt: skip
        sched = scheduler(model, tok, resolve_engine(options, dims))
        engine, windows = sched.engine, sched.windows
        engine.admit([windows.request(i, windows.start(f"w{i}", audio)) for i in range(args.slots)],
                     list(range(args.slots)))  # fmt: skip
        kv = engine.kv_buckets[-1] if engine.kv_buckets else engine.n_ctx
        for _ in range(3):
            engine.look.step(args.slots, kv, False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                engine.look.step(args.slots, kv, False)
            torch.cuda.synchronize()
        print(f"\n=== {config}: 3 eager decode steps at {args.slots} rows (kv {kv}) ===")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=90))
        chunk = torch.from_numpy(np.stack([audio] * 32)).cuda()  # [32, N_SAMPLES]
        slot_ids = torch.arange(32, device="cuda")
        engine.encoder(chunk, slot_ids)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.encoder(chunk, slot_ids)
            torch.cuda.synchronize()
        print(f"\n=== {config}: one admission chunk of 32 windows (log-mel, {engine.config.encoder} encoder, cross K/V) ===")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=90))
        del engine, sched
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
