"""What each GPU library costs a fresh process the first time it is used (issue 17's start-up):
the steps Prewarm (engine/prewarm.py) runs in a thread beside the model load, here one after the
other in this process, each synchronised, so each line is that library's own loading.

    python benchmarks/startup_libs.py            (run it in several fresh processes: the first
                                                  after boot also reads the libraries from disk)
    FLASHINFER_CUDA_ARCH_LIST=9.0 python benchmarks/startup_libs.py

Steps: import torch; CUDA's context; cuBLAS (a half GEMM); cuFFT (the log-mel STFT); cuDNN (the
encoder's conv1d); SDPA; Triton (import, then the fused encoder's add_norm kernel: a build, or a
load from Triton's cache); FlashInfer's import (it reads every device's capability at import
unless FLASHINFER_CUDA_ARCH_LIST is set). Steps after a failed one still run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
T0 = time.perf_counter()
import torch  # noqa: E402

IMPORT_TORCH = time.perf_counter() - T0


def main() -> None:
    import torch.nn.functional as F

    print(f"torch {torch.__version__}; FLASHINFER_CUDA_ARCH_LIST={os.environ.get('FLASHINFER_CUDA_ARCH_LIST')}")
    print(f"{'import torch':<34} {IMPORT_TORCH:6.3f} s")
    if not torch.cuda.is_available():
        print("no CUDA here: nothing more to time")
        return
    dev, half = torch.device("cuda"), torch.float16
    d, mels, heads = 384, 80, 6  # tiny.en's encoder

    def sdpa() -> None:
        q = torch.zeros(1, heads, 16, d // heads, device=dev, dtype=half)  # [B, H, T, hd]
        F.scaled_dot_product_attention(q, q, q)

    def triton_kernel() -> None:
        from batchscribe.model import encoder_triton

        x = torch.zeros(8, d, device=dev, dtype=half)
        encoder_triton.add_norm(x, None, None, torch.nn.LayerNorm(d, device=dev, dtype=half), fp8=False)

    steps = [
        ("CUDA context", lambda: torch.empty(1, device=dev)),
        ("cuBLAS (half GEMM)", lambda: torch.zeros(8, d, device=dev, dtype=half)
                                       @ torch.zeros(d, 8, device=dev, dtype=half)),
        ("cuFFT (stft)", lambda: torch.stft(torch.zeros(1, 1600, device=dev), 400, 160,
                                            window=torch.hann_window(400, device=dev), return_complex=True)),
        ("cuDNN (conv1d)", lambda: F.conv1d(torch.zeros(1, mels, 16, device=dev, dtype=half),
                                            torch.zeros(d, mels, 3, device=dev, dtype=half), padding=1)),
        ("SDPA", sdpa),
        ("import triton", lambda: __import__("triton")),
        ("Triton add_norm kernel", triton_kernel),
        ("import flashinfer", lambda: __import__("flashinfer")),
    ]  # fmt: skip
    total = 0.0
    for name, step in steps:
        t = time.perf_counter()
        try:
            step()
            torch.cuda.synchronize()
            note = ""
        except Exception as exc:  # noqa: BLE001  (a missing library is reported, the rest still timed)
            note = f"  failed: {type(exc).__name__}: {str(exc)[:120]}"
        seconds = time.perf_counter() - t
        total += seconds
        print(f"{name:<34} {seconds:6.3f} s{note}", flush=True)
    print(f"{'all after import torch':<34} {total:6.3f} s")


if __name__ == "__main__":
    main()
