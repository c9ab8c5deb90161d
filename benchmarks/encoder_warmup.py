"""What the encoder's warm-up costs at each admission chunk size, per SDPA backend (CUDA).

The engine runs the encoder once at every chunk size before capturing it (cuFFT plans, cuDNN
convolution and attention plans, Triton kernels). This times each size's first call and a second
call, in a fresh process per backend: run it once per --backend.

    python benchmarks/encoder_warmup.py --backend cudnn   # or flash, efficient, default

With --libraries, instead: the first call of each library the warm-up touches (CUDA context,
cuBLAS, cuFFT, cuDNN convolution, SDPA, a Triton kernel from the disk cache), one after another in a
fresh process, and the same calls again (what one-time loading costs).
"""

from __future__ import annotations

import argparse
import contextlib
import time


def libraries() -> None:
    import torch
    import torch.nn.functional as F

    def timed(name: str, fn) -> None:
        torch.cuda.synchronize() if torch.cuda.is_initialized() else None
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        print(f"  {name:<34} {(time.perf_counter() - start) * 1e3:8.1f} ms", flush=True)

    x = {}
    steps = [
        ("CUDA context + a tensor", lambda: x.update(a=torch.randn(64, 1500, 384, device="cuda", dtype=torch.float16))),
        ("GEMM fp16 (cuBLAS/cuBLASLt)", lambda: x["a"].view(-1, 384) @ x["a"].view(-1, 384)[:384].t()),
        ("stft (cuFFT)", lambda: torch.stft(torch.randn(4, 480000, device="cuda"), 400, 160,
                                            window=torch.hann_window(400, device="cuda"), return_complex=True)),
        ("conv1d fp16 (cuDNN)", lambda: F.conv1d(torch.randn(4, 80, 3000, device="cuda", dtype=torch.float16),
                                                 torch.randn(384, 80, 3, device="cuda", dtype=torch.float16), padding=1)),
        ("SDPA 6 heads x 1500 fp16", lambda: F.scaled_dot_product_attention(*(x["a"][:8].view(8, 1500, 6, 64)
                                                                            .transpose(1, 2),) * 3)),
        ("layer norm (Triton add_norm)", lambda: _triton_norm(x["a"][:8].reshape(-1, 384).contiguous())),
    ]  # fmt: skip
    for round_ in ("first", "again"):
        print(f"{round_}:")
        for name, fn in steps:
            timed(name, fn)


def _triton_norm(y):
    import torch

    from batchscribe.model.encoder_triton import add_norm

    return add_norm(y, None, None, torch.nn.LayerNorm(384, device="cuda", dtype=y.dtype), fp8=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--backend", default="default", choices=["default", "cudnn", "flash", "efficient"])
    ap.add_argument("--libraries", action="store_true")
    args = ap.parse_args()
    if args.libraries:
        return libraries()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from batchscribe.api import Transcriber
    from batchscribe.constants import N_SAMPLES
    from batchscribe.engine.encoder import ENCODER_CHUNKS, WindowEncoder
    from batchscribe.model.cache import DecoderCache

    t = Transcriber(args.model, device="cuda")
    model, dims = t.model, t.model.dims
    cache = DecoderCache.allocate(dims, 64, torch.device("cuda"), torch.float16, torch.float16, True)
    encoder = WindowEncoder(model, cache, 64, t.config.encoder, t.config.attention.encoder_kernel)
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    # default: torch's own choice among the backends, as the engine runs it
    chosen = sdpa_kernel([backends[args.backend]]) if args.backend in backends else contextlib.nullcontext()
    print(f"{args.model} encoder ({t.config.encoder}, attention {t.config.attention.encoder_kernel}), "
          f"SDPA {args.backend}:", flush=True)
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
