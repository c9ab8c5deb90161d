"""What the encoder's warm-up costs at each admission chunk size, per SDPA backend (CUDA).

The engine runs the encoder once at every chunk size before capturing it (cuFFT plans, cuDNN
convolution and attention plans, Triton kernels). This times each size's first call and a second
call, in a fresh process per backend: run it once per --backend.

    python benchmarks/encoder_warmup.py --backend cudnn   # or flash, efficient, default
"""

from __future__ import annotations

import argparse
import contextlib
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--backend", default="default", choices=["default", "cudnn", "flash", "efficient"])
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from batchscribe.api import Transcriber
    from batchscribe.constants import N_SAMPLES
    from batchscribe.engine.encoder import ENCODER_CHUNKS, WindowEncoder
    from batchscribe.model.cache import DecoderCache

    t = Transcriber(args.model, device="cuda")
    model, dims = t.model, t.model.dims
    cache = DecoderCache.allocate(dims, 64, torch.device("cuda"), torch.float16, torch.float16, True)
    encoder = WindowEncoder(model, cache, 64, t.config.encoder)
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    # default: torch's own choice among the backends, as the engine runs it
    chosen = sdpa_kernel([backends[args.backend]]) if args.backend in backends else contextlib.nullcontext()
    print(f"{args.model} encoder ({t.config.encoder}), SDPA {args.backend}:", flush=True)
    total = 0.0
    with chosen:
        for size in ENCODER_CHUNKS:
            audio = torch.zeros(size, N_SAMPLES, device="cuda")
            slots = torch.zeros(size, dtype=torch.long, device="cuda")
            seconds = []
            for _ in range(2):
                torch.cuda.synchronize()
                start = time.perf_counter()
                encoder(audio, slots)
                torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            total += seconds[0]
            print(f"  {size:3d} windows: first {seconds[0] * 1e3:7.1f} ms, second {seconds[1] * 1e3:6.1f} ms", flush=True)
    print(f"  first calls: {total:.2f} s in all")


if __name__ == "__main__":
    main()
