"""Where a decode step's and the encoder's device time goes: torch.profiler tables by kernel.

    python benchmarks/profile_step.py --tokenizer-from BASE_HF_FOLDER [--configs flashinfer:fp8] [--slots 256]

Builds the W2 engine (large-v3 architecture, random bf16 weights; see w2_large_v3.py), fills every
slot with one admission, then profiles eager decode steps at the full bucket and one encoder batch,
printing the kernels that take the most device time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from batchscribe.config import DecodeOptions
from batchscribe.engine.engine import Engine, _Item
from batchscribe.engine.kernels import AttentionKinds
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper
from w2_large_v3 import LARGE_V3, TOKENS, large_v3_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--configs", nargs="*", default=["flashinfer:fp8"])
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--rows", type=int, default=30, help="kernels to list")
    args = ap.parse_args()
    dtype = torch.bfloat16
    with tempfile.TemporaryDirectory() as tmp:
        tok = large_v3_tokenizer(args.tokenizer_from, Path(tmp))
    dims = ModelDims.from_hf_config(LARGE_V3)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Whisper(dims).to(dtype=dtype).eval()
    for p in model.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    options = DecodeOptions(language="en", without_timestamps=True, temperatures=(0.0,), sample_len=TOKENS,
                            suppress_tokens=f"-1,{tok.eot}", compression_ratio_threshold=None,
                            logprob_threshold=None, no_speech_threshold=None)  # fmt: skip
    audio = (np.random.default_rng(0).standard_normal(16000 * 30) * 0.1).astype(np.float32)
    for config in args.configs:
        attention, cross_kv = config.split(":")
        kinds = AttentionKinds.resolve(attention, cross_kv, torch.device("cuda"), dtype)
        engine = Engine(model, tok, options, [], torch.device("cuda"), n_slots=args.slots, cuda_graphs=False,
                        attention=kinds)  # fmt: skip
        dec = engine.decoder
        requests = [engine._window(i, _Item(f"w{i}", audio, engine.forced_language)) for i in range(args.slots)]
        dec.admit(requests, list(range(args.slots)))
        kv = dec.kv_buckets[-1] if dec.kv_buckets else dec.n_ctx
        for _ in range(3):
            dec._step(args.slots, kv, False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                dec._step(args.slots, kv, False)
            torch.cuda.synchronize()
        print(f"\n=== {config}: 3 eager decode steps at {args.slots} rows (kv {kv}) ===")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=90))
        mel = dec.features(torch.from_numpy(np.stack([audio] * 32)).cuda()).to(dtype)
        with torch.no_grad():
            model.encoder(mel)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model.encoder(mel)
                torch.cuda.synchronize()
        print(f"\n=== {config}: encoder, 32 windows ===")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=90))
        del engine, dec
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
